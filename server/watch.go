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
	"github.com/turnstile-dev/turnstile/server/admission"
	"github.com/turnstile-dev/turnstile/server/delivery"
	"github.com/turnstile-dev/turnstile/server/wire"
)

// follow streams the run k after afterSeq to out, from this replica's
// fan-out when it owns the run, else from the log, and returns the status
// the stream ends with.
func (s *service) follow(ctx context.Context, k runKey, afterSeq uint64, out *delivery.Stream[item]) *status.Status {
	s.mu.Lock()
	r := s.runs[k]
	s.mu.Unlock()
	if r != nil {
		return s.watchRun(ctx, r, afterSeq, out)
	}
	return s.followLog(ctx, k, afterSeq, out)
}

// adoptRounds bounds how many times one watch finds its run orphaned and
// adopts it (see adopt) before it gives up.
const adoptRounds = 3

// followLog streams the run k after afterSeq from the log. A run found
// with no live owner and no terminal event is adopted by this replica
// (taken over, or closed with a stored error event), then followed on, so
// that every watch ends.
func (s *service) followLog(ctx context.Context, k runKey, afterSeq uint64, out *delivery.Stream[item]) *status.Status {
	for round := 0; ; round++ {
		st, last, orphan := s.readLog(ctx, k, afterSeq, out)
		if !orphan {
			return st
		}
		if round == adoptRounds {
			s.logger.Error("turn store: the run is still without an owner after adopting it", "turn_id", k.turnID, "attempt", k.attempt, "after_seq", last)
			return storeUnreachable()
		}
		if st := s.adopt(ctx, k); st != nil {
			return st
		}
		afterSeq = last
		s.mu.Lock()
		r := s.runs[k]
		s.mu.Unlock()
		if r != nil {
			// Taken over here.
			return s.watchRun(ctx, r, afterSeq, out)
		}
	}
}

// readLog streams the run k after afterSeq from the log to out, and returns the
// status the stream ends with, the seq of the last event the client holds,
// and whether the run turned out to have no live owner and no terminal
// event (then the status is nil).
func (s *service) readLog(ctx context.Context, k runKey, afterSeq uint64, out *delivery.Stream[item]) (*status.Status, uint64, bool) {
	if afterSeq > 0 {
		// A finished run ends here when the client holds its last event,
		// or asks for events past it, which will never come.
		if last, err := s.lastEvent(ctx, k); err == nil && last != nil && terminal(last) && afterSeq >= last.GetSeq() {
			if afterSeq > last.GetSeq() {
				return pastTheEnd(afterSeq, last.GetSeq()), afterSeq, false
			}
			return eventStatus(last), afterSeq, false
		}
	}
	// Tell the owner, wherever it is, that a client watches.
	s.store.Notify(k.id(), k.attempt, signalWatch)
	tick := time.NewTicker(max(s.grace/3, 10*time.Millisecond))
	defer tick.Stop()
	seq := afterSeq
	// The event at afterSeq is read again, unsent, to learn whether the
	// client already holds the last one.
	from := max(afterSeq, 1) - 1
	for b, err := range s.store.Events(ctx, k.id(), k.attempt, from) {
		if err != nil {
			if ctx.Err() != nil {
				return status.FromContextError(ctx.Err()), seq, false
			}
			if orphaned(err) {
				s.logger.Warn("turn store: the run has no live owner and no last event; adopting it", "turn_id", k.turnID, "attempt", k.attempt, "after_seq", seq)
				return nil, seq, true
			}
			s.logger.Warn("turn store unreachable: watch ended", "turn_id", k.turnID, "attempt", k.attempt, "after_seq", seq, "error", err)
			return storeUnreachable(), seq, false
		}
		ev := &turnstilev1.AgentEvent{}
		if err := proto.Unmarshal(b, ev); err != nil {
			s.logger.Error("turn store: undecodable event", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
			return status.New(codes.Internal, "internal error"), seq, false
		}
		if ev.GetSeq() > afterSeq {
			if err := out.Put(item{ev, b}); err != nil {
				return s.sendStatus(err), seq, false
			}
		}
		seq = max(seq, ev.GetSeq())
		if terminal(ev) {
			return eventStatus(ev), seq, false
		}
		select {
		case <-tick.C:
			s.store.Notify(k.id(), k.attempt, signalWatch)
		default:
		}
	}
	return status.FromContextError(ctx.Err()), seq, false
}

// terminal reports whether ev is a run's last event.
func terminal(ev *turnstilev1.AgentEvent) bool {
	return ev.GetError() != nil || ev.GetTurnCompleted() != nil
}

// lastEvent returns the run's last stored event; nil when it has none.
func (s *service) lastEvent(ctx context.Context, k runKey) (*turnstilev1.AgentEvent, error) {
	b, err := s.store.LastEvent(ctx, k.id(), k.attempt)
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

// WatchTurn implements [turnstilev1.AgentServiceServer].
func (s *service) WatchTurn(req *turnstilev1.WatchTurnRequest, stream grpc.ServerStreamingServer[turnstilev1.WatchTurnResponse]) error {
	ctx := stream.Context()
	k, st := s.resolve(ctx, req.GetTurnId(), req.GetAttempt())
	if st != nil {
		return st.Err()
	}
	logging.AddFields(ctx, logging.Fields{"turn_id", k.turnID, "attempt", k.attempt, "after_seq", req.GetAfterSeq()})
	return s.streamRun(ctx, k, nil, req.GetAfterSeq(), watchItems(stream)).Err()
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
	if len(turnID) > wire.MaxTurnIDLen {
		return runKey{}, invalidArgument([]*runtime.FieldError{{Field: "turn_id", Description: fmt.Sprintf("must be valid UTF-8 of at most %d bytes", wire.MaxTurnIDLen)}})
	}
	// The caller's turn ids are its key's: another key's do not exist
	// for it.
	k := runKey{client: admission.FromContext(ctx).KeyName(), turnID: turnID, attempt: attempt}
	var err error
	if k.attempt == 0 {
		k.attempt, err = s.store.LatestAttempt(ctx, k.id())
	}
	var rec []byte
	if err == nil {
		rec, err = s.store.Record(ctx, k.id(), k.attempt)
	}
	notFound := status.New(codes.NotFound, "no such turn in the log: never run, or older than its retention")
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return k, notFound
	case err != nil:
		s.logger.Warn("turn store unreachable: run not looked up", "turn_id", turnID, "error", err)
		return k, storeUnreachable()
	}
	var first runRecord
	if err := json.Unmarshal(rec, &first); err != nil || first.Client != k.client {
		// Another client key's turn is not this caller's to see.
		return k, notFound
	}
	return k, nil
}
