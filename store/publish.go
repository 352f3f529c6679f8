package store

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// publisher publishes the store's messages to JetStream, to the log and to
// the lease bucket: a publish made again until it is stored, within its
// bounds and through the keeper's restarts of the embedded JetStream
// ([publisher.publishRetried]); one made once, its acknowledgement waited
// for ([publisher.publishMsg]); and one whose acknowledgement is not
// waited for ([publisher.publishAsync]). With the embedded store it reads
// the acknowledgements itself, on its own inbox (puback.go).
//
// Its fields are set by newPublisher and read-only after, but for acks,
// which has its own lock.
type publisher struct {
	logger *slog.Logger
	closed <-chan struct{} // the store's: closed by Close
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream // the log, where storedRecord looks
	// keeper holds the publishes of the embedded file store around a
	// restart of its JetStream, and is told of each write refused for
	// room (failedwrite.go, capacity.go).
	keeper *keeper
	// ownAcks says that the publisher reads its publishes'
	// acknowledgements itself, acks the inbox of those it does not wait on
	// and of the frames: see puback.go.
	ownAcks bool
	acks    ackInbox
	// framesHeld counts the frames encoded for an attempt under way whose
	// buffers are not given back yet (see [publisher.publishOut]).
	framesHeld atomic.Int32
	// frameBuf is the buffer the embedded store's frames are encoded
	// into, under frameMu, one publish at a time.
	frameMu  sync.Mutex
	frameBuf []byte
}

