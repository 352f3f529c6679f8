package durable

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/server/delivery"
)

// recorder is a stream's Send that records the seqs it is given and
// fails the test when two of its Sends overlap.
type recorder struct {
	t     *testing.T
	slow  bool
	in    atomic.Int32
	seqs  []uint64
	calls atomic.Int32
}

func (c *recorder) send(it Item) error {
	if c.in.Add(1) != 1 {
		c.t.Errorf("two Sends of one stream under way at seq %d", it.Seq)
	}
	defer c.in.Add(-1)
	c.calls.Add(1)
	if c.slow && rand.IntN(4) == 0 {
		time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
	}
	c.seqs = append(c.seqs, it.Seq)
	return nil
}

// inOrder fails the test unless seqs is 1..n, each once.
func inOrder(t *testing.T, what string, seqs []uint64, n int) {
	t.Helper()
	if len(seqs) != n {
		t.Fatalf("%s: %d events, want %d: %v", what, len(seqs), n, seqs)
	}
	for i, s := range seqs {
		if s != uint64(i+1) {
			t.Fatalf("%s: event %d has seq %d, want %d: %v", what, i, s, i+1, seqs)
		}
	}
}

// TestPushedStreamOnceInOrder: the stream of the RPC that created a run,
// fed by publish itself (stream), gets every event once, in order, with
// one Send at a time, while events are published from another goroutine,
// before and after it attaches, and while a second watcher attaches
// mid-run and follows it as before; both end with the run's status, and
// the fast path lets go of the run.
func TestPushedStreamOnceInOrder(t *testing.T) {
	const n = 200 // within the window: no log is read
	for _, tc := range []struct {
		name   string
		slow   bool // the Sends take a while: events come during them
		before int  // events published before the stream attaches
	}{
		{"fast sends", false, 0},
		{"slow sends", true, 0},
		{"events before the stream", true, 17},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testRuns(t)
			r := newRun(Key{TurnID: "t", Attempt: 1}, nil, func(error) {})
			publish := func(i int) {
				publishEvent(t, r, &turnstilev1.AgentEvent{Seq: uint64(i), Payload: &turnstilev1.AgentEvent_TextDelta{TextDelta: &turnstilev1.TextDelta{Text: "x"}}})
			}
			for i := 1; i <= tc.before; i++ {
				publish(i)
			}
			creator := &recorder{t: t, slow: tc.slow}
			var wg sync.WaitGroup
			var creatorErr, watcherErr error
			var creatorFinal bool
			wg.Go(func() { creatorFinal, creatorErr = s.stream(t.Context(), r.key, r, 0, creator.send) })
			for {
				r.mu.Lock()
				on := len(r.streams) > 0
				r.mu.Unlock()
				if on {
					break
				}
				time.Sleep(time.Millisecond)
			}
			watcher := &recorder{t: t, slow: tc.slow}
			for i := tc.before + 1; i <= n; i++ {
				if i == n/2 {
					wg.Go(func() {
						_, watcherErr = s.stream(t.Context(), r.key, r, 0, watcher.send)
					})
				}
				publish(i)
				if rand.IntN(8) == 0 {
					time.Sleep(50 * time.Microsecond)
				}
			}
			r.finish(nil) // the turn completed
			wg.Wait()
			inOrder(t, "the creating stream", creator.seqs, n)
			inOrder(t, "the watcher attached mid-run", watcher.seqs, n)
			if creatorErr != nil || watcherErr != nil || !creatorFinal {
				t.Errorf("ends %v and %v (final %v), want the run's: completed", creatorErr, watcherErr, creatorFinal)
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			if len(r.streams) != 0 || r.watchers != 0 {
				t.Errorf("after the streams: %d streams, %d watchers", len(r.streams), r.watchers)
			}
		})
	}
}

// TestPushedStreamFails: a Send that fails ends the pushed stream with
// its error at once, with no Send after it, and the client's going away
// ends it with the context's status; the run goes on.
func TestPushedStreamFails(t *testing.T) {
	s := testRuns(t)
	ev := func(i int) *turnstilev1.AgentEvent { return &turnstilev1.AgentEvent{Seq: uint64(i)} }

	r := newRun(Key{TurnID: "t", Attempt: 1}, nil, func(error) {})
	var sends atomic.Int32
	failed := errors.New("the connection is gone")
	done := make(chan error)
	go func() {
		_, err := s.stream(context.Background(), r.key, r, 0, func(Item) error {
			if sends.Add(1) == 3 {
				return failed
			}
			return nil
		})
		done <- err
	}()
	for i := 1; i <= 10; i++ {
		publishEvent(t, r, ev(i))
	}
	if err := <-done; !errors.Is(err, failed) {
		t.Errorf("ended with %v, want the Send's failure", err)
	}
	publishEvent(t, r, ev(11))
	if n := sends.Load(); n != 3 {
		t.Errorf("%d Sends, want 3: none after the failure", n)
	}

	r = newRun(Key{TurnID: "t", Attempt: 2}, nil, func(error) {})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, err := s.stream(ctx, r.key, r, 0, func(Item) error { return nil })
		done <- err
	}()
	publishEvent(t, r, ev(1))
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("ended with %v, want the context's cancellation", err)
	}
	publishEvent(t, r, ev(2))
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.streams) != 0 || r.last != 2 || r.done {
		t.Errorf("after the stream: %d streams, last %d, done %v", len(r.streams), r.last, r.done)
	}
}

// TestPushedStreamOfARunOver: a run that ended before its stream attached
// (with events, or with none: its store failed at once) ends the stream
// with the run's end after its events, at once.
func TestPushedStreamOfARunOver(t *testing.T) {
	s := testRuns(t)
	for _, n := range []int{0, 3} {
		r := newRun(Key{TurnID: "t", Attempt: 1}, nil, func(error) {})
		for i := 1; i <= n; i++ {
			publishEvent(t, r, &turnstilev1.AgentEvent{Seq: uint64(i)})
		}
		r.finish(ErrStoreUnreachable)
		c := &recorder{t: t}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		final, err := s.stream(ctx, r.key, r, 0, c.send)
		cancel()
		if err != ErrStoreUnreachable || !final {
			t.Errorf("%d events: ended with %v (final %v), want the run's %v", n, err, final, ErrStoreUnreachable)
		}
		inOrder(t, "the stream", c.seqs, n)
	}
}

// testRuns returns Runs enough to stream runs made by the test: a send
// timeout of a minute, a detach grace of an hour.
func testRuns(t *testing.T) *Runs {
	w := delivery.NewWorkers(4)
	t.Cleanup(w.Close)
	return &Runs{streams: delivery.Config{SendTimeout: time.Minute, Start: w.Run}, grace: time.Hour,
		logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// publishEvent publishes ev to r's window as the run's sink does once the
// store acknowledged it: its seq and its wire form as stored.
func publishEvent(t testing.TB, r *run, ev *turnstilev1.AgentEvent) {
	t.Helper()
	b, err := marshalEvent(ev)
	if err != nil {
		t.Fatal(err)
	}
	r.publish(ev.GetSeq(), b)
}
