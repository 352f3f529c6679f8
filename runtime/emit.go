package runtime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// errSinkFailed is the cause of a turn's context when its sink failed.
var errSinkFailed = errors.New("runtime: the event stream failed")

// BusySink is a [Sink] that can say it is still handing on an earlier
// event. While it is, the runner merges consecutive deltas of the same
// text, reasoning or tool call arguments into one event (up to
// MaxMergedDelta bytes) and hands it on once the sink is free, another
// kind of event comes, or MergeDelay has passed: a consumer that falls
// behind gets fewer, larger events, and nothing queues. A Sink that is
// not a BusySink gets one event per chunk the model streamed.
type BusySink interface {
	Sink
	// Busy reports whether the sink is still handing on an earlier
	// event. It is called with no other call of the sink in progress.
	Busy() bool
}

// An IdleSink is a [BusySink] that says when it stops being busy: the
// runner then hands on the delta it held at once, not when the next chunk
// comes or MergeDelay has passed. A sink whose business ends with an
// acknowledgement (a Send, a store's write) should be one: a delta held
// while the model pauses waits only as long as the sink was busy.
type IdleSink interface {
	BusySink
	// OnIdle sets the function the sink calls each time it stops being
	// busy. The runner sets it once, before the first Emit; f does not
	// block and may be called from any goroutine, at any time, also after
	// the turn ended.
	OnIdle(f func())
}

// Bounds on merging deltas for a busy sink.
const (
	// MaxMergedDelta bounds the text of one merged delta, in bytes.
	MaxMergedDelta = 16 << 10
	// MergeDelay bounds how long a merged delta waits for the sink.
	MergeDelay = 20 * time.Millisecond
)

// emitter numbers a turn's events and hands them to its sink, one at a
// time (tools emit from parallel goroutines). The first sink failure
// cancels the turn's context, once: from then on every emit is dropped,
// and the loop stops at its next check of the context. For a [BusySink]
// it holds a delta, numbered, while the sink is busy, and merges the
// following deltas into it.
type emitter struct {
	sink   Sink
	turnID string
	now    func() time.Time
	cancel context.CancelCauseFunc

	mu      sync.Mutex
	seq     uint64
	failed  error  // the sink's error, once it failed
	pending *Event // a delta numbered but not yet handed on
	pendCtx context.Context
	// pendText accumulates the text of the pending delta as deltas merge
	// into it; it goes into the delta when it is handed on.
	pendText strings.Builder
	// timer hands on the pending delta MergeDelay after it was held, or
	// at once when an IdleSink says it is idle; it is set, under mu,
	// before holding is first set.
	timer *time.Timer
	// holding is set while a delta is pending: an IdleSink's idle call
	// reads it without mu, which the goroutine that holds mu may hold
	// while it waits for that very sink.
	holding atomic.Bool
}

// listen asks an [IdleSink] to say when it is idle; call it once, before
// the first emit.
func (e *emitter) listen() {
	if s, ok := e.sink.(IdleSink); ok {
		s.OnIdle(e.idle)
	}
}

// idle hands on the pending delta, if any, on the timer's goroutine: the
// sink stopped being busy. It does not block.
func (e *emitter) idle() {
	if e.holding.Load() {
		e.timer.Reset(0)
	}
}

