package runtime_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// busySink records events and says it is busy while busy is set.
type busySink struct {
	recorder
	mu      sync.Mutex
	busy    bool
	arrived chan struct{}
}

func (s *busySink) Busy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.busy
}

func (s *busySink) Emit(ctx context.Context, ev runtime.Event) error {
	if err := s.recorder.Emit(ctx, ev); err != nil {
		return err
	}
	if _, ok := ev.Payload.(*runtime.TextDelta); ok && s.arrived != nil {
		select {
		case s.arrived <- struct{}{}:
		default:
		}
	}
	return nil
}

func textChunks(n, size int) []llm.Chunk {
	var cs []llm.Chunk
	for i := range n {
		cs = append(cs, llm.Chunk{Kind: llm.ChunkText, Text: strings.Repeat(string(rune('a'+i%26)), size)})
	}
	return append(cs, llm.Chunk{Kind: llm.ChunkStop, Stop: llm.StopEndTurn})
}

// TestBusySinkGetsMergedDeltas: while the sink is busy, consecutive text
// deltas become one event (up to MaxMergedDelta), numbered without gaps,
// their text intact.
func TestBusySinkGetsMergedDeltas(t *testing.T) {
	tests := []struct {
		name         string
		chunks, size int
		busy         bool
		deltas       int
	}{
		{"busy: one event", 100, 10, true, 1},
		{"busy: capped at MaxMergedDelta", 100, 1024, true, 7},
		{"not busy: one event per chunk", 100, 10, false, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chunks := textChunks(tt.chunks, tt.size)
			r := newRunner(t, []*runtime.Model{model("m", fake.NewProvider(fake.Reply{Chunks: chunks}))}, nil)
			sink := &busySink{busy: tt.busy}
			res, err := r.Run(t.Context(), userTurn("hi"), sink)
			if err != nil {
				t.Fatal(err)
			}
			checkSequence(t, sink.events)
			var text strings.Builder
			deltas := 0
			for _, ev := range sink.events {
				if d, ok := ev.Payload.(*runtime.TextDelta); ok {
					deltas++
					text.WriteString(d.Text)
					if len(d.Text) > runtime.MaxMergedDelta {
						t.Errorf("a delta of %d bytes", len(d.Text))
					}
				}
			}
			if deltas != tt.deltas {
				t.Errorf("%d text deltas, want %d", deltas, tt.deltas)
			}
			if want := res.Messages[0].Parts[0].Text; text.String() != want {
				t.Errorf("the deltas say %d bytes, the message %d", text.Len(), len(want))
			}
		})
	}
}

// TestHeldDeltaFlushedLate: a delta held for a busy sink is handed on
// after MergeDelay even when nothing follows it.
func TestHeldDeltaFlushedLate(t *testing.T) {
	sink := &busySink{busy: true, arrived: make(chan struct{}, 1)}
	end := heldTurn(t, sink, &sink.recorder)
	select {
	case <-sink.arrived:
	case <-time.After(5 * time.Second):
		t.Error("the held delta never reached the sink")
	}
	end()
}

// heldTurn runs a turn into sink whose model streams one text delta and
// then hangs. The returned end cancels the turn, waits for it and checks
// the events rec recorded: the delta, then the cancel's.
func heldTurn(t *testing.T, sink runtime.Sink, rec *recorder) (end func()) {
	t.Helper()
	p := fake.NewProvider(fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "waiting"}}, Hang: true})
	r := newRunner(t, []*runtime.Model{model("m", p)}, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = r.Run(ctx, userTurn("hi"), sink)
	}()
	return func() {
		t.Helper()
		cancel()
		<-done
		checkSequence(t, rec.events)
		if got, want := describeAll(rec.events), "start | call m#1 | text | commit assistant | commit user | error CANCELLED retryable=false"; got != want {
			t.Errorf("events:\n got %s\nwant %s", got, want)
		}
	}
}

// idleSink is a busySink that is an IdleSink: it records when it last
// said it was busy, and tells when a Busy call returned true.
type idleSink struct {
	busySink
	idle      func()
	busySince time.Time
	saidBusy  chan struct{}
}

func (s *idleSink) OnIdle(f func()) { s.idle = f }

func (s *idleSink) Busy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy {
		s.busySince = time.Now()
		select {
		case s.saidBusy <- struct{}{}:
		default:
		}
	}
	return s.busy
}

// TestIdleSinkGetsHeldDeltaAtOnce: a delta held for a busy IdleSink is
// handed on when the sink says it is idle, not MergeDelay later. The
// delta can reach the sink sooner than MergeDelay after the sink last
// said it was busy only through the idle call (the timer that hands on
// held deltas is set for MergeDelay after that); one turn in a few doing
// so proves it, on a machine however loaded.
func TestIdleSinkGetsHeldDeltaAtOnce(t *testing.T) {
	var fastest time.Duration
	for range 5 {
		sink := &idleSink{busySink: busySink{busy: true, arrived: make(chan struct{}, 1)}, saidBusy: make(chan struct{}, 1)}
		end := heldTurn(t, sink, &sink.recorder)
		select {
		case <-sink.saidBusy:
		case <-time.After(5 * time.Second):
			t.Fatal("the sink was never asked whether it was busy")
		}
		if sink.idle == nil {
			t.Fatal("the runner set no idle function")
		}
		sink.mu.Lock()
		sink.busy = false
		since := sink.busySince
		sink.mu.Unlock()
		sink.idle()
		select {
		case <-sink.arrived:
		case <-time.After(5 * time.Second):
			t.Fatal("the held delta never reached the sink")
		}
		took := time.Since(since)
		if end(); t.Failed() {
			return
		}
		if fastest == 0 || took < fastest {
			fastest = took
		}
		if took < runtime.MergeDelay {
			return
		}
	}
	t.Errorf("the held delta came %s at the soonest after the sink last said it was busy: MergeDelay's timer (%s), not the idle call", fastest, runtime.MergeDelay)
}
