package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/admission"
	"github.com/turnstile-dev/turnstile/server/wire"
)

// pacer hands a stream's messages to its Send, one at a time, on a
// goroutine other than the caller's, and waits at most a send timeout for
// each.
//
// grpc-go's Send blocks while the client's flow-control window is full,
// and nothing but the end of the handler unblocks it. So Send runs on a
// worker's goroutine (see [workers]), one message at a time: hand gives it
// a message once the previous one was sent, waiting at most timeout from
// when that one was handed over, and fails with [errStalled] when it was
// not; the handler then returns, which ends the stream and the blocked
// Send with it. A stream costs at most the message being sent and gRPC's
// queue. The worker is the stream's only while a Send is under way: a
// stream waiting for its next event (a slow turn, held open for minutes)
// holds no goroutine for its sends, where a sender per stream waited for
// the stream's whole life (BENCHMARKS.md, issue #26).
type pacer[M any] struct {
	send    func(M) error
	timeout time.Duration
	start   func(func())
	sendOne func() // p.sendNext, made once
	// idle, when set, is called after each Send: the pacer is no longer
	// busy. Set it before the first hand.
	idle func()

	next  M          // the message handed over, for sendOne
	acks  chan error // buffered: the Send's worker never waits for a reader
	timer *time.Timer

	inflight bool      // a message was handed over and its Send has not been acknowledged
	handedAt time.Time // when it was
	stalled  bool      // a Send did not return within the timeout
}

// errStalled is the failure of a pacer whose client accepted no message
// for the send timeout.
var errStalled = errors.New("server: the client accepted no message for the send timeout")

// newPacer returns the pacer of send; start runs each Send on a goroutine
// (see [workers]).
func newPacer[M any](send func(M) error, timeout time.Duration, start func(func())) *pacer[M] {
	p := &pacer[M]{
		send: send, timeout: timeout, start: start,
		acks:  make(chan error, 1),
		timer: time.NewTimer(timeout),
	}
	p.sendOne = p.sendNext
	p.timer.Stop()
	return p
}

// sendNext sends the message handed over and acknowledges it.
func (p *pacer[M]) sendNext() {
	m := p.next
	var zero M
	p.next = zero
	p.acks <- p.send(m)
	if p.idle != nil {
		p.idle()
	}
}

// busy reports whether a Send is under way.
func (p *pacer[M]) busy() bool { return p.inflight && len(p.acks) == 0 }

// hand starts the Send of m once the previous message was sent.
func (p *pacer[M]) hand(m M) error {
	if err := p.wait(); err != nil {
		return err
	}
	p.next = m
	p.inflight, p.handedAt = true, time.Now()
	p.start(p.sendOne)
	return nil
}

// wait waits until the message in flight, if any, was sent: at most the
// send timeout from when it was handed over. It returns the Send's error,
// or errStalled.
func (p *pacer[M]) wait() error {
	if p.stalled {
		return errStalled
	}
	if !p.inflight {
		return nil
	}
	select {
	case err := <-p.acks:
		p.inflight = false
		return err
	default:
	}
	p.timer.Reset(p.timeout - time.Since(p.handedAt))
	defer p.timer.Stop()
	select {
	case err := <-p.acks:
		p.inflight = false
		return err
	case <-p.timer.C:
		p.stalled = true
		return errStalled
	}
}

// close ends the pacer once what it was handed is sent, unless a Send is
// stuck, which ends with the handler: it waits for the Send under way.
func (p *pacer[M]) close() {
	if p.inflight && !p.stalled {
		<-p.acks
		p.inflight = false
	}
}

// outbox is the sink of one turn without a turn store: it maps each event
// for the wire, keeps it within the event size limit, and hands it to the
// stream through a [pacer]. A client that accepts no event for the send
// timeout has its turn cancelled (the model call and tools stop, the
// upstream connection is closed) and the stream ends. While a Send is
// under way the outbox says it is busy ([runtime.BusySink]), and the
// runtime merges the deltas that come meanwhile: a slow client gets fewer,
// larger events, and at most one event waits here.
type outbox struct {
	p        *pacer[*turnstilev1.RunTurnResponse]
	cancel   context.CancelCauseFunc // the turn's
	timeout  time.Duration
	maxBytes int
	usage    *admission.Charger
	attempt  uint32 // the run's, set on every event

	turnID string
	sent   uint64 // seq of the last event handed over
	failed error  // the first failure; every later Emit returns it
	// tooLarge is set when an event could not be made to fit: the turn
	// ends with an error event the outbox sends itself.
	tooLarge bool
}

