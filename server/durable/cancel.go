package durable

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// cancelReply is an owner's reply to a cancel signal.
type cancelReply struct {
	Cancelled bool   `json:"cancelled"`
	LastSeq   uint64 `json:"last_seq"`
}

// stop cancels the run for CancelTurn, waits until it is over (or ctx is
// done), and says whether this call stopped it.
func (r *run) stop(ctx context.Context) cancelReply {
	r.mu.Lock()
	cancelled := !r.done && !r.stopped
	r.stopped = true
	r.mu.Unlock()
	r.cancel(&llm.Error{Kind: llm.KindCancelled, Message: "the turn was cancelled by CancelTurn"})
	select {
	case <-r.ended:
	case <-ctx.Done():
	}
	return cancelReply{Cancelled: cancelled, LastSeq: r.lastSeq()}
}

// signals carry CancelTurn, ApproveToolCall and SteerTurn to the replica
// that owns a run (the store's Signal, to the replica its last owner
// record names), and answer those sent to the runs owned here.
type signals struct{ rs *Runs }

// answer answers a signal sent to a run this replica owns.
func (sg signals) answer(r *run, sig string) []byte {
	if reply, ok := sg.answerPayload(r, sig); ok {
		return reply
	}
	switch sig {
	case signalCancel:
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		b, _ := json.Marshal(r.stop(ctx))
		return b
	case signalWatch:
		r.touched(sg.rs.grace)
	case signalLost:
		sg.rs.logger.Warn("another server took the turn over: stopping it here", "turn_id", r.key.TurnID, "attempt", r.key.Attempt)
		r.cancel(&llm.Error{Kind: llm.KindUnavailable, Message: "another server took the turn over"})
	}
	return nil
}

// Cancelled is what Cancel did: whether it stopped the run (false when it
// had ended, or another call stopped it), and the seq of the run's last
// event once it stopped.
type Cancelled struct {
	Cancelled bool
	LastSeq   uint64
}

// Cancel stops run k, wherever it runs, and returns once its last event is
// stored: here when this replica owns it, else by a signal to its owner. A
// run no replica owns that has not ended (its owner went away) is closed
// here with a stored CANCELLED error event. It fails with
// ErrStoreUnreachable, or ErrCorrupt when the owner's reply does not
// read.
func (rs *Runs) Cancel(ctx context.Context, k Key) (Cancelled, error) {
	r := rs.owned.get(k)
	var reply cancelReply
	if r != nil {
		reply = r.stop(ctx)
	} else {
		b, err := rs.store.Signal(ctx, k.id(), k.Attempt, signalCancel)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// No replica runs it: it ended, or its owner went away without
			// ending it, which this call then does.
			last, err := rs.lastEvent(ctx, k)
			if err != nil {
				rs.logger.Warn("turn store unreachable: run not read", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
				return Cancelled{}, ErrStoreUnreachable
			}
			reply.LastSeq = last.GetSeq()
			if last == nil || !terminal(last) {
				cancelled := &runtime.TurnError{Kind: llm.KindCancelled, Message: "the turn was cancelled by CancelTurn"}
				if seq, ok := rs.takeovers.closeOrphan(ctx, k, cancelled, "cancelled by CancelTurn"); ok {
					reply.Cancelled, reply.LastSeq = true, seq
				}
			}
		case err != nil:
			rs.logger.Warn("turn store unreachable: cancel signal not sent", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
			return Cancelled{}, ErrStoreUnreachable
		default:
			if err := json.Unmarshal(b, &reply); err != nil {
				return Cancelled{}, ErrCorrupt
			}
		}
	}
	return Cancelled{Cancelled: reply.Cancelled, LastSeq: reply.LastSeq}, nil
}
