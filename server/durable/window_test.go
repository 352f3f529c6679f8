package durable

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	goruntime "runtime"
	"strings"
	"testing"
	"time"
	"unsafe"
	"weak"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/delivery"
	"github.com/turnstile-dev/turnstile/store"
)

// TestRunWindowBounds: a run keeps only its latest events within the
// window's bounds, by count and, for those before its newest, by bytes,
// and always its newest one; the window is contiguous, ends at the last
// seq published, and holds each event's wire form as published.
func TestRunWindowBounds(t *testing.T) {
	wireOf := func(t *testing.T, seq, size int) []byte {
		t.Helper()
		b, err := marshalEvent(&turnstilev1.AgentEvent{Seq: uint64(seq), Payload: &turnstilev1.AgentEvent_TextDelta{TextDelta: &turnstilev1.TextDelta{Text: strings.Repeat("x", size)}}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name      string
		events    int
		size      int // bytes of each event's text
		wantCount int // 0: as many as windowBytes allows before the newest
	}{
		{"few small events", 10, 10, 10},
		{"many small events: bound by count", 1000, 10, windowEvents},
		{"large events: bound by bytes", 100, 10 << 10, 0},
		{"events larger than the window: the newest stays", 5, 2 * windowBytes, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRun(Key{TurnID: "t", Attempt: 1}, nil, func(error) {})
			var wires [][]byte
			for i := range tc.events {
				wires = append(wires, wireOf(t, i+1, tc.size))
				r.publish(uint64(i+1), wires[i])
			}
			want := tc.wantCount
			if want == 0 {
				want = windowBytes/len(wires[0]) + 1
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			if len(r.window) != want || r.last != uint64(tc.events) {
				t.Fatalf("window of %d events up to seq %d, want %d up to %d", len(r.window), r.last, want, tc.events)
			}
			size := 0
			for i, b := range r.window {
				if seq := r.first() + uint64(i); !bytes.Equal(b, wires[seq-1]) {
					t.Fatalf("window[%d] is not the wire form of seq %d", i, seq)
				}
				size += len(b)
			}
			if size != r.windowSize || (len(r.window) > 1 && size-len(r.window[len(r.window)-1]) > windowBytes) {
				t.Errorf("window of %d bytes (counted %d), bound %d", size, r.windowSize, windowBytes)
			}
			if cap(r.window) > 2*windowEvents {
				t.Errorf("the window's array holds %d events", cap(r.window))
			}
		})
	}
}

// TestWindowKeepsWhatALargeEventFollows (issue 37, row 2): an event
// larger than the window does not push out the events before it, which a
// stream one Send behind the run has still to send: that stream is served
// from the window, not sent to read the log. The event after it pushes
// it out, with all before it.
func TestWindowKeepsWhatALargeEventFollows(t *testing.T) {
	r := newRun(Key{TurnID: "t", Attempt: 1}, nil, func(error) {})
	ev := func(seq, size int) {
		publishEvent(t, r, &turnstilev1.AgentEvent{Seq: uint64(seq), Payload: &turnstilev1.AgentEvent_TextDelta{TextDelta: &turnstilev1.TextDelta{Text: strings.Repeat("x", size)}}})
	}
	for seq := 1; seq <= 10; seq++ {
		ev(seq, 1<<10)
	}
	ev(11, 2*windowBytes)
	got, state := r.Next(5, nil)
	if state == delivery.Behind || len(got) != 6 || got[0].Seq != 6 || got[5].Seq != 11 {
		t.Fatalf("Next(5) after a large event = %d events from seq %d, %v; want seqs 6 to 11", len(got), seqOf(got), state)
	}
	ev(12, 1<<10)
	if _, state := r.Next(5, nil); state != delivery.Behind {
		t.Errorf("Next(5) once an event followed the large one = %v, want Behind", state)
	}
	if got, state := r.Next(11, nil); len(got) != 1 || got[0].Seq != 12 || state == delivery.Behind {
		t.Errorf("Next(11) = %d events from seq %d, %v; want the one after the large one", len(got), seqOf(got), state)
	}
}

func seqOf(items []Item) uint64 {
	if len(items) == 0 {
		return 0
	}
	return items[0].Seq
}

// wiredRunner is a Runner whose turn emits a reply's text deltas, each a
// text of its own, waits for the test, and completes: as the runtime's
// sink is fed.
type wiredRunner struct {
	texts   []string
	emitted chan struct{} // closed once every delta was emitted
	finish  chan struct{} // closed by the test: the turn completes
}

func (w *wiredRunner) Run(ctx context.Context, req *runtime.TurnRequest, sink runtime.Sink) (*runtime.TurnCompleted, error) {
	seq := uint64(0)
	emit := func(p runtime.Payload) error {
		seq++
		return sink.Emit(ctx, runtime.Event{Seq: seq, Time: time.Unix(1, 0), TurnID: req.TurnID, Payload: p})
	}
	for i := range w.texts {
		if err := emit(&runtime.TextDelta{Text: w.texts[i]}); err != nil {
			return nil, err
		}
		w.texts[i] = "" // the runtime lets go of what it emitted
	}
	close(w.emitted)
	<-w.finish
	done := &runtime.TurnCompleted{Reason: runtime.EndTurn}
	return done, emit(done)
}

func (*wiredRunner) ContinuesCut(*runtime.TurnRequest) bool { return false }

// TestWindowHoldsWireFormsOnly (issue 37, row 2): once the store
// acknowledged a run's events, the run holds each as its wire form only:
// the text of a delta (what the runtime merged and handed over) is not
// kept decoded beside it, so the collector frees it while the run goes
// on and its window still holds the events. A watcher that attaches then
// gets the window's events, byte for byte the log's, and the run's end.
// On the real embedded store.
func TestWindowHoldsWireFormsOnly(t *testing.T) {
	const deltas = 20 // 20 KiB: all in the window
	cfg := store.DefaultConfig()
	cfg.Dir, cfg.LeaseTTL = "", time.Second
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := store.Open(t.Context(), cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	w := delivery.NewWorkers(4)
	defer w.Close()

	runner := &wiredRunner{emitted: make(chan struct{}), finish: make(chan struct{})}
	var texts []weak.Pointer[byte]
	for i := range deltas {
		// A text of its own allocation, as the runtime's merged deltas are.
		s := strings.Repeat(string(rune('a'+i)), 1<<10)
		runner.texts = append(runner.texts, s)
		texts = append(texts, weak.Make(unsafe.StringData(s)))
	}
	rs := New(Config{Store: st, Runner: runner, Logger: logger, Streams: delivery.Config{SendTimeout: time.Minute, Start: w.Run},
		DetachGrace: time.Hour, MaxRunning: 4, MaxEventBytes: 1 << 20})
	defer func() {
		rs.Drain()
		rs.Wait(context.Background())
		rs.Close()
	}()

	k := Key{TurnID: "t", Attempt: 1}
	got := make(chan Item, deltas+1)
	ran := make(chan error, 1)
	go func() {
		_, err := rs.Run(t.Context(), Request{Key: k, Wire: &turnstilev1.RunTurnRequest{TurnId: k.TurnID, Attempt: k.Attempt}, Turn: &runtime.TurnRequest{}},
			func(it Item) error { got <- it; return nil })
		ran <- err
	}()
	<-runner.emitted
	for seq := uint64(1); seq <= deltas; seq++ {
		if it := <-got; it.Seq != seq {
			t.Fatalf("the creating stream got seq %d, want %d", it.Seq, seq)
		}
	}
	r := rs.owned.get(k)
	if r == nil {
		t.Fatal("the run is not owned here")
	}
	r.mu.Lock()
	held := len(r.window)
	r.mu.Unlock()
	if held != deltas {
		t.Fatalf("the window holds %d events, want %d", held, deltas)
	}
	goruntime.GC()
	for i, p := range texts {
		if p.Value() != nil {
			t.Errorf("the text of delta %d is still held once its event was stored and sent", i+1)
		}
	}

	// A watcher re-attaching now is served from the window: byte for byte
	// what the log holds.
	var watched [][]byte
	watchErr := make(chan error, 1)
	go func() {
		watchErr <- rs.Watch(t.Context(), k, 0, func(it Item) error {
			if it.Seq != uint64(len(watched)+1) {
				t.Errorf("the watcher got seq %d after %d events", it.Seq, len(watched))
			}
			watched = append(watched, it.Wire)
			if len(watched) == deltas {
				close(runner.finish)
			}
			return nil
		})
	}()
	if err := <-watchErr; err != nil {
		t.Fatalf("the watch ended with %v, want the turn's completion", err)
	}
	if err := <-ran; err != nil {
		t.Fatalf("the run ended with %v, want the turn's completion", err)
	}
	var stored [][]byte
	for b, err := range st.Events(t.Context(), k.id(), k.Attempt, 0) {
		if err != nil {
			t.Fatal(err)
		}
		stored = append(stored, b)
		if len(stored) == deltas+1 {
			break
		}
	}
	if len(watched) != len(stored) {
		t.Fatalf("the watcher got %d events, the log holds %d", len(watched), len(stored))
	}
	for i := range stored {
		if !bytes.Equal(watched[i], stored[i]) {
			t.Errorf("event %d: the watcher got %x, the log holds %x", i+1, watched[i], stored[i])
		}
	}
}