var _ runtime.IdleSink = (*outbox)(nil)

// newOutbox returns the outbox of a turn streamed to stream; start runs
// each Send on a goroutine (see [workers]).
func newOutbox(stream grpc.ServerStreamingServer[turnstilev1.RunTurnResponse], cancel context.CancelCauseFunc,
	timeout time.Duration, maxBytes int, usage *admission.Charger, start func(func())) *outbox {
	return &outbox{
		p:      newPacer(stream.Send, timeout, start),
		cancel: cancel, timeout: timeout, maxBytes: maxBytes, usage: usage,
	}
}

// Busy implements [runtime.BusySink]: a Send is under way.
func (o *outbox) Busy() bool { return o.p.busy() }

// OnIdle implements [runtime.IdleSink]: f is called when a Send is done.
func (o *outbox) OnIdle(f func()) { o.p.idle = f }

// Emit implements [runtime.Sink].
func (o *outbox) Emit(_ context.Context, ev runtime.Event) error {
	// Charged whether or not the client is still there to receive it.
	o.usage.Event(ev)
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
func (o *outbox) hand(resp *turnstilev1.RunTurnResponse) error {
	return o.failure(o.p.hand(resp))
}

// failure records err, a failure of the pacer, as the outbox's; a stall
// cancels the turn of a client that stopped reading.
func (o *outbox) failure(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errStalled):
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

// finish ends a turn whose outcome is te (nil when it completed): when an
// event was too large to send, it sends te as the turn's last event in its
// place. It waits for the last event to be sent, at most the send timeout,
// and returns the stall's error if it was not (the turn's outcome was not
// delivered). It returns once no Send is under way, unless one is stuck,
// which ends with the handler.
func (o *outbox) finish(te *runtime.TurnError) error {
	stalled := o.p.stalled
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
		if werr := o.failure(o.p.wait()); o.p.stalled {
			err = werr
		}
	}
	o.p.close()
	return err
}

// streamStalled is the status of a stream of a durable turn whose client
// accepted no event for timeout: the stream is closed, and the turn goes
// on without it (its detach grace applies) and can be watched again.
func streamStalled(timeout time.Duration) *status.Status {
	return turnStatus(&runtime.TurnError{
		Kind: llm.KindDeadlineExceeded,
		Message: fmt.Sprintf("the client accepted no event for %s (server.send_timeout); the stream was closed and the turn goes on: "+
			"watch it again from the last seq received", timeout),
	})
}

// paced streams a durable turn's events to a client through a [pacer]:
// follow sends each event with the function it is given, under a context
// of ctx, and returns the status the stream ends with. A client that
// accepts no event for the send timeout has its stream closed with
// [streamStalled], also while no new event comes (follow's context ends
// then); the turn goes on. It returns once the last event was sent, or the
// stream stalled.
func paced[M any](ctx context.Context, s *service, send func(M) error, wrap func(*turnstilev1.AgentEvent) M,
	follow func(ctx context.Context, send func(*turnstilev1.AgentEvent) error) *status.Status) *status.Status {
	timeout := s.opts.SendTimeout
	fctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	// The watchdog of the Send under way, on the pacer's goroutine.
	dog := time.AfterFunc(timeout, func() { stop(errStalled) })
	dog.Stop()
	p := newPacer(func(m M) error {
		dog.Reset(timeout)
		defer dog.Stop()
		return send(m)
	}, timeout, s.senders.run)
	st := follow(fctx, func(ev *turnstilev1.AgentEvent) error {
		if err := p.hand(wrap(ev)); err != nil {
			if errors.Is(err, errStalled) {
				return streamStalled(timeout).Err()
			}
			return err
		}
		return nil
	})
	err := p.wait()
	switch {
	case errors.Is(err, errStalled), ctx.Err() == nil && errors.Is(context.Cause(fctx), errStalled):
		// The stream's outcome was not delivered.
		st = streamStalled(timeout)
	case err != nil && st.Code() == codes.OK:
		st = status.Convert(err)
	}
	p.close()
	return st
}
