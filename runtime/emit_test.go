package runtime_test

import (
	"context"
	"fmt"
	"iter"
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

// chanProvider streams the chunks the test sends on its channel, one
// call after the other, until the channel is closed or the call's context
// ends: the test decides when each chunk comes.
type chanProvider struct{ chunks chan llm.Chunk }

func (p chanProvider) Stream(ctx context.Context, _ *llm.Request) iter.Seq2[llm.Chunk, error] {
	return func(yield func(llm.Chunk, error) bool) {
		for {
			select {
			case c, ok := <-p.chunks:
				if !ok || !yield(c, nil) {
					return
				}
				if c.Kind == llm.ChunkStop {
					return
				}
			case <-ctx.Done():
				yield(llm.Chunk{}, ctx.Err())
				return
			}
		}
	}
}

// pacedSink is a PacedSink that is never busy: it hands each event it
// gets to got as well as recording it.
type pacedSink struct {
	recorder
	pace time.Duration
	got  chan runtime.Event
}

func (s *pacedSink) Emit(ctx context.Context, ev runtime.Event) error {
	if err := s.recorder.Emit(ctx, ev); err != nil {
		return err
	}
	s.got <- ev
	return nil
}

func (*pacedSink) Busy() bool                 { return false }
func (*pacedSink) OnIdle(func())              {}
func (s *pacedSink) Pace() time.Duration      { return s.pace }
func (s *pacedSink) next(t *testing.T) string { return describeDelta(t, s.got) }

// describeDelta waits for the next event on got and describes it with
// its text: "text:abc", "thinking:...", "tooldelta:0:name:args", or as
// describe does for any other event.
func describeDelta(t *testing.T, got chan runtime.Event) string {
	t.Helper()
	select {
	case ev := <-got:
		switch p := ev.Payload.(type) {
		case *runtime.TextDelta:
			return "text:" + p.Text
		case *runtime.ThinkingDelta:
			return "thinking:" + p.Text
		case *runtime.ToolCallDelta:
			return fmt.Sprintf("tooldelta:%d:%s:%s", p.Index, p.Name, p.ArgumentsDelta)
		}
		return describe(ev)
	case <-time.After(10 * time.Second):
		t.Fatal("no event came")
		return ""
	}
}

// TestPacedSinkHoldsWhatContinues: with a pace, the first delta of a
// text, a reasoning block and a tool call is handed on at once (each is
// waited for before the model streams more), and what continues it is
// held and merged while the pace lasts (an hour: until another kind of
// event comes); without a pace every chunk is an event.
func TestPacedSinkHoldsWhatContinues(t *testing.T) {
	text := func(s string) llm.Chunk { return llm.Chunk{Kind: llm.ChunkText, Text: s} }
	think := func(s string) llm.Chunk { return llm.Chunk{Kind: llm.ChunkThinking, Text: s} }
	args := func(s string) llm.Chunk { return llm.Chunk{Kind: llm.ChunkToolCallArgs, Index: 0, Text: s} }
	// Each step streams its chunks, then waits for the events listed.
	type step struct {
		chunks []llm.Chunk
		want   []string
	}
	tests := []struct {
		name  string
		pace  time.Duration
		steps []step
	}{
		{"text, paced", time.Hour, []step{
			{[]llm.Chunk{text("a")}, []string{"text:a"}},
			{[]llm.Chunk{text("b"), text("c"), text("d"), {Kind: llm.ChunkStop, Stop: llm.StopEndTurn}}, []string{"text:bcd", "finished", "commit assistant", "completed end_turn"}},
		}},
		{"reasoning, then text, paced", time.Hour, []step{
			{[]llm.Chunk{think("h")}, []string{"thinking:h"}},
			{[]llm.Chunk{think("m"), think("m"), text("S")}, []string{"thinking:mm", "text:S"}},
			{[]llm.Chunk{text("o"), text("!"), {Kind: llm.ChunkStop, Stop: llm.StopEndTurn}}, []string{"text:o!", "finished", "commit assistant", "completed end_turn"}},
		}},
		{"a tool call, paced", time.Hour, []step{
			{[]llm.Chunk{text("x")}, []string{"text:x"}},
			{[]llm.Chunk{text("y"), {Kind: llm.ChunkToolCallStart, Index: 0, CallID: "c1", Name: "f"}}, []string{"text:y", "tooldelta:0:f:"}},
			{[]llm.Chunk{args(`{"a"`), args(`:1}`), {Kind: llm.ChunkToolCallEnd, Index: 0}, {Kind: llm.ChunkStop, Stop: llm.StopToolUse}},
				[]string{`tooldelta:0::{"a":1}`, "finished", "commit assistant"}},
		}},
		{"no pace", 0, []step{
			{[]llm.Chunk{text("a")}, []string{"text:a"}},
			{[]llm.Chunk{text("b")}, []string{"text:b"}},
			{[]llm.Chunk{text("c"), {Kind: llm.ChunkStop, Stop: llm.StopEndTurn}}, []string{"text:c", "finished", "commit assistant", "completed end_turn"}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := chanProvider{chunks: make(chan llm.Chunk)}
			r := newRunner(t, []*runtime.Model{model("m", p)}, nil)
			sink := &pacedSink{pace: tt.pace, got: make(chan runtime.Event, 64)}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = r.Run(ctx, userTurn("hi"), sink)
			}()
			for _, want := range []string{"start", "call m#1"} {
				if got := sink.next(t); got != want {
					t.Fatalf("event %q, want %q", got, want)
				}
			}
			for i, st := range tt.steps {
				for _, c := range st.chunks {
					p.chunks <- c
				}
				for _, want := range st.want {
					if got := sink.next(t); got != want {
						t.Fatalf("step %d: event %q, want %q", i, got, want)
					}
				}
			}
			cancel()
			<-done
			checkSequence(t, sink.events)
		})
	}
}

// TestPacedSinkHandsOnWhenPaceEnds: a delta held for the pace is handed
// on once the pace has passed, with no other event after it.
func TestPacedSinkHandsOnWhenPaceEnds(t *testing.T) {
	p := chanProvider{chunks: make(chan llm.Chunk)}
	r := newRunner(t, []*runtime.Model{model("m", p)}, nil)
	sink := &pacedSink{pace: time.Millisecond, got: make(chan runtime.Event, 64)}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = r.Run(ctx, userTurn("hi"), sink)
	}()
	p.chunks <- llm.Chunk{Kind: llm.ChunkText, Text: "a"}
	p.chunks <- llm.Chunk{Kind: llm.ChunkText, Text: "b"}
	// Whether "b" was held for the rest of the pace or came after it, it
	// comes, and the model streams nothing more.
	var got []string
	for len(got) < 4 {
		got = append(got, sink.next(t))
	}
	if want := "start call m#1 text:a text:b"; strings.Join(got, " ") != want {
		t.Errorf("events %q, want %q", strings.Join(got, " "), want)
	}
	cancel()
	<-done
	checkSequence(t, sink.events)
}

