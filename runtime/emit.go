package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// errSinkFailed is the cause of a turn's context when its sink failed.
var errSinkFailed = errors.New("runtime: the event stream failed")

// emitter numbers a turn's events and hands them to its sink, one at a
// time (tools emit from parallel goroutines). The first sink failure
// cancels the turn's context, once: from then on every emit is dropped,
// and the loop stops at its next check of the context.
type emitter struct {
	sink   Sink
	turnID string
	now    func() time.Time
	cancel context.CancelCauseFunc

	mu     sync.Mutex
	seq    uint64
	failed error // the sink's error, once it failed
}

// emit sends p as the next event and returns its seq, or 0 when the event
// was not delivered (the sink failed, now or earlier).
func (e *emitter) emit(ctx context.Context, p Payload) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failed != nil {
		return 0
	}
	e.seq++
	ev := Event{Seq: e.seq, Time: e.now(), TurnID: e.turnID, Payload: p}
	if err := e.sink.Emit(ctx, ev); err != nil {
		e.failed = fmt.Errorf("%w: %w", errSinkFailed, err)
		e.cancel(e.failed)
		return 0
	}
	return e.seq
}

// sinkErr returns the sink's failure, nil while it works.
func (e *emitter) sinkErr() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.failed
}
