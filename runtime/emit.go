package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnstile-dev/turnstile/internal/tick"
)

// errSinkFailed is the cause of a turn's context when its sink failed.
var errSinkFailed = errors.New("runtime: the event stream failed")

// BusySink is a [Sink] that can say it is still handing on an earlier
// event. While it is, the runner merges consecutive deltas of the same
// text, reasoning or tool call arguments into one event (up to
// MaxMergedDelta bytes) and hands it on once the sink is free, another
// kind of event comes, or MergeDelay has passed (an [IdleSink] is waited
// for instead): a consumer that falls behind gets fewer, larger events,
// and nothing queues. A Sink that is not a BusySink gets one event per
// chunk the model streamed.
type BusySink interface {
	Sink
	// Busy reports whether the sink is still handing on an earlier
	// event. It is called with no other call of the sink in progress.
	Busy() bool
}

// An IdleSink is a [BusySink] that says when it stops being busy: the
// runner then hands on the delta it held at once, not when the next chunk
// comes. A sink whose business ends with an acknowledgement (a Send, a
// store's write) should be one: a delta held while the model pauses waits
// only as long as the sink was busy, and one held while the sink is busy
// waits for it however long that takes (MergeDelay does not apply): the
// deltas that come meanwhile merge into it rather than queue behind it.
type IdleSink interface {
	BusySink
	// OnIdle sets the function the sink calls each time it stops being
	// busy. The runner sets it once, before the first Emit; f does not
	// block and may be called from any goroutine, at any time, also after
	// the turn ended.
	OnIdle(f func())
}

// A PacedSink is an [IdleSink] that takes a reply's deltas at a pace: a
// delta that continues the last event handed on (more of the same text,
// reasoning block or tool call's arguments) is held, and the following
// ones merged into it, until the first tick of the process's pace clock
// at least half a Pace after that event was handed on (ticks a Pace apart,
// which every turn of the process shares: package internal/tick) and the
// sink is idle, or until the merged text would pass MaxMergedDelta. What begins something is not held for the pace: the
// first delta of a reply, of a reasoning block or of a tool call, and
// every other kind of event (the end of a call, a tool's start, an
// approval asked, the turn's end), before which the held delta is handed
// on. A sink whose cost is per event handed on, whatever its size (a write
// to a store), gets one event per Pace of a streamed reply instead of one
// per chunk.
type PacedSink interface {
	IdleSink
	// Pace returns the time between two deltas of one text, reasoning
	// block or tool call's arguments handed on (half of it at least); 0 is
	// no floor. The runner reads it once, before the first Emit.
	Pace() time.Duration
}

// Bounds on merging deltas for a busy sink.
const (
	// MaxMergedDelta bounds the text of one merged delta, in bytes.
	MaxMergedDelta = 16 << 10
	// MergeDelay bounds how long a merged delta waits for a BusySink that
	// is not an IdleSink.
	MergeDelay = 20 * time.Millisecond
)

// emitter numbers a turn's events and hands them to its sink, one at a
// time (tools emit from parallel goroutines). The first sink failure
// cancels the turn's context, once: from then on every emit is dropped,
// and the loop stops at its next check of the context. For a [BusySink]
// it holds a delta, numbered, while the sink is busy, and for a
// [PacedSink] until its pace has passed, and merges the following deltas
// into it.
type emitter struct {
	sink   Sink
	turnID string
	now    func() time.Time
	cancel context.CancelCauseFunc
	// waits says that the sink is an IdleSink: a held delta waits for it
	// to say it is idle, not MergeDelay. pace is a PacedSink's pace, 0
	// without one. Both are set by listen.
	waits bool
	pace  time.Duration

	mu      sync.Mutex
	seq     uint64
	failed  error  // the sink's error, once it failed
	pending *Event // a delta numbered but not yet handed on
	pendCtx context.Context
	// pendText accumulates the text of the pending delta as deltas merge
	// into it; it goes into the delta, as a string of its own length, when
	// it is handed on. The buffer is reused by the next merged deltas until
	// an event that is no delta comes: one grown afresh for each delta, by
	// append's steps of a quarter, allocated some five times the delta's
	// text (a turn of 120 KB of reply merged for a busy store allocated
	// 440 KB).
	pendText []byte
	// pendDue is when the pace lets the pending delta be handed on; zero
	// when the pace does not hold it.
	pendDue time.Time
	// last is what the last event handed on was a delta of (none when it
	// was no delta), and lastAt when it was handed on: a delta that
	// continues it waits for the pace. Kept only with a pace.
	last   stream
	lastAt time.Time
	// timer hands on the pending delta MergeDelay after it was held (a
	// BusySink), when the pace has passed (a PacedSink), or at once when
	// an IdleSink says it is idle; it is set, under mu, before holding is
	// first set.
	timer *time.Timer
	// holding is set while a delta is pending: an IdleSink's idle call
	// reads it without mu, which the goroutine that holds mu may hold
	// while it waits for that very sink.
	holding atomic.Bool
}

