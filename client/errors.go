package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of turnstile's errors.
const ErrorDomain = "turnstile"

// TurnError is the failure of a turn after the client's last attempt. Read
// it with errors.As; Unwrap returns the cause (the RPC's status error or
// the context's error), so errors.Is(err, context.Canceled) works.
type TurnError struct {
	// TurnID is the turn's id, shared by every attempt.
	TurnID string
	// Code is the class of the failure.
	Code turnstilev1.ErrorCode
	// Message says what went wrong, fit to show a person.
	Message string
	// Retryable reports that the turn may succeed if run again later (the
	// server advised it, or the transport failed). False when the server
	// advised against it or gave no advice.
	Retryable bool
	// RetryAfter is how long to wait before running the turn again, when
	// known.
	RetryAfter time.Duration
	// Model is the model alias the failure concerns, when one does.
	Model string
	// Attempts is the number of attempts the client made, the first
	// included.
	Attempts int
	// Reattaches is the number of times the client re-attached to a run
	// whose stream broke (WatchTurn calls), across every attempt.
	Reattaches int
	// ModelAttempts lists the attempts the server made per model during
	// the last attempt, when it said.
	ModelAttempts []*turnstilev1.ModelAttempts
	// Messages are the messages the turn committed that stand: to run the
	// turn again later, re-send them after the request's own, with the
	// same turn id.
	Messages []*turnstilev1.Message
	// Conversation is the conversation to send to continue: the request's
	// messages and Messages, with the compactions the server made applied
	// (see [Result.Conversation]).
	Conversation []*turnstilev1.Message
	// Status is the RPC's final status; nil when the turn never reached
	// the server's answer (for example the caller's context ended during
	// a retry delay).
	Status *status.Status
	// Err is the cause, for errors.Is and errors.As.
	Err error
}

// Error returns the code, the message and the attempts.
func (e *TurnError) Error() string {
	s := "turnstile: turn"
	if e.TurnID != "" {
		s += " " + e.TurnID
	}
	s += " failed"
	if e.Attempts > 1 {
		s += fmt.Sprintf(" after %d attempts", e.Attempts)
	}
	return s + ": " + CodeName(e.Code) + ": " + e.Message
}

// Unwrap returns the cause.
func (e *TurnError) Unwrap() error { return e.Err }

// CodeName returns c without its ERROR_CODE_ prefix, for example
// "RATE_LIMITED", as in the ErrorInfo reason.
func CodeName(c turnstilev1.ErrorCode) string {
	const prefix = "ERROR_CODE_"
	n := c.String()
	if len(n) > len(prefix) && n[:len(prefix)] == prefix {
		return n[len(prefix):]
	}
	return n
}

// failure is one attempt's failure, with the client's verdict on it.
type failure struct {
	err *TurnError
	// retry reports that the step may be run again.
	retry bool
	// transport reports that the stream broke without a terminal event.
	transport bool
}

// fromErrorEvent reads the terminal error event of an attempt.
func fromErrorEvent(e *turnstilev1.Error) failure {
	te := &TurnError{
		Code:          e.GetCode(),
		Message:       e.GetMessage(),
		Retryable:     e.GetRetryable(),
		Model:         e.GetModel(),
		ModelAttempts: e.GetAttempts(),
	}
	if d := e.GetRetryAfter(); d != nil {
		te.RetryAfter = d.AsDuration()
	}
	// Unset advice is no advice: do not retry.
	return failure{err: te, retry: e.Retryable != nil && e.GetRetryable()}
}

// fromStatus reads an attempt that ended with a non-OK status and no
// terminal event. A turnstile ErrorInfo says the server classified the
// failure: it is retryable when a RetryInfo comes with it. Without one the
// failure is the transport's (or a proxy's): UNAVAILABLE, a replica gone or
// a connection reset, is retried.
func fromStatus(err error) failure {
	st := status.Convert(err)
	te := &TurnError{Message: st.Message(), Status: st, Err: err}
	var info *errdetails.ErrorInfo
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == ErrorDomain && info == nil {
				info = d
			}
		case *errdetails.RetryInfo:
			retry = d
		}
	}
	if info != nil {
		te.Code = codeFromReason(info.GetReason())
		te.Model = info.GetMetadata()["model"]
		if retry != nil {
			te.Retryable = true
			te.RetryAfter = retry.GetRetryDelay().AsDuration()
		}
		return failure{err: te, retry: te.Retryable}
	}
	te.Code = codeFromStatus(st.Code())
	if retry != nil && st.Code() != codes.InvalidArgument {
		te.Retryable = true
		te.RetryAfter = retry.GetRetryDelay().AsDuration()
	}
	if st.Code() == codes.Unavailable {
		te.Retryable = true
		return failure{err: te, retry: true, transport: true}
	}
	return failure{err: te, retry: te.Retryable}
}

// codeFromReason maps an ErrorInfo reason to its error code.
func codeFromReason(reason string) turnstilev1.ErrorCode {
	if v, ok := turnstilev1.ErrorCode_value["ERROR_CODE_"+reason]; ok {
		return turnstilev1.ErrorCode(v)
	}
	return turnstilev1.ErrorCode_ERROR_CODE_INTERNAL
}

// codeFromStatus maps a status code that came without an ErrorInfo.
func codeFromStatus(c codes.Code) turnstilev1.ErrorCode {
	switch c {
	case codes.Unavailable:
		return turnstilev1.ErrorCode_ERROR_CODE_UNAVAILABLE
	case codes.Canceled:
		return turnstilev1.ErrorCode_ERROR_CODE_CANCELLED
	case codes.DeadlineExceeded:
		return turnstilev1.ErrorCode_ERROR_CODE_DEADLINE_EXCEEDED
	case codes.InvalidArgument, codes.OutOfRange:
		return turnstilev1.ErrorCode_ERROR_CODE_INVALID_REQUEST
	case codes.Unauthenticated, codes.PermissionDenied:
		return turnstilev1.ErrorCode_ERROR_CODE_AUTH
	case codes.NotFound, codes.Unimplemented:
		return turnstilev1.ErrorCode_ERROR_CODE_NOT_FOUND
	case codes.Aborted:
		return turnstilev1.ErrorCode_ERROR_CODE_TOOLS_UNSAFE
	}
	return turnstilev1.ErrorCode_ERROR_CODE_INTERNAL
}

// contextError returns the failure of a turn whose caller's context ended.
func contextError(ctx context.Context) *TurnError {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, err) {
		err = fmt.Errorf("%w: %w", err, cause)
	}
	te := &TurnError{Code: turnstilev1.ErrorCode_ERROR_CODE_CANCELLED, Message: "the turn was cancelled", Err: err}
	if errors.Is(err, context.DeadlineExceeded) {
		te.Code, te.Message = turnstilev1.ErrorCode_ERROR_CODE_DEADLINE_EXCEEDED, "the turn's deadline passed"
	}
	return te
}