// newPublisher returns the publisher of a store on nc and js; with ownAcks
// it reads the acknowledgements itself, on an inbox it subscribes now.
func newPublisher(logger *slog.Logger, closed <-chan struct{}, nc *nats.Conn, js jetstream.JetStream, stream jetstream.Stream, kp *keeper, ownAcks bool) (*publisher, error) {
	p := &publisher{logger: logger, closed: closed, nc: nc, js: js, stream: stream, keeper: kp, ownAcks: ownAcks}
	if ownAcks {
		if err := p.acks.listen(nc); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// publishMsg publishes msg, its expectations and message id in its
// headers, and returns its acknowledgement, as jetstream's PublishMsg
// does but for the retries of a publish that found no stream, which
// [publisher.publishRetried] makes. The embedded store reads the
// acknowledgement itself ([decodePubAck]); with a NATS cluster, where a
// publish is a network round trip and its decoding a small part of it,
// nats.go's client does.
func (p *publisher) publishMsg(ctx context.Context, msg *nats.Msg) (*jetstream.PubAck, error) {
	if !p.ownAcks {
		return p.js.PublishMsg(ctx, msg)
	}
	resp, err := p.nc.RequestMsgWithContext(ctx, msg)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, jetstream.ErrNoStreamResponse
	}
	if err != nil {
		return nil, err
	}
	return decodePubAck(resp.Data)
}

// publishAsync publishes msg without waiting for its acknowledgement,
// whose future it returns; the taker of an [ackFuture] that stops waiting
// before its answer gives it to [publisher.forgetAck].
func (p *publisher) publishAsync(msg *nats.Msg) (jetstream.PubAckFuture, error) {
	if !p.ownAcks {
		return p.js.PublishMsgAsync(msg)
	}
	return p.acks.publishAsync(p.nc, msg)
}

// forgetAck drops f from the store's inbox when it is the store's own: its
// answer, if it comes, is not waited for any more.
func (p *publisher) forgetAck(f jetstream.PubAckFuture) {
	if f, ok := f.(*ackFuture); ok {
		p.acks.forget(f)
	}
}

// publishRetried publishes msg, its expectations and message id in its
// headers (see [publisher.publishMsg]), and returns its acknowledgement. An attempt
// that [mayPass] is made again after a short pause, each waiting
// publishTry for its answer, all within ctx and until the store closes;
// dedupe says that msg carries a message id, so one that got no answer
// may be made again too. Without one, an attempt that got no answer
// cannot be made again (it may be stored), so it waits for its answer as
// long as ctx lets it: a loaded server answers late, and that is
// backpressure, not a failure. It returns the last attempt's failure.
//
// With the embedded file store, an attempt the keeper stops because the
// server failed a write (failedwrite.go) is made again once the server
// takes writes, unless stored finds msg in the log: its acknowledgement
// was on its way when the write after it failed.
func (p *publisher) publishRetried(ctx context.Context, msg *nats.Msg, dedupe bool, stored storedFunc) (*jetstream.PubAck, error) {
	return p.retried(ctx, msg, nil, dedupe, stored)
}

// publishFrame is publishRetried of msg with f's frame as its data, which
// each attempt encodes afresh from f's events and gives back once its
// publish returned (see [outFrame], [publisher.publishOut]): a retry
// publishes the same bytes, and no frame is held while its
// acknowledgement is waited for.
func (p *publisher) publishFrame(ctx context.Context, msg *nats.Msg, f *outFrame, dedupe bool, stored storedFunc) (*jetstream.PubAck, error) {
	return p.retried(ctx, msg, f, dedupe, stored)
}

// retried is publishRetried, of f's frame as msg's data when f is not nil.
func (p *publisher) retried(ctx context.Context, msg *nats.Msg, f *outFrame, dedupe bool, stored storedFunc) (*jetstream.PubAck, error) {
	size := len(msg.Data)
	if f != nil {
		size = f.size()
	}
	for {
		// Without a message id an attempt waits as long as ctx lets it:
		// no timer of its own.
		tctx, tcancel := ctx, context.CancelFunc(func() {})
		if dedupe {
			tctx, tcancel = context.WithTimeout(ctx, publishTry)
		}
		ack, err, halted := p.attempt(tctx, msg, f)
		tcancel()
		if halted != nil {
			// The keeper restarts the embedded JetStream: wait for it.
			select {
			case <-halted:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-p.closed:
				return nil, ErrClosed
			}
		}
		if errors.Is(err, errWriteFailed) {
			// Once the keeper restarted the server, msg is made again
			// unless it was stored before the write that failed.
			if ack, ok, err := p.keeper.findStored(ctx, stored); err != nil || ok {
				return ack, err
			}
			p.logger.Debug("turn store: publish stopped by a failed write; made again", "subject", msg.Subject)
			continue
		}
		p.keeper.noteWrite(msg, size, err)
		if err == nil || isWrongLastSeq(err) || isClosed(p.closed) || ctx.Err() != nil || !mayPass(err, dedupe) && !p.keeper.waitRoom(msg.Subject, err) {
			return ack, err
		}
		p.logger.Debug("turn store: publish retried", "subject", msg.Subject, "error", err)
		select {
		case <-ctx.Done():
			return nil, err
		case <-p.closed:
			return nil, err
		case <-time.After(publishBackoff):
		}
	}
}

// attempt makes one attempt of retried, of f's frame when f is not nil:
// with the embedded file store, under the keeper's hold on writes
// ([keeper.attempt]), which ends it with errWriteFailed when the server
// failed a write, or, while the keeper restarts the server, returns the
// channel closed once it may be made.
func (p *publisher) attempt(ctx context.Context, msg *nats.Msg, f *outFrame) (*jetstream.PubAck, error, <-chan struct{}) {
	return p.keeper.attempt(ctx, func(ctx context.Context) (*jetstream.PubAck, error) {
		if f != nil {
			return p.publishOut(ctx, msg, f)
		}
		return p.publishMsg(ctx, msg)
	})
}

// publishOut is publishMsg of msg with f's frame as its data, encoded for
// this attempt and given back as soon as the publish returned: nats.go
// copied it into its connection's buffer. The embedded store, which reads
// its acknowledgements itself, encodes every frame into one buffer of the
// publisher's, under its lock, and waits for the acknowledgement after
// it: the connection takes one publish at a time anyway (under its own
// lock), and turns that write at the same tick, each encoding its frame
// into a buffer of its own and then waiting for the connection, held a
// buffer each, which a pool kept after them (32 MB live at the peak of
// 300 never-reading streams, issue 37). With a NATS cluster, nats.go's
// client waits for the acknowledgement inside its publish, so each
// attempt takes a buffer of framePool for that long.
func (p *publisher) publishOut(ctx context.Context, msg *nats.Msg, f *outFrame) (*jetstream.PubAck, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !p.ownAcks {
		buf := framePool.Get().(*[]byte)
		p.framesHeld.Add(1)
		msg.Data = encodeFrame(f.batch, *buf)
		ack, err := p.js.PublishMsg(ctx, msg)
		keepFrameBuffer(buf, msg.Data)
		msg.Data = nil
		p.framesHeld.Add(-1)
		return ack, err
	}
	p.frameMu.Lock()
	p.framesHeld.Add(1)
	msg.Data = encodeFrame(f.batch, p.frameBuf)
	fut, err := p.acks.publishAsync(p.nc, msg)
	if cap(msg.Data) <= maxFrame {
		p.frameBuf = msg.Data[:0]
	}
	msg.Data = nil
	p.framesHeld.Add(-1)
	p.frameMu.Unlock()
	if err != nil {
		return nil, err
	}
	return p.acks.wait(ctx, fut, p.closed)
}

// mayPass reports whether a failed publish may be made again: the stream
// could not take it for now, or, when a retry is deduplicated (answered),
// it got no answer.
func mayPass(err error, answered bool) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		// JetStream temporarily unavailable; this frame's earlier attempt
		// still in process; the subject's last sequence not known yet (a
		// new leader catching up).
		case 10008, 10158, 10163:
			return true
		}
		return false
	}
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) {
		return true // nothing took it
	}
	return answered && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected))
}

// storedRecord returns the function that finds msg, a run's owner record,
// in the log as the run's last one.
func (p *publisher) storedRecord(msg *nats.Msg) storedFunc {
	return func(ctx context.Context) (*jetstream.PubAck, bool, error) {
		m, err := p.stream.GetLastMsgForSubject(ctx, msg.Subject)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return nil, false, nil
		case err != nil:
			return nil, false, err
		case !bytes.Equal(m.Data, msg.Data) || m.Header.Get(ownerHeader) != msg.Header.Get(ownerHeader):
			return nil, false, nil
		}
		return &jetstream.PubAck{Stream: StreamName, Sequence: m.Sequence}, true, nil
	}
}
