package durable

import (
	"context"
	"errors"
	"io/fs"
	"time"

	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/server/delivery"
	"github.com/turnstile-dev/turnstile/server/wire"
)

// follow streams the run k after afterSeq to out, from this replica's
// fan-out when it owns the run, else from the log, and returns the error
// the stream ends with.
func (rs *Runs) follow(ctx context.Context, k Key, afterSeq uint64, out *delivery.Stream[Item]) error {
	r := rs.owned.get(k)
	if r != nil {
		_, err := rs.watchRun(ctx, r, afterSeq, out)
		return err
	}
	return rs.followLog(ctx, k, afterSeq, out)
}

// adoptRounds bounds how many times one watch finds its run orphaned and
// adopts it (see adopt) before it gives up.
const adoptRounds = 3

// followLog streams the run k after afterSeq from the log. A run found
// with no live owner and no terminal event is adopted by this replica
// (taken over, or closed with a stored error event), then followed on, so
// that every watch ends.
func (rs *Runs) followLog(ctx context.Context, k Key, afterSeq uint64, out *delivery.Stream[Item]) error {
	for round := 0; ; round++ {
		last, orphan, err := rs.readLog(ctx, k, afterSeq, out)
		if !orphan {
			return err
		}
		if round == adoptRounds {
			rs.logger.Error("turn store: the run is still without an owner after adopting it", "turn_id", k.TurnID, "attempt", k.Attempt, "after_seq", last)
			return ErrStoreUnreachable
		}
		if err := rs.takeovers.adopt(ctx, k); err != nil {
			return err
		}
		afterSeq = last
		r := rs.owned.get(k)
		if r != nil {
			// Taken over here.
			_, err := rs.watchRun(ctx, r, afterSeq, out)
			return err
		}
	}
}

// readLog streams the run k after afterSeq from the log to out, and returns
// the seq of the last event the client holds, whether the run turned out
// to have no live owner and no terminal event, and otherwise the error
// the stream ends with.
func (rs *Runs) readLog(ctx context.Context, k Key, afterSeq uint64, out *delivery.Stream[Item]) (last uint64, orphan bool, err error) {
	// The event at afterSeq is read again, unsent, to learn whether the
	// client already holds the last one, unless the run's last event says
	// it (see below).
	from := max(afterSeq, 1) - 1
	if afterSeq > 0 {
		// A finished run ends here when the client holds its last event,
		// or asks for events past it, which will never come.
		last, err := rs.lastEvent(ctx, k)
		if err == nil && last != nil && terminal(last) && afterSeq >= last.GetSeq() {
			if afterSeq > last.GetSeq() {
				return afterSeq, false, &PastEndError{AfterSeq: afterSeq, Last: last.GetSeq()}
			}
			return afterSeq, false, outcome(last)
		}
		if err == nil && last != nil && last.GetSeq() >= afterSeq {
			// The event at afterSeq is not the run's last (or it is, not
			// terminal, and more come): the log is read from the next
			// one. The store reads it from its last frame when that frame
			// holds it (store.Events), as it does after a hand-off whose
			// new owner stored its first frame before this watch read
			// the log: where the event at afterSeq, in the frame before,
			// made it read the whole log.
			from = afterSeq
		}
	}
	// Tell the owner, wherever it is, that a client watches.
	rs.store.Notify(k.id(), k.Attempt, signalWatch)
	tick := time.NewTicker(max(rs.grace/3, 10*time.Millisecond))
	defer tick.Stop()
	seq := afterSeq
	for b, err := range rs.store.Events(ctx, k.id(), k.Attempt, from) {
		if err != nil {
			if ctx.Err() != nil {
				return seq, false, ctx.Err()
			}
			if orphaned(err) {
				rs.logger.Warn("turn store: the run has no live owner and no last event; adopting it", "turn_id", k.TurnID, "attempt", k.Attempt, "after_seq", seq)
				return seq, true, nil
			}
			rs.logger.Warn("turn store unreachable: watch ended", "turn_id", k.TurnID, "attempt", k.Attempt, "after_seq", seq, "error", err)
			return seq, false, ErrStoreUnreachable
		}
		ev := &turnstilev1.AgentEvent{}
		if err := proto.Unmarshal(b, ev); err != nil {
			rs.logger.Error("turn store: undecodable event", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
			return seq, false, ErrCorrupt
		}
		if ev.GetSeq() > afterSeq {
			if err := out.Put(Item{Seq: ev.GetSeq(), Wire: b}); err != nil {
				return seq, false, err
			}
		}
		seq = max(seq, ev.GetSeq())
		if terminal(ev) {
			return seq, false, outcome(ev)
		}
		select {
		case <-tick.C:
			rs.store.Notify(k.id(), k.Attempt, signalWatch)
		default:
		}
	}
	return seq, false, ctx.Err()
}

// terminal reports whether ev is a run's last event.
func terminal(ev *turnstilev1.AgentEvent) bool {
	return ev.GetError() != nil || ev.GetTurnCompleted() != nil
}

// lastEvent returns the run's last stored event; nil when it has none.
func (rs *Runs) lastEvent(ctx context.Context, k Key) (*turnstilev1.AgentEvent, error) {
	b, err := rs.store.LastEvent(ctx, k.id(), k.Attempt)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ev := &turnstilev1.AgentEvent{}
	if err := proto.Unmarshal(b, ev); err != nil {
		return nil, err
	}
	return ev, nil
}

// outcome returns how a stream ends after ev, its run's terminal event:
// nil when the turn completed, else the turn's error.
func outcome(ev *turnstilev1.AgentEvent) error {
	if e := ev.GetError(); e != nil {
		return wire.TurnError(e)
	}
	return nil
}

// Watch streams run k after afterSeq to send, an event's seq and its
// wire form as stored at a time, from this replica's window when it owns the run,
// else from the log, until the run's end: the error is the stream's, as
// [Runs.Run] says, or a *PastEndError for an afterSeq past the end of a
// finished run.
func (rs *Runs) Watch(ctx context.Context, k Key, afterSeq uint64, send func(Item) error) error {
	_, err := rs.stream(ctx, k, nil, afterSeq, send)
	return err
}

// Resolve returns the key of the run that a watch, a cancel or a signal
// of client names: attempt 0 is the latest attempt of the turn. It fails
// with ErrNotFound when the store holds no such run of the client's key
// (another key's turn ids do not exist for it), and ErrStoreUnreachable.
func (rs *Runs) Resolve(ctx context.Context, client, turnID string, attempt uint32) (Key, error) {
	k := Key{Client: client, TurnID: turnID, Attempt: attempt}
	var err error
	if k.Attempt == 0 {
		k.Attempt, err = rs.store.LatestAttempt(ctx, k.id())
	}
	var rec []byte
	if err == nil {
		rec, err = rs.store.Record(ctx, k.id(), k.Attempt)
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return k, ErrNotFound
	case err != nil:
		rs.logger.Warn("turn store unreachable: run not looked up", "turn_id", turnID, "error", err)
		return k, ErrStoreUnreachable
	}
	if first, err := readRecord(rec); err != nil || first.Client != k.Client {
		// Another client key's turn is not this caller's to see.
		return k, ErrNotFound
	}
	return k, nil
}
