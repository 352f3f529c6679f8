package server

import (
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of every turnstile error.
const ErrorDomain = "turnstile"

// grpcCode maps the class of a terminal error to the RPC's status code.
// Retryable upstream failures are UNAVAILABLE (or RESOURCE_EXHAUSTED for
// rate limits), which clients and meshes know to retry; a misconfigured
// upstream (auth, unknown model) is FAILED_PRECONDITION, since the caller's
// own credentials are not at fault.
func grpcCode(k llm.Kind) codes.Code {
	switch k {
	case llm.KindRateLimited, llm.KindQuotaExhausted:
		return codes.ResourceExhausted
	case llm.KindOverloaded, llm.KindServerError, llm.KindTimeout, llm.KindNetwork,
		llm.KindStreamInterrupted, llm.KindUnavailable:
		return codes.Unavailable
	case llm.KindContextOverflow, llm.KindInvalidRequest, llm.KindContentFiltered:
		return codes.InvalidArgument
	case llm.KindAuth, llm.KindNotFound:
		return codes.FailedPrecondition
	case llm.KindCancelled:
		return codes.Canceled
	case llm.KindDeadlineExceeded:
		return codes.DeadlineExceeded
	case llm.KindToolsUnsafe:
		return codes.Aborted
	}
	return codes.Internal
}

// turnStatus returns the status that ends a RunTurn whose last event was
// the error e: the code for its class, ErrorInfo always, RetryInfo when it
// is retryable.
func turnStatus(e *runtime.TurnError) *status.Status {
	st := status.New(grpcCode(e.Kind), e.Message)
	info := &errdetails.ErrorInfo{Reason: e.Kind.String(), Domain: ErrorDomain, Metadata: map[string]string{}}
	if e.Model != "" {
		info.Metadata["model"] = e.Model
	}
	details := []protoadapt.MessageV1{info}
	if e.Retryable != nil && *e.Retryable {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(e.RetryAfter)})
	}
	return withDetails(st, details...)
}

// invalidArgument returns the status for a request that fails validation.
func invalidArgument(fe *runtime.FieldError) *status.Status {
	st := status.New(codes.InvalidArgument, fe.Error())
	return withDetails(st,
		&errdetails.ErrorInfo{Reason: llm.KindInvalidRequest.String(), Domain: ErrorDomain, Metadata: map[string]string{"field": fe.Field}},
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: fe.Field, Description: fe.Description}}},
	)
}

func withDetails(st *status.Status, details ...protoadapt.MessageV1) *status.Status {
	if s, err := st.WithDetails(details...); err == nil {
		return s
	}
	return st
}

// asFieldError reports whether err is a validation failure.
func asFieldError(err error) (*runtime.FieldError, bool) {
	var fe *runtime.FieldError
	return fe, errors.As(err, &fe)
}
