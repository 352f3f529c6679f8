package server

import (
	"fmt"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// eventStatus returns the status a stream ends with after its terminal
// event ev.
func eventStatus(ev *turnstilev1.AgentEvent) *status.Status {
	e := ev.GetError()
	if e == nil {
		return status.New(codes.OK, "")
	}
	te := &runtime.TurnError{Kind: kindOf(e.GetCode()), Message: e.GetMessage(), Retryable: e.Retryable, Model: e.GetModel()}
	if ra := e.GetRetryAfter(); ra != nil {
		te.RetryAfter = ra.AsDuration()
	}
	return turnStatus(te)
}

// kinds maps the wire's error codes back to the runtime's kinds.
var kinds = func() map[turnstilev1.ErrorCode]llm.Kind {
	m := map[turnstilev1.ErrorCode]llm.Kind{}
	for _, k := range llm.Kinds() {
		m[errorCode(k)] = k
	}
	return m
}()

func kindOf(c turnstilev1.ErrorCode) llm.Kind {
	if k, ok := kinds[c]; ok {
		return k
	}
	return llm.KindInternal
}

// storeUnavailable is the status of a stream the turn log cannot serve:
// retryable, by watching again from the last seq received.
func storeUnavailable() *status.Status {
	yes := true
	return turnStatus(&runtime.TurnError{
		Kind: llm.KindUnavailable, Retryable: &yes, RetryAfter: 100 * time.Millisecond,
		Message: "the turn log is unavailable or the replica running the turn went away; watch the turn again from the last seq received",
	})
}

// turnNotStored is the status of the streams of a run this replica could
// not store the last events of: an append failed or was not acknowledged
// in time, or another replica took the run over (its lease was not
// renewed in time); the server's log line says which. Retryable, by
// watching the turn again: the log holds what was stored, and the
// replica that took the run over, if one did, goes on with it.
func turnNotStored() *status.Status {
	yes := true
	return turnStatus(&runtime.TurnError{
		Kind: llm.KindUnavailable, Retryable: &yes, RetryAfter: time.Second,
		Message: "this server could not store the turn's last events (the turn log failed them, or another server took the turn over); " +
			"watch the turn again from the last seq received",
	})
}

// turnIDReused is the status of a RunTurn that reuses a turn id and
// attempt for a different request.
func turnIDReused(k runKey) *status.Status {
	st := status.New(codes.AlreadyExists, fmt.Sprintf("turn %q attempt %d already ran with a different request; use a new turn id, or the next attempt to resume it", k.turnID, k.attempt))
	return withDetails(st, &errdetails.ErrorInfo{Reason: ReasonTurnIDReused, Domain: ErrorDomain, Metadata: map[string]string{"attempt": strconv.FormatUint(uint64(k.attempt), 10)}})
}
