package delivery

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// feed is a Feed of seqs: the messages from first to last, with done
// saying no more will come.
type feed struct {
	mu          sync.Mutex
	first, last uint64
	done        bool
	s           *Stream[uint64]
}

func (f *feed) Next(after uint64, buf []uint64) ([]uint64, State) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if after+1 < f.first {
		return buf, Behind
	}
	for seq := after + 1; seq <= f.last; seq++ {
		buf = append(buf, seq)
	}
	if f.done {
		return buf, Over
	}
	return buf, Open
}

func (f *feed) Seq(m uint64) uint64 { return m }

// publish adds seq to the feed, keeping at most keep, and kicks the
// stream, as a run's publish does (under the feed's lock).
func (f *feed) publish(seq uint64, keep uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.last = seq
	if seq >= keep {
		f.first = max(f.first, seq-keep+1)
	}
	f.s.Kick()
}

func (f *feed) end() {
	f.mu.Lock()
	f.done = true
	f.s.Kick()
	f.mu.Unlock()
}

// recorder records what a stream sends, and fails the test when two
// Sends overlap.
type recorder struct {
	t    *testing.T
	slow bool
	in   atomic.Int32
	mu   sync.Mutex
	seqs []uint64
}

func (r *recorder) send(m uint64) error {
	if r.in.Add(1) != 1 {
		r.t.Errorf("two Sends of one stream under way at %d", m)
	}
	defer r.in.Add(-1)
	if r.slow && rand.IntN(4) == 0 {
		time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
	}
	r.mu.Lock()
	r.seqs = append(r.seqs, m)
	r.mu.Unlock()
	return nil
}

func (r *recorder) inOrder(n int) {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.seqs) != n {
		r.t.Fatalf("%d messages sent, want %d: %v", len(r.seqs), n, r.seqs)
	}
	for i, s := range r.seqs {
		if s != uint64(i+1) {
			r.t.Fatalf("message %d has seq %d, want %d: %v", i, s, i+1, r.seqs)
		}
	}
}

// TestStreamFromAFeed: a stream following a feed sends every message
// once, in order, one Send at a time, while the feed grows from another
// goroutine, and Wait returns nil once it sent the last; one that fell
// behind its feed is told (ErrBehind), sends what it missed with Put, and
// goes on from the feed once resumed.
func TestStreamFromAFeed(t *testing.T) {
	start := func(f func()) { go f() }
	for _, tc := range []struct {
		name string
		slow bool
		keep uint64 // how many messages the feed holds
	}{
		{"fast sends", false, 1 << 20},
		{"slow sends", true, 1 << 20},
		{"a feed of 4: behind, and back", true, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 300
			rec := &recorder{t: t, slow: tc.slow}
			s := New(rec.send, time.Minute, start, nil)
			f := &feed{first: 1, s: s}
			s.Follow(f, 0)
			go func() {
				for i := uint64(1); i <= n; i++ {
					f.publish(i, tc.keep)
				}
				f.end()
			}()
			for {
				err := s.Wait(t.Context())
				if err == nil {
					break
				}
				if !errors.Is(err, ErrBehind) {
					t.Fatalf("Wait: %v", err)
				}
				// What the feed lost, as a log would give it.
				f.mu.Lock()
				first := f.first
				f.mu.Unlock()
				for seq := s.Sent() + 1; seq < first; seq++ {
					if err := s.Put(seq); err != nil {
						t.Fatal(err)
					}
				}
				if err := s.Flush(); err != nil {
					t.Fatal(err)
				}
				s.Resume()
			}
			s.Close()
			rec.inOrder(n)
		})
	}
}

// TestStreamStalls: a Send under way for the send timeout stalls the
// stream: Wait and Put say so, onStall is called once, and Close returns
// without waiting for the stuck Send, which the handler's end releases.
func TestStreamStalls(t *testing.T) {
	release := make(chan struct{})
	var stalls atomic.Int32
	sends := make(chan uint64, 8)
	s := New(func(m uint64) error {
		sends <- m
		if m == 2 {
			<-release
			return errors.New("stream done")
		}
		return nil
	}, 100*time.Millisecond, func(f func()) { go f() }, func() { stalls.Add(1) })
	for m := range uint64(2) {
		if err := s.Put(m + 1); err != nil {
			t.Fatal(err)
		}
	}
	<-sends
	<-sends
	if err := s.Wait(t.Context()); !errors.Is(err, ErrStalled) {
		t.Fatalf("Wait = %v, want ErrStalled", err)
	}
	if err := s.Put(3); !errors.Is(err, ErrStalled) {
		t.Errorf("Put after the stall = %v", err)
	}
	s.Close()
	close(release)
	if n := stalls.Load(); n != 1 {
		t.Errorf("onStall called %d times, want once", n)
	}
}

// TestStreamSendFails: a Send that fails ends the stream with its error
// at once, with no Send after it; Wait, Put and Flush return it.
func TestStreamSendFails(t *testing.T) {
	failed := errors.New("the connection is gone")
	var sends atomic.Int32
	s := New(func(uint64) error {
		if sends.Add(1) == 3 {
			return failed
		}
		return nil
	}, time.Minute, func(f func()) { go f() }, nil)
	f := &feed{first: 1, s: s}
	s.Follow(f, 0)
	for i := uint64(1); i <= 10; i++ {
		f.publish(i, 1<<20)
	}
	if err := s.Wait(t.Context()); !errors.Is(err, failed) {
		t.Fatalf("Wait = %v, want the Send's failure", err)
	}
	f.publish(11, 1<<20)
	if err := s.Flush(); !errors.Is(err, failed) {
		t.Errorf("Flush = %v", err)
	}
	s.Close()
	if n := sends.Load(); n != 3 {
		t.Errorf("%d Sends, want 3: none after the failure", n)
	}
	// The client's going away ends a stream with the context's error.
	s = New(func(uint64) error { return nil }, time.Minute, func(f func()) { go f() }, nil)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := s.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait = %v, want the context's error", err)
	}
	s.Close()
}

// TestWatchdogBeforeNewReturns makes streams whose watchdog fires at once,
// before New has returned: under the race detector (the project's test
// command), the watchdog's first look must not race New's setting it up.
func TestWatchdogBeforeNewReturns(t *testing.T) {
	for range 200 {
		s := New(func(uint64) error { return nil }, time.Nanosecond, func(f func()) { go f() }, nil)
		s.Close()
	}
}