// emit sends p as the next event and returns its seq, or 0 when the event
// was not delivered: the sink failed, now or earlier, or ctx is done. A
// stopped turn emits nothing more of what it was doing; what it emits to
// end (what a cancel commits, the terminal event) it emits with a context
// that is not done. A delta merged into an earlier one returns that one's
// seq.
func (e *emitter) emit(ctx context.Context, p Payload) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failed != nil || ctx.Err() != nil {
		return 0
	}
	if e.pending != nil {
		if merge(e.pending.Payload, p, &e.pendText) {
			seq := e.pending.Seq
			if !e.busy() && !e.flush() {
				return 0
			}
			return seq
		}
		if !e.flush() {
			return 0
		}
	}
	e.seq++
	ev := Event{Seq: e.seq, Time: e.now(), TurnID: e.turnID, Payload: p}
	if held, text := mergeable(p); held != nil && e.busy() {
		ev.Payload = held
		e.pending, e.pendCtx = &ev, ctx
		e.pendText.Reset()
		e.pendText.WriteString(text)
		if e.timer == nil {
			e.timer = time.AfterFunc(MergeDelay, e.flushLate)
		} else {
			e.timer.Reset(MergeDelay)
		}
		e.holding.Store(true)
		if !e.busy() {
			// The sink went idle between the check and holding: its idle
			// call may have missed the held delta.
			e.timer.Reset(0)
		}
		return e.seq
	}
	if !e.send(ctx, ev) {
		return 0
	}
	return e.seq
}

// busy reports whether the sink says it is busy.
func (e *emitter) busy() bool {
	b, ok := e.sink.(BusySink)
	return ok && b.Busy()
}

// flush hands on the pending delta; e.mu is held. It reports false when
// the sink failed.
func (e *emitter) flush() bool {
	// The held delta was numbered when its turn was going: it is handed on
	// even when the turn has stopped since, so seqs have no gap.
	ev, ctx := *e.pending, context.WithoutCancel(e.pendCtx)
	e.pending, e.pendCtx = nil, nil
	e.holding.Store(false)
	e.timer.Stop()
	*deltaText(ev.Payload) = e.pendText.String()
	e.pendText.Reset()
	return e.send(ctx, ev)
}

// flushLate hands on a delta that waited MergeDelay.
func (e *emitter) flushLate() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pending != nil && e.failed == nil {
		e.flush()
	}
}

// send hands ev to the sink; e.mu is held.
func (e *emitter) send(ctx context.Context, ev Event) bool {
	if err := e.sink.Emit(ctx, ev); err != nil {
		e.failed = fmt.Errorf("%w: %w", errSinkFailed, err)
		e.cancel(e.failed)
		return false
	}
	return true
}

// sinkErr returns the sink's failure, nil while it works.
func (e *emitter) sinkErr() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.failed
}

// mergeable returns a copy of p to hold and merge later deltas into, and
// p's text; nil when p is not a delta that merges.
func mergeable(p Payload) (Payload, string) {
	switch d := p.(type) {
	case *TextDelta:
		c := *d
		return &c, d.Text
	case *ThinkingDelta:
		if d.Signature == "" {
			c := *d
			return &c, d.Text
		}
	case *ToolCallDelta:
		c := *d
		return &c, d.ArgumentsDelta
	}
	return nil, ""
}

// deltaText returns the field of a held delta that merging appends to.
func deltaText(p Payload) *string {
	switch d := p.(type) {
	case *TextDelta:
		return &d.Text
	case *ThinkingDelta:
		return &d.Text
	case *ToolCallDelta:
		return &d.ArgumentsDelta
	}
	return new(string)
}

// merge appends next to text, the text of held, a delta held for a busy
// sink, when next continues it (the same text, reasoning block or tool
// call) and the result stays within MaxMergedDelta; it reports whether it
// did.
func merge(held, next Payload, text *strings.Builder) bool {
	var more string
	switch h := held.(type) {
	case *TextDelta:
		n, ok := next.(*TextDelta)
		if !ok {
			return false
		}
		more = n.Text
	case *ThinkingDelta:
		n, ok := next.(*ThinkingDelta)
		if !ok || n.Signature != "" {
			return false
		}
		more = n.Text
	case *ToolCallDelta:
		n, ok := next.(*ToolCallDelta)
		if !ok || n.Index != h.Index || n.CallID != "" || n.Name != "" {
			return false
		}
		more = n.ArgumentsDelta
	default:
		return false
	}
	if text.Len()+len(more) > MaxMergedDelta {
		return false
	}
	text.WriteString(more)
	return true
}
