package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/runtime"
)

// follow streams the run k after afterSeq to send, from this replica's
// fan-out when it owns the run, else from the log, and returns the status
// the stream ends with.
func (s *service) follow(ctx context.Context, k runKey, afterSeq uint64, send func(*turnstilev1.AgentEvent) error) *status.Status {
	s.mu.Lock()
	r := s.runs[k]
	s.mu.Unlock()
	if r != nil {
		return s.watchRun(ctx, r, afterSeq, send)
	}
	// Tell the owner, wherever it is, that a client watches.
	s.store.Notify(k.turnID, k.attempt, signalWatch)
	tick := time.NewTicker(max(s.grace/3, 10*time.Millisecond))
	defer tick.Stop()
	seq := afterSeq
	// The event at afterSeq is read again, unsent, to learn whether the
	// client already holds the last one.
	from := max(afterSeq, 1) - 1
	for b, err := range s.store.Events(ctx, k.turnID, k.attempt, from) {
		if err != nil {
			if ctx.Err() != nil {
				return status.FromContextError(ctx.Err())
			}
			s.logger.Warn("turn store: watch ended", "turn_id", k.turnID, "attempt", k.attempt, "after_seq", seq, "error", err)
			return storeUnavailable()
		}
		ev := &turnstilev1.AgentEvent{}
		if err := proto.Unmarshal(b, ev); err != nil {
			s.logger.Error("turn store: undecodable event", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
			return status.New(codes.Internal, "internal error")
		}
		if ev.GetSeq() > afterSeq {
			if err := send(ev); err != nil {
				return status.Convert(err)
			}
		}
		seq = ev.GetSeq()
		if ev.GetError() != nil || ev.GetTurnCompleted() != nil {
			return eventStatus(ev)
		}
		select {
		case <-tick.C:
			s.store.Notify(k.turnID, k.attempt, signalWatch)
		default:
		}
	}
	return status.FromContextError(ctx.Err())
}

// WatchTurn implements [turnstilev1.AgentServiceServer].
func (s *service) WatchTurn(req *turnstilev1.WatchTurnRequest, stream grpc.ServerStreamingServer[turnstilev1.WatchTurnResponse]) error {
	ctx := stream.Context()
	k, st := s.resolve(ctx, req.GetTurnId(), req.GetAttempt())
	if st != nil {
		return st.Err()
	}
	logging.AddFields(ctx, logging.Fields{"turn_id", k.turnID, "attempt", k.attempt, "after_seq", req.GetAfterSeq()})
	wrap := func(ev *turnstilev1.AgentEvent) *turnstilev1.WatchTurnResponse {
		return &turnstilev1.WatchTurnResponse{Event: ev}
	}
	return paced(ctx, s, stream.Send, wrap, func(ctx context.Context, send func(*turnstilev1.AgentEvent) error) *status.Status {
		return s.follow(ctx, k, req.GetAfterSeq(), send)
	}).Err()
}

// resolve checks a turn id and attempt named by WatchTurn or CancelTurn,
// resolves attempt 0 to the latest one, and makes sure the store holds the
// run.
func (s *service) resolve(ctx context.Context, turnID string, attempt uint32) (runKey, *status.Status) {
	if s.store == nil {
		return runKey{}, status.New(codes.FailedPrecondition, "this server keeps no turn log (store.mode: off): turns cannot be watched or cancelled")
	}
	if turnID == "" {
		return runKey{}, invalidArgument([]*runtime.FieldError{{Field: "turn_id", Description: "required"}})
	}
	if len(turnID) > maxTurnIDLen {
		return runKey{}, invalidArgument([]*runtime.FieldError{{Field: "turn_id", Description: fmt.Sprintf("must be valid UTF-8 of at most %d bytes", maxTurnIDLen)}})
	}
	k := runKey{turnID: turnID, attempt: attempt}
	var err error
	if k.attempt == 0 {
		k.attempt, err = s.store.LatestAttempt(ctx, turnID)
	}
	var rec []byte
	if err == nil {
		rec, err = s.store.Record(ctx, turnID, k.attempt)
	}
	notFound := status.New(codes.NotFound, "no such turn in the log: never run, or older than its retention")
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return k, notFound
	case err != nil:
		s.logger.Warn("turn store: look up run", "turn_id", turnID, "error", err)
		return k, storeUnavailable()
	}
	var first runRecord
	if err := json.Unmarshal(rec, &first); err != nil || first.Client != keyFrom(ctx).name() {
		// Another client key's turn is not this caller's to see.
		return k, notFound
	}
	return k, nil
}
