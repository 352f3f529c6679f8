package store

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// A write the embedded file store failed (a full disk).
//
// nats-server answers no publish whose write failed for an I/O error: it
// keeps the error in the stream, refuses every later write the same way,
// silently, and says so only in its health report, until its JetStream is
// opened again. A publish of the embedded store, which carries no message
// id, waits for its answer as long as its context lets it (publishTimeout),
// so a turn would wait 30 s and fail. The keeper reads the health report on
// each pass instead (writeFailure); when it names a write error it stops the
// store's publishes and the reads of its watches (writes.halt): those
// under way end at once with errWriteFailed, and new ones wait until the
// keeper has restarted the JetStream ([keeper.restartJetStream]) and let
// them go (writes.resume), so that none is lost in the restart. A publish
// stopped so is made again; one whose message was stored after all (its
// acknowledgement was on its way when the write after it failed) is found
// in the log first (see [publisher.publishRetried]'s stored), so it is stored
// once. A read is made again.

// errWriteFailed ends a publish under way when the embedded server is
// found to have failed a write: it is made again once the server takes
// writes.
var errWriteFailed = errors.New("store: the embedded server failed a write; made again once it takes writes")

// writes stops and lets go the store's publishes, and its watches' reads,
// around a restart of the embedded JetStream.
type writes struct {
	mu sync.Mutex
	// halted is closed when the publishes may go on; nil while they may.
	halted chan struct{}
	// stop ends the publishes under way (their attempt contexts are made
	// from it); replaced at each halt.
	stop   context.Context
	cancel context.CancelCauseFunc
}

// attempt returns the context of a publish attempt (or a read) made under
// ctx, which a halt ends with errWriteFailed, and the function to call when
// it is done; or, when the publishes are halted, the channel closed when
// they may go on.
func (w *writes) attempt(ctx context.Context) (actx context.Context, done func(), halted <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.halted != nil {
		return nil, nil, w.halted
	}
	if w.stop == nil {
		w.stop, w.cancel = context.WithCancelCause(context.Background())
	}
	actx, cancel := context.WithCancelCause(ctx)
	unregister := context.AfterFunc(w.stop, func() { cancel(errWriteFailed) })
	return actx, func() { unregister(); cancel(nil) }, nil
}

// halt ends the publishes under way and holds new ones until resume.
func (w *writes) halt() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.halted == nil {
		w.halted = make(chan struct{})
	}
	if w.cancel != nil {
		w.cancel(errWriteFailed)
		w.stop, w.cancel = nil, nil
	}
}

// resume lets the publishes go on.
func (w *writes) resume() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.halted != nil {
		close(w.halted)
		w.halted = nil
	}
}

// waitRestart waits, when the publishes are held (a read failed while the
// keeper restarts the embedded JetStream), until they may go on, and
// reports whether it waited and ctx is not done: the read may be made
// again.
func (w *writes) waitRestart(ctx context.Context) bool {
	w.mu.Lock()
	halted := w.halted
	w.mu.Unlock()
	if halted == nil {
		return false
	}
	select {
	case <-halted:
		return true
	case <-ctx.Done():
		return false
	}
}

// hold returns the context of one request to the embedded file store
// made under ctx, which a halt ends with errWriteFailed (see
// [writes.attempt]), and the function to call when it is done; or the
// channel closed when requests may go on. Other stores' requests are not
// held: ctx itself.
func (kp *keeper) hold(ctx context.Context) (context.Context, func(), <-chan struct{}) {
	if kp.srv == nil || kp.cfg.Dir == "" {
		return ctx, func() {}, nil
	}
	return kp.writes.attempt(ctx)
}

// attempt makes one publish attempt of an append or a record with
// publish, under ctx: with the embedded file store, holding the gate
// (read) and under hold, so that a halt ends it with errWriteFailed; or,
// while the keeper restarts the embedded JetStream, it returns the channel
// closed once it may be made.
func (kp *keeper) attempt(ctx context.Context, publish func(context.Context) (*jetstream.PubAck, error)) (*jetstream.PubAck, error, <-chan struct{}) {
	kp.gate.RLock()
	defer kp.gate.RUnlock()
	actx, done, halted := kp.hold(ctx)
	if halted != nil {
		return nil, nil, halted
	}
	ack, err := publish(actx)
	if stopped(ctx, actx, err) {
		err = errWriteFailed
	}
	done()
	return ack, err, nil
}

// stopped reports whether a request made with actx, the context hold gave
// for ctx, failed because a halt ended it.
func stopped(ctx, actx context.Context, err error) bool {
	return err != nil && ctx.Err() == nil && errors.Is(context.Cause(actx), errWriteFailed)
}

// held makes a read of the embedded file store with read, under hold, again
// while a halt ends it or holds it, within ctx.
func held[T any](kp *keeper, ctx context.Context, read func(context.Context) (T, error)) (T, error) {
	for {
		actx, done, halted := kp.hold(ctx)
		if halted != nil {
			select {
			case <-halted:
				continue
			case <-ctx.Done():
				var zero T
				return zero, ctx.Err()
			}
		}
		v, err := read(actx)
		again := stopped(ctx, actx, err)
		done()
		if !again {
			return v, err
		}
	}
}

// writeFailure returns the write error the embedded file store's health
// report names for any of its streams (the log's, the buckets'), empty when
// none: a stream that failed a write takes none until it is opened again.
func (kp *keeper) writeFailure() string {
	if kp.srv == nil || kp.cfg.Dir == "" {
		return ""
	}
	h := kp.srv.Healthz(&natsserver.HealthzOptions{Details: true})
	for _, e := range h.Errors {
		if strings.Contains(e.Error, "write error") {
			return e.Error
		}
	}
	return ""
}

// storedFunc looks for a message in the log: its acknowledgement and
// whether it is there, or why it could not look.
type storedFunc func(context.Context) (*jetstream.PubAck, bool, error)

// findStored waits until the keeper has restarted the embedded server
// after a failed write, then asks stored whether the message of a publish
// it stopped is in the log, again until it can tell, within ctx: ok says
// it is, with its acknowledgement. Without stored it is not.
func (kp *keeper) findStored(ctx context.Context, stored storedFunc) (ack *jetstream.PubAck, ok bool, err error) {
	for {
		kp.writes.waitRestart(ctx)
		if stored == nil || ctx.Err() != nil {
			return nil, false, ctx.Err()
		}
		tctx, cancel := context.WithTimeout(ctx, publishTry)
		ack, ok, err = stored(tctx)
		cancel()
		if err == nil {
			return ack, ok, nil
		}
		select {
		case <-ctx.Done():
			return nil, false, ctx.Err()
		case <-kp.closed:
			return nil, false, ErrClosed
		case <-time.After(publishBackoff):
		}
	}
}

// storedFrame returns the function that finds f, published to w's run as
// its next frame, in the log: its first event's index and its events, as
// f encodes them.
func (w *writer) storedFrame(f *outFrame) storedFunc {
	first := w.next
	return func(ctx context.Context) (*jetstream.PubAck, bool, error) {
		m, err := w.s.stream.GetLastMsgForSubject(ctx, w.evSubject)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return nil, false, nil
		case err != nil:
			return nil, false, err
		case m.Header.Get(firstHeader) != strconv.FormatUint(first, 10) || !f.holds(m.Data):
			return nil, false, nil
		}
		return &jetstream.PubAck{Stream: StreamName, Sequence: m.Sequence}, true, nil
	}
}
