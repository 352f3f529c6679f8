package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/admission"
	"github.com/turnstile-dev/turnstile/server/wire"
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
	case llm.KindRateLimited, llm.KindQuotaExhausted, llm.KindBudgetExhausted, llm.KindStoreFull:
		return codes.ResourceExhausted
	case llm.KindOverloaded, llm.KindServerError, llm.KindTimeout, llm.KindNetwork,
		llm.KindStreamInterrupted, llm.KindUnavailable:
		return codes.Unavailable
	case llm.KindContextOverflow, llm.KindInvalidRequest, llm.KindContentFiltered, llm.KindOutputInvalid:
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
	st := status.New(grpcCode(e.Kind), wire.Clip(e.Message, wire.MaxMessageBytes))
	info := errorInfo(codeReason(wire.ErrorCode(e.Kind)), nil)
	if e.Model != "" {
		info.Metadata["model"] = e.Model
	}
	details := []protoadapt.MessageV1{info}
	if e.Retryable != nil && *e.Retryable {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(e.RetryAfter)})
	}
	return withDetails(st, details...)
}

// Reasons of the statuses the server gives before a turn starts.
var (
	reasonInvalidRequest   = codeReason(turnstilev1.ErrorCode_ERROR_CODE_INVALID_REQUEST)
	reasonUnauthenticated  = codeReason(turnstilev1.ErrorCode_ERROR_CODE_UNAUTHENTICATED)
	reasonPermissionDenied = codeReason(turnstilev1.ErrorCode_ERROR_CODE_PERMISSION_DENIED)
	reasonLimitExceeded    = codeReason(turnstilev1.ErrorCode_ERROR_CODE_LIMIT_EXCEEDED)
	reasonRequestTooLarge  = codeReason(turnstilev1.ErrorCode_ERROR_CODE_REQUEST_TOO_LARGE)
)

// A reason is an ErrorCode's name without its prefix: clients map a status
// to its code by name (docs/contract.md), so every reason the server sends
// is made by codeReason from a code, never written by hand.
type reason string

func codeReason(c turnstilev1.ErrorCode) reason {
	return reason(strings.TrimPrefix(c.String(), "ERROR_CODE_"))
}

// errorInfo returns the ErrorInfo of r in turnstile's domain.
func errorInfo(r reason, metadata map[string]string) *errdetails.ErrorInfo {
	if metadata == nil {
		metadata = map[string]string{}
	}
	return &errdetails.ErrorInfo{Reason: string(r), Domain: ErrorDomain, Metadata: metadata}
}

// invalidArgument returns the status for a request that fails validation:
// every violation in one BadRequest, the first in the message.
func invalidArgument(vs []*runtime.FieldError) *status.Status {
	msg := vs[0].Error()
	if len(vs) > 1 {
		msg += fmt.Sprintf(" (and %d more problems; see the BadRequest details)", len(vs)-1)
	}
	br := &errdetails.BadRequest{}
	for _, v := range vs {
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: v.Field, Description: v.Description})
	}
	return withDetails(status.New(codes.InvalidArgument, msg),
		errorInfo(reasonInvalidRequest, map[string]string{"field": vs[0].Field, "violations": strconv.Itoa(len(vs))}), br)
}

// unauthenticated returns the status of a request without a valid key.
func unauthenticated(msg string) *status.Status {
	return withDetails(status.New(codes.Unauthenticated, msg), errorInfo(reasonUnauthenticated, nil))
}

// permissionDenied returns the status of a request for a model its key
// may not use.
func permissionDenied(msg string, metadata map[string]string) *status.Status {
	return withDetails(status.New(codes.PermissionDenied, msg), errorInfo(reasonPermissionDenied, metadata))
}

// limitExceeded returns the status of a turn refused by a limit: with
// RetryInfo when waiting retryAfter may help, without when it never will.
func limitExceeded(msg string, retryAfter time.Duration, metadata map[string]string) *status.Status {
	return refused(reasonLimitExceeded, msg, retryAfter, metadata)
}

// refused returns the status RESOURCE_EXHAUSTED of a turn refused for
// reason (a budget spent, say), with RetryInfo when waiting helps.
func refused(r reason, msg string, retryAfter time.Duration, metadata map[string]string) *status.Status {
	details := []protoadapt.MessageV1{errorInfo(r, metadata)}
	if retryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)})
	}
	return withDetails(status.New(codes.ResourceExhausted, msg), details...)
}

// requestTooLarge returns the status of a request over maxBytes, the
// server's max_request_bytes: RESOURCE_EXHAUSTED, without RetryInfo (the
// same request will never fit), with the limit in ErrorInfo's metadata.
func requestTooLarge(maxBytes int) *status.Status {
	return withDetails(status.Newf(codes.ResourceExhausted, "the request is larger than the server accepts (server.max_request_bytes: %d bytes)", maxBytes),
		errorInfo(reasonRequestTooLarge, map[string]string{"limit": "max_request_bytes", "max_bytes": strconv.Itoa(maxBytes)}))
}

func withDetails(st *status.Status, details ...protoadapt.MessageV1) *status.Status {
	if s, err := st.WithDetails(details...); err == nil {
		return s
	}
	return st
}

// refusalStatus returns the status of a turn refused by admission: err is
// an *admission.Refusal (any other error is INTERNAL), client the caller's
// key name ("" without keys). RESOURCE_EXHAUSTED, with ErrorInfo
// LIMIT_EXCEEDED or BUDGET_EXHAUSTED naming the limit (and the key), and
// RetryInfo when waiting helps.
func refusalStatus(err error, client string) *status.Status {
	var r *admission.Refusal
	if !errors.As(err, &r) {
		return status.New(codes.Internal, "internal error")
	}
	md := map[string]string{"limit": r.Limit}
	if client != "" {
		md["client"] = client
	}
	rs := reasonLimitExceeded
	if r.Reason != "" {
		// admission's BUDGET_EXHAUSTED, llm.KindBudgetExhausted's name,
		// which TestKindMapping holds to be an ErrorCode's.
		rs = reason(r.Reason)
	}
	return refused(rs, r.Message, r.RetryAfter, md)
}

// refuse counts a turn refused by admission (err, an *admission.Refusal)
// for client key client, and returns its status: see [refusalStatus].
func (s *service) refuse(err error, client string) *status.Status {
	var r *admission.Refusal
	if errors.As(err, &r) {
		s.refusals.Add(context.Background(), 1, metric.WithAttributes(
			attribute.String("turnstile.limit", r.Limit), attribute.String("turnstile.client", client)))
	}
	return refusalStatus(err, client)
}

// modelStatus returns the status of a request whose model its key may
// not use (PERMISSION_DENIED), or that the server does not know
// (INVALID_ARGUMENT naming the model field, with the models the key may
// use).
func modelStatus(e *admission.ModelError) *status.Status {
	if !e.Known {
		return invalidArgument([]*runtime.FieldError{{Field: "model",
			Description: fmt.Sprintf("unknown model %s; this client key may use: %s", wire.Quote(e.Model), strings.Join(e.Allowed, ", "))}})
	}
	return permissionDenied(fmt.Sprintf("client key %q may not use model %s", e.Client, wire.Quote(e.Model)),
		map[string]string{"model": e.Model, "client": e.Client})
}
