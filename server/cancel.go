package server

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/wire"
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

// onSignal answers a signal sent to a run this replica owns.
func (s *service) onSignal(r *run, sig string) []byte {
	if reply, ok := s.onPayloadSignal(r, sig); ok {
		return reply
	}
	switch sig {
	case signalCancel:
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		b, _ := json.Marshal(r.stop(ctx))
		return b
	case signalWatch:
		r.touched(s.grace)
	case signalLost:
		s.logger.Warn("another server took the turn over: stopping it here", "turn_id", r.key.turnID, "attempt", r.key.attempt)
		r.cancel(&llm.Error{Kind: llm.KindUnavailable, Message: "another server took the turn over"})
	}
	return nil
}

// CancelTurn implements [turnstilev1.AgentServiceServer].
func (s *service) CancelTurn(ctx context.Context, req *turnstilev1.CancelTurnRequest) (*turnstilev1.CancelTurnResponse, error) {
	if s.store == nil {
		return s.cancelHere(ctx, req)
	}
	k, st := s.resolve(ctx, req.GetTurnId(), req.GetAttempt())
	if st != nil {
		return nil, st.Err()
	}
	logging.AddFields(ctx, logging.Fields{"turn_id", k.turnID, "attempt", k.attempt})
	resp := &turnstilev1.CancelTurnResponse{Attempt: k.attempt}
	s.mu.Lock()
	r := s.runs[k]
	s.mu.Unlock()
	var reply cancelReply
	if r != nil {
		reply = r.stop(ctx)
	} else {
		b, err := s.store.Signal(ctx, k.id(), k.attempt, signalCancel)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// No replica runs it: it ended, or its owner went away without
			// ending it, which this call then does.
			last, err := s.lastEvent(ctx, k)
			if err != nil {
				s.logger.Warn("turn store unreachable: run not read", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
				return nil, storeUnreachable().Err()
			}
			reply.LastSeq = last.GetSeq()
			if last == nil || !terminal(last) {
				cancelled := &runtime.TurnError{Kind: llm.KindCancelled, Message: "the turn was cancelled by CancelTurn"}
				if seq, ok := s.closeOrphan(ctx, k, cancelled, "cancelled by CancelTurn"); ok {
					reply.Cancelled, reply.LastSeq = true, seq
				}
			}
		case err != nil:
			s.logger.Warn("turn store unreachable: cancel signal not sent", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
			return nil, storeUnreachable().Err()
		default:
			if err := json.Unmarshal(b, &reply); err != nil {
				return nil, status.Error(codes.Internal, "internal error")
			}
		}
	}
	resp.Cancelled, resp.LastSeq = reply.Cancelled, reply.LastSeq
	return resp, nil
}

// cancelHere serves CancelTurn on a server that keeps no turn log: a turn
// of the caller's key running here is stopped as a durable run is, and the
// call returns once its RunTurn stream has sent the last event. A turn
// running elsewhere cannot be reached: FAILED_PRECONDITION, as before
// (closing its stream cancels it).
func (s *service) cancelHere(ctx context.Context, req *turnstilev1.CancelTurnRequest) (*turnstilev1.CancelTurnResponse, error) {
	if bad := wire.TurnID(req.GetTurnId()); len(bad) > 0 {
		return nil, invalidArgument(bad).Err()
	}
	s.mu.Lock()
	t := s.localTurn(ctx, req.GetTurnId(), req.GetAttempt())
	var cancelled bool
	if t != nil {
		select {
		case <-t.ended:
		default:
			cancelled = !t.stopped
			t.stopped = true
		}
	}
	s.mu.Unlock()
	if t == nil {
		return nil, status.Error(codes.FailedPrecondition, "this server keeps no turn log (store.mode: off) and the turn does not run on it: closing its RunTurn stream cancels it")
	}
	logging.AddFields(ctx, logging.Fields{"turn_id", t.key.turnID, "attempt", t.key.attempt})
	t.cancel(&llm.Error{Kind: llm.KindCancelled, Message: "the turn was cancelled by CancelTurn"})
	select {
	case <-t.ended:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return &turnstilev1.CancelTurnResponse{Cancelled: cancelled, Attempt: t.key.attempt, LastSeq: t.lastSeq}, nil
}
