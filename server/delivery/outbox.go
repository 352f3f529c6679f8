package delivery

import (
	"context"
	"errors"
	"fmt"
	"time"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/wire"
)

// Config is what every stream of a server shares.
type Config struct {
	// SendTimeout is how long a Send may be under way before its stream
	// stalls (server.send_timeout).
	SendTimeout time.Duration
	// Start runs each Send on a goroutine (see [Workers]).
	Start func(func())
}

// A Charger is told each event of a turn, whether or not the client is
// still there to receive it: the turn's use is charged to its client key
// (admission.Charger). A nil *admission.Charger charges nothing.
type Charger interface {
	Event(runtime.Event)
}

// Outbox is the sink of one turn without a turn store: it maps each event
// for the wire, keeps it within the event size limit, and hands it to the
// stream through a [Stream]. A client that accepts no event for the send
// timeout has its turn cancelled (the model call and tools stop, the
// upstream connection is closed) and the stream ends. While a Send is
// under way the outbox says it is busy ([runtime.BusySink]), and the
// runtime merges the deltas that come meanwhile: a slow client gets fewer,
// larger events, and at most one event waits here.
type Outbox struct {
	s        *Stream[*turnstilev1.RunTurnResponse]
	cancel   context.CancelCauseFunc // the turn's
	timeout  time.Duration
	maxBytes int
	charge   Charger
	attempt  uint32 // the run's, set on every event

	turnID string
	sent   uint64 // seq of the last event handed over
	failed error  // the first failure; every later Emit returns it
	// tooLarge is set when an event could not be made to fit: the turn
	// ends with an error event the outbox sends itself.
	tooLarge bool
}

var _ runtime.IdleSink = (*Outbox)(nil)

// NewOutbox returns the outbox of a turn whose responses send sends;
// cancel cancels the turn, maxBytes bounds each event
// (server.max_event_bytes), charge is told every event and attempt is set
// on each.
func NewOutbox(send func(*turnstilev1.RunTurnResponse) error, cancel context.CancelCauseFunc, cfg Config,
	maxBytes int, charge Charger, attempt uint32) *Outbox {
	return &Outbox{
		s:      New(send, cfg.SendTimeout, cfg.Start, nil),
		cancel: cancel, timeout: cfg.SendTimeout, maxBytes: maxBytes, charge: charge, attempt: attempt,
	}
}

// Busy implements [runtime.BusySink]: a Send is under way.
func (o *Outbox) Busy() bool { return o.s.Busy() }

// OnIdle implements [runtime.IdleSink]: f is called when a Send is done.
func (o *Outbox) OnIdle(f func()) { o.s.OnIdle(f) }

// Sent returns the seq of the last event handed over.
func (o *Outbox) Sent() uint64 { return o.sent }

// Emit implements [runtime.Sink].
func (o *Outbox) Emit(_ context.Context, ev runtime.Event) error {
	// Charged whether or not the client is still there to receive it.
	o.charge.Event(ev)
	if o.failed != nil {
		return o.failed
	}
	o.turnID = ev.TurnID
	resp, err := wire.Response(ev)
	if err != nil {
		o.failed = err
		return err
	}
	resp.Event.Attempt = o.attempt
	if err := wire.Fit(resp, o.maxBytes); err != nil {
		o.tooLarge = true
		o.failed = err
		o.cancel(err)
		return err
	}
	if err := o.hand(resp); err != nil {
		return err
	}
	o.sent = ev.Seq
	return nil
}

// hand starts the Send of resp once the previous event was sent.
func (o *Outbox) hand(resp *turnstilev1.RunTurnResponse) error {
	return o.failure(o.s.Put(resp))
}

// failure records err, a failure of the stream, as the outbox's; a stall
// cancels the turn of a client that stopped reading.
func (o *Outbox) failure(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrStalled):
		o.failed = &llm.Error{
			Kind:    llm.KindDeadlineExceeded,
			Message: fmt.Sprintf("the client accepted no event for %s (server.send_timeout); the turn was cancelled", o.timeout),
		}
		o.cancel(o.failed)
	default:
		o.failed = err
	}
	return o.failed
}

// Finish ends a turn whose outcome is te (nil when it completed): when an
// event was too large to send, it sends te as the turn's last event in its
// place. It waits for the last event to be sent, at most the send timeout,
// and returns the stall's error if it was not (the turn's outcome was not
// delivered). It returns once no Send is under way, unless one is stuck,
// which ends with the handler.
func (o *Outbox) Finish(te *runtime.TurnError) error {
	stalled := o.s.stalled.Load()
	if o.tooLarge && te != nil && !stalled {
		resp, err := wire.Response(runtime.Event{Seq: o.sent + 1, Time: time.Now(), TurnID: o.turnID, Payload: te})
		if err == nil {
			o.failed = nil
			if o.hand(resp) == nil {
				o.sent++
			}
		}
	}
	var err error
	if !stalled {
		if werr := o.failure(o.s.Flush()); o.s.stalled.Load() {
			err = werr
		}
	}
	o.s.Close()
	return err
}
