package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// outbox is the sink of one turn: it maps each event for the wire, keeps it
// within the event size limit, and hands it to the stream.
//
// grpc-go's Send blocks while the client's flow-control window is full,
// and nothing but the end of the handler unblocks it. So Send runs on a
// goroutine of the outbox's own, which takes one event at a time: Emit
// hands an event over once the previous one was sent, waiting at most
// sendTimeout from when that one was handed over. A client that accepts no
// event for that long has its turn cancelled (the model call and tools
// stop, the upstream connection is closed) and the handler returns, which
// ends the stream and the blocked Send with it. While a Send is under way
// the outbox says it is busy ([runtime.BusySink]), and the runtime merges
// the deltas that come meanwhile: a slow client gets fewer, larger events,
// and at most one event waits here.
type outbox struct {
	stream   grpc.ServerStreamingServer[turnstilev1.RunTurnResponse]
	cancel   context.CancelCauseFunc // the turn's
	timeout  time.Duration
	maxBytes int
	usage    *usageCharger
	attempt  uint32 // the run's, set on every event

	msgs  chan *turnstilev1.RunTurnResponse
	acks  chan error // buffered: the sender never waits for a reader
	done  chan struct{}
	timer *time.Timer

	turnID   string
	sent     uint64    // seq of the last event handed over
	inflight bool      // an event was handed over and its Send has not been acknowledged
	handedAt time.Time // when it was
	failed   error     // the first failure; every later Emit returns it
	stalled  bool      // a Send did not return within the timeout
	// tooLarge is set when an event could not be made to fit: the turn
	// ends with an error event the outbox sends itself.
	tooLarge bool
}

var _ runtime.BusySink = (*outbox)(nil)

// newOutbox returns the outbox of a turn streamed to stream; start runs its
// sender on a goroutine (see [workers]).
func newOutbox(stream grpc.ServerStreamingServer[turnstilev1.RunTurnResponse], cancel context.CancelCauseFunc,
	timeout time.Duration, maxBytes int, usage *usageCharger, start func(func())) *outbox {
	o := &outbox{
		stream: stream, cancel: cancel, timeout: timeout, maxBytes: maxBytes, usage: usage,
		msgs: make(chan *turnstilev1.RunTurnResponse), acks: make(chan error, 1), done: make(chan struct{}),
		timer: time.NewTimer(timeout),
	}
	o.timer.Stop()
	start(o.sender)
	return o
}

func (o *outbox) sender() {
	defer close(o.done)
	for m := range o.msgs {
		o.acks <- o.stream.Send(m)
	}
}

// Busy implements [runtime.BusySink]: a Send is under way.
func (o *outbox) Busy() bool { return o.inflight && len(o.acks) == 0 }

// Emit implements [runtime.Sink].
func (o *outbox) Emit(_ context.Context, ev runtime.Event) error {
	if o.failed != nil {
		return o.failed
	}
	o.turnID = ev.TurnID
	if u, ok := ev.Payload.(*runtime.UsageUpdated); ok {
		o.usage.total(u.Total)
	}
	resp, err := toResponse(ev)
	if err != nil {
		o.failed = err
		return err
	}
	resp.Event.Attempt = o.attempt
	if err := o.fit(resp); err != nil {
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

// errEventTooLarge is the failure of a turn one of whose events could not
// be made to fit the event size limit.
var errEventTooLarge = errors.New("server: event larger than max_event_bytes")

// fit makes resp fit the event size limit, or fails. A turn_completed that
// is too large drops its messages, which the client has from the
// message_completed events, and says so; any other event that is too
// large ends the turn.
func (o *outbox) fit(resp *turnstilev1.RunTurnResponse) error { return fitEvent(resp, o.maxBytes) }

// fitEvent makes resp fit maxBytes, or fails, as [outbox.fit] says.
func fitEvent(resp *turnstilev1.RunTurnResponse, maxBytes int) error {
	size := proto.Size(resp)
	if size <= maxBytes {
		return nil
	}
	if tc := resp.GetEvent().GetTurnCompleted(); tc != nil {
		tc.Messages, tc.MessagesOmitted = nil, true
		if size = proto.Size(resp); size <= maxBytes {
			return nil
		}
	}
	what := fmt.Sprintf("%T", resp.GetEvent().GetPayload())
	return &llm.Error{
		Kind:    llm.KindInternal,
		Message: fmt.Sprintf("an event of the turn was larger than the server sends (%d bytes, at most %d: server.max_event_bytes); the turn was ended", size, maxBytes),
		Err:     fmt.Errorf("%w: %s of %d bytes", errEventTooLarge, what, size),
	}
}

// hand gives resp to the sender once it has sent the previous event.
func (o *outbox) hand(resp *turnstilev1.RunTurnResponse) error {
	if err := o.wait(); err != nil {
		return err
	}
	o.msgs <- resp // the sender is idle: it takes it at once
	o.inflight, o.handedAt = true, time.Now()
	return nil
}

// wait waits until the event in flight, if any, was sent: at most the
// send timeout from when it was handed over.
func (o *outbox) wait() error {
	if !o.inflight {
		return nil
	}
	select {
	case err := <-o.acks:
		return o.acked(err)
	default:
	}
	o.timer.Reset(o.timeout - time.Since(o.handedAt))
	defer o.timer.Stop()
	select {
	case err := <-o.acks:
		return o.acked(err)
	case <-o.timer.C:
		return o.stall()
	}
}

func (o *outbox) acked(err error) error {
	o.inflight = false
	if err != nil {
		o.failed = err
	}
	return err
}

// stall cancels the turn of a client that stopped reading.
func (o *outbox) stall() error {
	o.stalled = true
	o.failed = &llm.Error{
		Kind:    llm.KindDeadlineExceeded,
		Message: fmt.Sprintf("the client accepted no event for %s (server.send_timeout); the turn was cancelled", o.timeout),
	}
	o.cancel(o.failed)
	return o.failed
}

// finish ends a turn whose outcome is te (nil when it completed): when an
// event was too large to send, it sends te as the turn's last event in its
// place. It waits for the last event to be sent, at most the send timeout,
// and returns the stall's error if it was not (the turn's outcome was not
// delivered). It returns once the sender is gone, unless a Send is stuck,
// which ends with the handler.
func (o *outbox) finish(te *runtime.TurnError) error {
	if o.tooLarge && te != nil && !o.stalled {
		resp, err := toResponse(runtime.Event{Seq: o.sent + 1, Time: time.Now(), TurnID: o.turnID, Payload: te})
		if err == nil {
			o.failed = nil
			_ = o.hand(resp)
		}
	}
	var err error
	if !o.stalled {
		if werr := o.wait(); o.stalled {
			err = werr
		}
	}
	close(o.msgs)
	if !o.stalled {
		<-o.done
	}
	return err
}
