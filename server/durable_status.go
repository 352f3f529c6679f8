package server

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/wire"
)

// eventStatus returns the status a stream ends with after its terminal
// event ev.
func eventStatus(ev *turnstilev1.AgentEvent) *status.Status {
	e := ev.GetError()
	if e == nil {
		return status.New(codes.OK, "")
	}
	return turnStatus(wire.TurnError(e))
}

// The ErrorInfo metadata key "cause" tells apart the UNAVAILABLE statuses
// of the durable path, whose advice (watch again) is the same.
const (
	causeStoreUnreachable = "store_unreachable"
	causeTakenOver        = "taken_over"
)

// storeUnreachable is the status of a call the turn log could not serve
// (the store did not answer, or failed): retryable, by watching the turn
// again from the last seq received.
func storeUnreachable() *status.Status {
	return watchAgain("the turn log is unreachable; watch the turn again from the last seq received", causeStoreUnreachable)
}

// lostLease is the status the watchers of a run on this replica end with
// when another replica took the run over (this one missed renewing its
// lease, and was fenced out of the log): the turn goes on there, so
// watching it again from the last seq received, on any replica, goes on.
func lostLease() *status.Status {
	return watchAgain("another server took the turn over (this one lost its lease); watch the turn again from the last seq received", causeTakenOver)
}

// watchAgain is a retryable UNAVAILABLE status with msg, its ErrorInfo
// naming cause, and RetryInfo.
func watchAgain(msg, cause string) *status.Status {
	return withDetails(status.New(codes.Unavailable, msg),
		errorInfo(llm.KindUnavailable.String(), map[string]string{"cause": cause}),
		&errdetails.RetryInfo{RetryDelay: durationpb.New(100 * time.Millisecond)})
}

// takenOver reports that err is the store's failure of a run another
// replica claimed from this one; the store's error says so by a method, as
// the server does not import the store.
func takenOver(err error) bool {
	var lost interface{ TakenOver() bool }
	return errors.As(err, &lost) && lost.TakenOver()
}

// orphaned reports that err is the store's failure of a watch whose run
// has no live owner and no terminal event.
func orphaned(err error) bool {
	var o interface{ Orphaned() bool }
	return errors.As(err, &o) && o.Orphaned()
}

// pastTheEnd is the status of a WatchTurn whose after_seq is beyond the
// last event of a finished run: not retryable, nothing more will come.
func pastTheEnd(afterSeq, last uint64) *status.Status {
	return withDetails(status.New(codes.OutOfRange, fmt.Sprintf("after_seq %d is past the end of the turn: its last event has seq %d", afterSeq, last)),
		errorInfo(reasonInvalidRequest, map[string]string{"field": "after_seq", "last_seq": strconv.FormatUint(last, 10)}),
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "after_seq", Description: fmt.Sprintf("at most %d, the seq of the turn's last event", last)}}})
}

// turnNotStored is the status of the streams of a run this replica could
// not store the last events of: an append failed or was not acknowledged
// in time (the log did not answer, or had no room for them); the server's
// log line says which. A run another replica took over ends with
// lostLease instead. Retryable, by watching the turn again: the log holds
// what was stored.
func turnNotStored() *status.Status {
	yes := true
	return turnStatus(&runtime.TurnError{
		Kind: llm.KindUnavailable, Retryable: &yes, RetryAfter: time.Second,
		Message: "this server could not store the turn's last events (the turn log failed them or had no room for them); " +
			"watch the turn again from the last seq received",
	})
}

// turnIDReused is the status of a RunTurn that reuses a turn id and
// attempt for a different request.
func turnIDReused(k runKey) *status.Status {
	st := status.New(codes.AlreadyExists, fmt.Sprintf("turn %q attempt %d already ran with a different request; use a new turn id, or the next attempt to resume it", k.turnID, k.attempt))
	return withDetails(st, &errdetails.ErrorInfo{Reason: ReasonTurnIDReused, Domain: ErrorDomain, Metadata: map[string]string{"attempt": strconv.FormatUint(uint64(k.attempt), 10)}})
}
