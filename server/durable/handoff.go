package durable

import (
	"context"

	"github.com/turnstile-dev/turnstile/llm"
)

// errHandedOff stops the runs a replica shutting down hands to others.
var errHandedOff = &llm.Error{Kind: llm.KindUnavailable, Message: "the server is shutting down: another server takes the turn over"}

// HandOff gives every run this replica owns to the other replicas: each
// stops at once, storing nothing more, and is released once its stored
// events are acknowledged (handOver). It returns how many there were.
func (rs *Runs) HandOff() int { return rs.owned.handOffAll() }

// handOver ends a run handed off by this replica: its lease is released
// for another replica to take it over now, and the clients watching it
// here are told to watch it again (elsewhere).
func (rs *Runs) handOver(ctx context.Context, r *run) {
	k := r.key
	if err := rs.store.Release(ctx, k.id(), k.Attempt); err != nil {
		rs.logger.Warn("turn store: run not released; another server takes it over when its lease expires", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
	} else {
		rs.logger.Info("turn handed over to another server", "turn_id", k.TurnID, "attempt", k.Attempt, "last_seq", r.lastSeq())
	}
	r.finish(ErrHandedOff)
	rs.owned.drop(k, r)
}
