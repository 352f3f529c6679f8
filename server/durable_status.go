package server

import (
	"context"
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
	"github.com/turnstile-dev/turnstile/server/admission"
	"github.com/turnstile-dev/turnstile/server/delivery"
	"github.com/turnstile-dev/turnstile/server/durable"
)

// ReasonTurnIDReused is the ErrorInfo reason of a RunTurn that reuses a
// turn id and attempt for a different request (ERROR_CODE_TURN_ID_REUSED).
var ReasonTurnIDReused = string(codeReason(turnstilev1.ErrorCode_ERROR_CODE_TURN_ID_REUSED))

// ReasonStoreFull is the ErrorInfo reason of a RunTurn refused because the
// turn store cannot take a new turn (full of running turns, or its disk
// is): RESOURCE_EXHAUSTED with RetryInfo, before any event
// (ERROR_CODE_STORE_FULL).
var ReasonStoreFull = string(codeReason(turnstilev1.ErrorCode_ERROR_CODE_STORE_FULL))

// storeFullRetry is the wait advised to a turn refused for a full store.
const storeFullRetry = 5 * time.Second

// durableStatus returns the status a call served by durable.Runs ends
// with after err: OK for nil (the turn completed and its last event was
// sent), the turn's own status for its *runtime.TurnError, and for each
// of the durable path's failures the status that says it.
func (s *service) durableStatus(ctx context.Context, err error) *status.Status {
	var (
		te     *runtime.TurnError
		past   *durable.PastEndError
		reused *durable.ReusedError
		busy   *durable.BusyError
		ctl    *durable.ControlError
		ref    *admission.Refusal
		fe     *runtime.FieldError
	)
	switch {
	case err == nil:
		return status.New(codes.OK, "")
	case errors.As(err, &te):
		return turnStatus(te)
	case errors.Is(err, durable.ErrStoreUnreachable):
		return storeUnreachable()
	case errors.Is(err, durable.ErrTakenOver):
		return lostLease()
	case errors.Is(err, durable.ErrNotStored):
		return turnNotStored()
	case errors.Is(err, durable.ErrHandedOff):
		return handedOffStatus()
	case errors.Is(err, durable.ErrStoreFull):
		return withDetails(status.New(codes.ResourceExhausted, durable.ErrStoreFull.Error()),
			errorInfo(reason(ReasonStoreFull), nil), &errdetails.RetryInfo{RetryDelay: durationpb.New(storeFullRetry)})
	case errors.Is(err, durable.ErrDraining):
		return turnStatus(drainError())
	case errors.Is(err, durable.ErrNotFound):
		return status.New(codes.NotFound, durable.ErrNotFound.Error())
	case errors.Is(err, durable.ErrCorrupt):
		return status.New(codes.Internal, "internal error")
	case errors.Is(err, delivery.ErrStalled):
		return streamStalled(s.opts.SendTimeout)
	case errors.As(err, &busy):
		yes := true
		return turnStatus(&runtime.TurnError{Kind: llm.KindUnavailable, Retryable: &yes, RetryAfter: time.Second, Message: busy.Error()})
	case errors.As(err, &past):
		return pastTheEnd(past.AfterSeq, past.Last)
	case errors.As(err, &reused):
		return turnIDReused(reused)
	case errors.As(err, &ctl):
		return status.New(controlCode(ctl.Code), ctl.Message)
	case errors.As(err, &ref):
		return refusalStatus(ref, admission.FromContext(ctx).KeyName())
	case errors.As(err, &fe):
		return invalidArgument(fieldErrors(err))
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err)
	}
	// The stream's own failure (its Send's), a status already.
	return status.Convert(err)
}

// controlCode is the status code of a signal's refusal.
func controlCode(c durable.ControlCode) codes.Code {
	switch c {
	case durable.ControlNotFound:
		return codes.NotFound
	case durable.ControlFull:
		return codes.ResourceExhausted
	case durable.ControlEnded:
		return codes.FailedPrecondition
	case durable.ControlRetry:
		return codes.Unavailable
	}
	return codes.Internal
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
	return watchAgain(durable.ErrStoreUnreachable.Error(), causeStoreUnreachable)
}

// lostLease is the status the watchers of a run on this replica end with
// when another replica took the run over (this one missed renewing its
// lease, and was fenced out of the log): the turn goes on there, so
// watching it again from the last seq received, on any replica, goes on.
func lostLease() *status.Status {
	return watchAgain(durable.ErrTakenOver.Error(), causeTakenOver)
}

// watchAgain is a retryable UNAVAILABLE status with msg, its ErrorInfo
// naming cause, and RetryInfo.
func watchAgain(msg, cause string) *status.Status {
	return withDetails(status.New(codes.Unavailable, msg),
		errorInfo(codeReason(turnstilev1.ErrorCode_ERROR_CODE_UNAVAILABLE), map[string]string{"cause": cause}),
		&errdetails.RetryInfo{RetryDelay: durationpb.New(100 * time.Millisecond)})
}

// pastTheEnd is the status of a WatchTurn whose after_seq is beyond the
// last event of a finished run: not retryable, nothing more will come.
func pastTheEnd(afterSeq, last uint64) *status.Status {
	return withDetails(status.New(codes.OutOfRange, (&durable.PastEndError{AfterSeq: afterSeq, Last: last}).Error()),
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
		Message: durable.ErrNotStored.Error(),
	})
}

// turnIDReused is the status of a RunTurn that reuses a turn id and
// attempt for a different request.
func turnIDReused(e *durable.ReusedError) *status.Status {
	st := status.New(codes.AlreadyExists, e.Error())
	return withDetails(st, errorInfo(reason(ReasonTurnIDReused), map[string]string{"attempt": strconv.FormatUint(uint64(e.Attempt), 10)}))
}

// handedOffStatus ends the streams of a run this replica handed off:
// retryable, by watching the turn again, which another replica serves.
func handedOffStatus() *status.Status {
	yes := true
	return turnStatus(&runtime.TurnError{
		Kind: llm.KindUnavailable, Retryable: &yes, RetryAfter: 100 * time.Millisecond,
		Message: durable.ErrHandedOff.Error(),
	})
}

// streamStalled is the status of a stream of a durable turn whose client
// accepted no event for timeout: the stream is closed, and the turn goes
// on without it (its detach grace applies) and can be watched again.
func streamStalled(timeout time.Duration) *status.Status {
	return turnStatus(&runtime.TurnError{
		Kind: llm.KindDeadlineExceeded,
		Message: fmt.Sprintf("the client accepted no event for %s (server.send_timeout); the stream was closed and the turn goes on: "+
			"watch it again from the last seq received", timeout),
	})
}
