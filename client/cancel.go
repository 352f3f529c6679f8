package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// ErrClosed is the cause of the context of a turn that [Turn.Close]
// cancelled: errors.Is(err, ErrClosed) tells it from the caller's own
// cancellation.
var ErrClosed = errors.New("client: the turn was closed")

// Close cancels the turn on the server if it has not ended, as cancelling
// the turn's context does (see [Client.RunTurn]); after the turn's end it
// does nothing. It is safe to call from any goroutine and more than once;
// a deferred Close is the way to cancel a turn whose iteration the caller
// stops early (break), which otherwise only leaves it. While the turn
// runs, Close returns at once and the iteration goes on with the events
// the server sends as it stops the turn; after the iteration stopped,
// Close calls CancelTurn itself and waits for its answer, for at most the
// cancel timeout. It returns the error of that call, except NOT_FOUND and
// FAILED_PRECONDITION (a server that keeps no turn log, where leaving
// already cancelled the turn).
func (t *Turn) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	stop, left := t.stop, t.left
	t.left = 0
	t.mu.Unlock()
	switch {
	case stop != nil:
		stop(ErrClosed)
	case left > 0 && t.c.opts.cancelWait > 0:
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.ctx), t.c.opts.cancelWait)
		defer cancel()
		if _, err := t.cancelOnServer(ctx, left, nil); err != nil {
			return fmt.Errorf("client: cancel turn %s: %w", t.ID(), err)
		}
	}
	return nil
}

// cancelOnServer calls CancelTurn for attempt n until it is answered, ctx
// ends, or (when open is given) it closes; a run not found yet is asked
// again (the server may not have stored it yet). It reports whether the
// server holds the run (it cancelled it, or found it ended): false with a
// nil error when the server keeps no turn log (FAILED_PRECONDITION), where
// leaving the stream is what cancels a turn, or when it has no such run.
func (t *Turn) cancelOnServer(ctx context.Context, n int, open <-chan struct{}) (bool, error) {
	req := &turnstilev1.CancelTurnRequest{TurnId: t.ID(), Attempt: uint32(n)}
	for {
		_, err := t.c.rpc.CancelTurn(ctx, req)
		switch status.Code(err) {
		case codes.OK:
			return true, nil
		case codes.FailedPrecondition, codes.Unimplemented:
			return false, nil
		case codes.NotFound, codes.Unavailable:
			if open == nil {
				if status.Code(err) == codes.NotFound {
					return false, nil
				}
				return false, err
			}
		default:
			return false, err
		}
		select {
		case <-open:
			return false, nil
		case <-ctx.Done():
			return false, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}