// TestIdleSinkWaitsForIdle: a delta held for a busy IdleSink is not
// handed on when MergeDelay has passed, as it is for a BusySink: the
// deltas that come while the sink stays busy merge into it.
func TestIdleSinkWaitsForIdle(t *testing.T) {
	p := chanProvider{chunks: make(chan llm.Chunk)}
	r := newRunner(t, []*runtime.Model{model("m", p)}, nil)
	sink := &idleSink{busySink: busySink{busy: true}, saidBusy: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = r.Run(t.Context(), userTurn("hi"), sink)
	}()
	p.chunks <- llm.Chunk{Kind: llm.ChunkText, Text: "a"}
	<-sink.saidBusy
	// Past MergeDelay, which would have handed "a" on alone.
	<-time.After(3 * runtime.MergeDelay)
	for _, c := range []llm.Chunk{{Kind: llm.ChunkText, Text: "b"}, {Kind: llm.ChunkText, Text: "c"}, {Kind: llm.ChunkStop, Stop: llm.StopEndTurn}} {
		p.chunks <- c
	}
	<-done
	checkSequence(t, sink.events)
	var deltas []string
	for _, ev := range sink.events {
		if d, ok := ev.Payload.(*runtime.TextDelta); ok {
			deltas = append(deltas, d.Text)
		}
	}
	if len(deltas) != 1 || deltas[0] != "abc" {
		t.Errorf("text deltas %q, want one, \"abc\"", deltas)
	}
}
