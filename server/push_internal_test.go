package server

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

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

func (c *recorder) send(it item) error {
	ev := it.ev
	if c.in.Add(1) != 1 {
		c.t.Errorf("two Sends of one stream under way at seq %d", ev.GetSeq())
	}
	defer c.in.Add(-1)
	c.calls.Add(1)
	if c.slow && rand.IntN(4) == 0 {
		time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
	}
	c.seqs = append(c.seqs, ev.GetSeq())
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
// fed by publish itself (streamRun), gets every event once, in order, with
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
			s := &service{opts: &Options{SendTimeout: time.Minute}, senders: delivery.NewWorkers(4), grace: time.Hour,
				logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
			defer s.senders.Close()
			r := newRun(runKey{turnID: "t", attempt: 1}, nil, func(error) {})
			publish := func(i int) {
				r.publish(&turnstilev1.AgentEvent{Seq: uint64(i), Payload: &turnstilev1.AgentEvent_TextDelta{TextDelta: &turnstilev1.TextDelta{Text: "x"}}}, 8)
			}
			for i := 1; i <= tc.before; i++ {
				publish(i)
			}
			creator := &recorder{t: t, slow: tc.slow}
			var wg sync.WaitGroup
			var creatorSt, watcherSt *status.Status
			wg.Go(func() { creatorSt = s.streamRun(t.Context(), r.key, r, 0, creator.send) })
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
						watcherSt = s.streamRun(t.Context(), r.key, r, 0, watcher.send)
					})
				}
				publish(i)
				if rand.IntN(8) == 0 {
					time.Sleep(50 * time.Microsecond)
				}
			}
			final := status.New(codes.OK, "")
			r.finish(final)
			wg.Wait()
			inOrder(t, "the creating stream", creator.seqs, n)
			inOrder(t, "the watcher attached mid-run", watcher.seqs, n)
			if creatorSt != final || watcherSt != final {
				t.Errorf("statuses %v and %v, want the run's %v", creatorSt, watcherSt, final)
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
	s := &service{opts: &Options{SendTimeout: time.Minute}, senders: delivery.NewWorkers(4), grace: time.Hour,
		logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	defer s.senders.Close()
	ev := func(i int) *turnstilev1.AgentEvent { return &turnstilev1.AgentEvent{Seq: uint64(i)} }

	r := newRun(runKey{turnID: "t", attempt: 1}, nil, func(error) {})
	var sends atomic.Int32
	failed := status.Error(codes.Unavailable, "the connection is gone")
	done := make(chan *status.Status)
	go func() {
		done <- s.streamRun(context.Background(), r.key, r, 0, func(item) error {
			if sends.Add(1) == 3 {
				return failed
			}
			return nil
		})
	}()
	for i := 1; i <= 10; i++ {
		r.publish(ev(i), 8)
	}
	if st := <-done; st.Code() != codes.Unavailable {
		t.Errorf("status %v, want the Send's", st)
	}
	r.publish(ev(11), 8)
	if n := sends.Load(); n != 3 {
		t.Errorf("%d Sends, want 3: none after the failure", n)
	}

	r = newRun(runKey{turnID: "t", attempt: 2}, nil, func(error) {})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- s.streamRun(ctx, r.key, r, 0, func(item) error { return nil }) }()
	r.publish(ev(1), 8)
	cancel()
	if st := <-done; st.Code() != codes.Canceled {
		t.Errorf("status %v, want CANCELED", st)
	}
	r.publish(ev(2), 8)
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.streams) != 0 || r.last != 2 || r.done {
		t.Errorf("after the stream: %d streams, last %d, done %v", len(r.streams), r.last, r.done)
	}
}

// TestEncodedResponse: a response sent as its event's stored wire form
// decodes as the response encoded by gRPC's codec would, small (its own
// buffer) and large (a pooled one), for both streaming responses.
func TestEncodedResponse(t *testing.T) {
	c := newCodec(1 << 20)
	for _, size := range []int{0, 10, 1 << 10, 100 << 10} {
		ev := &turnstilev1.AgentEvent{Seq: 7, Attempt: 2, Payload: &turnstilev1.AgentEvent_TextDelta{TextDelta: &turnstilev1.TextDelta{Text: strings.Repeat("é", size/2)}}}
		wire, err := marshalEvent(ev)
		if err != nil {
			t.Fatal(err)
		}
		for _, resp := range []interface {
			proto.Message
			GetEvent() *turnstilev1.AgentEvent
		}{&turnstilev1.RunTurnResponse{Event: ev}, &turnstilev1.WatchTurnResponse{Event: ev}} {
			got, err := c.Marshal(&encodedResponse{Message: resp, event: wire})
			if err != nil {
				t.Fatal(err)
			}
			want, err := c.Marshal(resp)
			if err != nil {
				t.Fatal(err)
			}
			if got.Len() != want.Len() || got.Len() != proto.Size(resp) {
				t.Errorf("%T of a %d-byte event: %d bytes, want %d", resp, len(wire), got.Len(), want.Len())
			}
			dec := resp.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(got.Materialize(), dec); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(dec, resp) {
				t.Errorf("%T of a %d-byte event decodes as %v", resp, len(wire), dec)
			}
			got.Free()
			want.Free()
		}
	}
}

// TestPushedStreamOfARunOver: a run that ended before its stream attached
// (with events, or with none: its store failed at once) ends the stream
// with the run's status after its events, at once.
func TestPushedStreamOfARunOver(t *testing.T) {
	s := &service{opts: &Options{SendTimeout: time.Minute}, senders: delivery.NewWorkers(4), grace: time.Hour,
		logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	defer s.senders.Close()
	for _, n := range []int{0, 3} {
		r := newRun(runKey{turnID: "t", attempt: 1}, nil, func(error) {})
		for i := 1; i <= n; i++ {
			r.publish(&turnstilev1.AgentEvent{Seq: uint64(i)}, 8)
		}
		final := status.New(codes.Unavailable, "the turn store is unreachable")
		r.finish(final)
		c := &recorder{t: t}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		st := s.streamRun(ctx, r.key, r, 0, c.send)
		cancel()
		if st != final {
			t.Errorf("%d events: status %v, want the run's %v", n, st, final)
		}
		inOrder(t, "the stream", c.seqs, n)
	}
}
