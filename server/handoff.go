package server

import (
	"context"
	"time"

	"google.golang.org/grpc/status"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// errHandedOff stops the runs a replica shutting down hands to others.
var errHandedOff = &llm.Error{Kind: llm.KindUnavailable, Message: "the server is shutting down: another server takes the turn over"}

// handOff gives every run this replica owns to the other replicas: each
// stops at once, storing nothing more, and is released once its stored
// events are acknowledged (handOver). It returns how many there were.
func (s *service) handOff() int {
	if s.store == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.runs {
		r.handedOff.Store(true)
		r.cancel(errHandedOff)
	}
	return len(s.runs)
}

// handOver ends a run handed off by this replica: its lease is released
// for another replica to take it over now, and the clients watching it
// here are told to watch it again (elsewhere).
func (s *service) handOver(ctx context.Context, r *run) {
	k := r.key
	if err := s.store.Release(ctx, k.id(), k.attempt); err != nil {
		s.logger.Warn("turn store: run not released; another server takes it over when its lease expires", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
	} else {
		s.logger.Info("turn handed over to another server", "turn_id", k.turnID, "attempt", k.attempt, "last_seq", r.lastSeq())
	}
	r.finish(handedOffStatus())
	s.mu.Lock()
	delete(s.runs, k)
	s.mu.Unlock()
}

// handedOffStatus ends the streams of a run this replica handed off:
// retryable, by watching the turn again, which another replica serves.
func handedOffStatus() *status.Status {
	yes := true
	return turnStatus(&runtime.TurnError{
		Kind: llm.KindUnavailable, Retryable: &yes, RetryAfter: 100 * time.Millisecond,
		Message: "the server is shutting down and another server takes the turn over; watch the turn again from the last seq received",
	})
}
