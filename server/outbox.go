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
// goroutine of the outbox's own, and Emit waits for it at most sendTimeout:
// a client that accepts no event for that long has its turn cancelled (the
// model call and tools stop, the upstream connection is closed) and the
// handler returns, which ends the stream and the blocked Send with it.
// The runtime waits for each event to be sent before it makes the next, so
// the outbox holds at most one event: nothing queues without bound.
type outbox struct {
	stream   grpc.ServerStreamingServer[turnstilev1.RunTurnResponse]
	cancel   context.CancelCauseFunc // the turn's
	timeout  time.Duration
	maxBytes int
	usage    *usageCharger

	msgs  chan *turnstilev1.RunTurnResponse
	acks  chan error // buffered: the sender never waits for a reader
	done  chan struct{}
	timer *time.Timer

	turnID  string
	sent    uint64 // seq of the last event sent
	failed  error  // the first failure; every later Emit returns it
	stalled bool   // a Send did not return within the timeout
	// tooLarge is set when an event could not be made to fit: the turn
	// ends with an error event the outbox sends itself.
	tooLarge bool
}

func newOutbox(stream grpc.ServerStreamingServer[turnstilev1.RunTurnResponse], cancel context.CancelCauseFunc,
	timeout time.Duration, maxBytes int, usage *usageCharger) *outbox {
	o := &outbox{
		stream: stream, cancel: cancel, timeout: timeout, maxBytes: maxBytes, usage: usage,
		msgs: make(chan *turnstilev1.RunTurnResponse), acks: make(chan error, 1), done: make(chan struct{}),
		timer: time.NewTimer(timeout),
	}
	o.timer.Stop()
	go o.sender()
	return o
}

func (o *outbox) sender() {
	defer close(o.done)
	for m := range o.msgs {
		o.acks <- o.stream.Send(m)
	}
}

// Emit implements [runtime.Sink].
func (o *outbox) Emit(_ context.Context, ev runtime.Event) error {
	if o.failed != nil {
		return o.failed
	}
	o.turnID = ev.TurnID
	if u, ok := ev.Payload.(*runtime.UsageUpdated); ok {
		o.usage.total(u.Total)
	}
	out, err := fromEvent(ev)
	if err != nil {
		o.failed = err
		return err
	}
	resp := &turnstilev1.RunTurnResponse{Event: out}
	if err := o.fit(resp); err != nil {
		o.tooLarge = true
		o.failed = err
		o.cancel(err)
		return err
	}
	if err := o.send(resp); err != nil {
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
func (o *outbox) fit(resp *turnstilev1.RunTurnResponse) error {
	size := proto.Size(resp)
	if size <= o.maxBytes {
		return nil
	}
	if tc := resp.GetEvent().GetTurnCompleted(); tc != nil {
		tc.Messages, tc.MessagesOmitted = nil, true
		if size = proto.Size(resp); size <= o.maxBytes {
			return nil
		}
	}
	what := fmt.Sprintf("%T", resp.GetEvent().GetPayload())
	return &llm.Error{
		Kind:    llm.KindInternal,
		Message: fmt.Sprintf("an event of the turn was larger than the server sends (%d bytes, at most %d: server.max_event_bytes); the turn was ended", size, o.maxBytes),
		Err:     fmt.Errorf("%w: %s of %d bytes", errEventTooLarge, what, size),
	}
}

// send hands resp to the sender and waits until the stream took it, at
// most the send timeout.
func (o *outbox) send(resp *turnstilev1.RunTurnResponse) error {
	o.timer.Reset(o.timeout)
	defer o.timer.Stop()
	select {
	case o.msgs <- resp:
	case <-o.timer.C:
		return o.stall()
	}
	select {
	case err := <-o.acks:
		if err != nil {
			o.failed = err
		}
		return err
	case <-o.timer.C:
		return o.stall()
	}
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
// place. It returns once the sender is gone, unless a Send is stuck, which
// ends with the handler.
func (o *outbox) finish(te *runtime.TurnError) {
	if o.tooLarge && te != nil && !o.stalled {
		out, err := fromEvent(runtime.Event{Seq: o.sent + 1, Time: time.Now(), TurnID: o.turnID, Payload: te})
		if err == nil {
			o.failed = nil
			_ = o.send(&turnstilev1.RunTurnResponse{Event: out})
		}
	}
	close(o.msgs)
	if !o.stalled {
		<-o.done
	}
}