// listen asks an [IdleSink] to say when it is idle, and reads a
// [PacedSink]'s pace; call it once, before the first emit.
func (e *emitter) listen() {
	if s, ok := e.sink.(IdleSink); ok {
		e.waits = true
		s.OnIdle(e.idle)
	}
	if s, ok := e.sink.(PacedSink); ok {
		e.pace = max(s.Pace(), 0)
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
			if e.ready() && !e.flush() {
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
	held, text := mergeable(p)
	if held == nil {
		// The deltas are over for now (the reply or a call ended, a tool
		// runs, the turn ends): the merge buffer goes, so that a turn
		// waiting on its sink or a tool holds none.
		e.pendText = nil
	}
	var due time.Time
	if held != nil && e.pace > 0 && continues(e.last, p) {
		// The first tick of the pace at least half a pace after the last
		// delta: every turn of the process hands its deltas on at the
		// same ticks, and the store takes them together.
		if at := tick.After(e.lastAt, e.pace, e.pace/2); time.Now().Before(at) {
			due = at
		}
	}
	if held != nil && (!due.IsZero() || e.busy()) {
		ev.Payload = held
		e.pending, e.pendCtx, e.pendDue = &ev, ctx, due
		e.pendText = append(e.pendText[:0], text...)
		// An IdleSink is waited for: no timer unless the pace holds the
		// delta. Any other BusySink gets it MergeDelay from now at the
		// latest.
		wait, timed := MergeDelay, true
		if e.waits {
			wait, timed = time.Until(due), !due.IsZero()
		}
		if e.timer == nil {
			e.timer = time.AfterFunc(wait, e.flushLate)
			if !timed {
				e.timer.Stop()
			}
		} else if timed {
			e.timer.Reset(wait)
		}
		e.holding.Store(true)
		if e.ready() {
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

// ready reports whether the pending delta may be handed on now: the pace
// does not hold it and the sink is not busy; e.mu is held.
func (e *emitter) ready() bool {
	return !time.Now().Before(e.pendDue) && !e.busy()
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
	*deltaText(ev.Payload) = string(e.pendText)
	e.pendText = e.pendText[:0]
	return e.send(ctx, ev)
}

// flushLate hands on the pending delta when its timer fires: for a
// BusySink that is not an IdleSink once it waited MergeDelay; for an
// IdleSink once the pace lets it and the sink is idle (else the timer is
// set for the rest of the pace, or the sink's idle call comes).
func (e *emitter) flushLate() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pending == nil || e.failed != nil {
		return
	}
	if e.waits {
		if left := time.Until(e.pendDue); left > 0 {
			e.timer.Reset(left)
			return
		}
		if e.busy() {
			return
		}
	}
	e.flush()
}

// send hands ev to the sink; e.mu is held.
func (e *emitter) send(ctx context.Context, ev Event) bool {
	if err := e.sink.Emit(ctx, ev); err != nil {
		e.failed = fmt.Errorf("%w: %w", errSinkFailed, err)
		e.cancel(e.failed)
		return false
	}
	if e.pace > 0 {
		e.last, e.lastAt = streamOf(ev.Payload), time.Now()
	}
	return true
}

// stream names what a delta is part of: a reply's text, a reasoning
// block, or the arguments of the tool call at index; the zero stream is
// none (an event that is no delta, or a reasoning block's signature,
// which ends it).
type stream struct {
	kind  streamKind
	index int
}

type streamKind uint8

const (
	noStream streamKind = iota
	textStream
	thinkingStream
	toolStream
)

// streamOf returns what p is a delta of, the zero stream when it is no
// delta that more can follow.
func streamOf(p Payload) stream {
	switch d := p.(type) {
	case *TextDelta:
		return stream{kind: textStream}
	case *ThinkingDelta:
		if d.Signature == "" {
			return stream{kind: thinkingStream}
		}
	case *ToolCallDelta:
		return stream{kind: toolStream, index: d.Index}
	}
	return stream{}
}

// continues reports whether the delta next continues last, what the last
// event handed on was a delta of: more of the same text, reasoning block
// or tool call's arguments. The first delta of any of them does not.
func continues(last stream, next Payload) bool {
	if last.kind == noStream {
		return false
	}
	if d, ok := next.(*ToolCallDelta); ok && (d.CallID != "" || d.Name != "") {
		return false // a new call's first delta
	}
	return streamOf(next) == last
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
func merge(held, next Payload, text *[]byte) bool {
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
	if len(*text)+len(more) > MaxMergedDelta {
		return false
	}
	*text = append(*text, more...)
	return true
}
