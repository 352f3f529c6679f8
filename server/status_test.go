package server

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/wire"
)

func TestKindMapping(t *testing.T) {
	t.Parallel()
	tests := []struct {
		kind llm.Kind
		code codes.Code
	}{
		{llm.KindInternal, codes.Internal},
		{llm.KindRateLimited, codes.ResourceExhausted},
		{llm.KindQuotaExhausted, codes.ResourceExhausted},
		{llm.KindOverloaded, codes.Unavailable},
		{llm.KindServerError, codes.Unavailable},
		{llm.KindTimeout, codes.Unavailable},
		{llm.KindNetwork, codes.Unavailable},
		{llm.KindStreamInterrupted, codes.Unavailable},
		{llm.KindContextOverflow, codes.InvalidArgument},
		{llm.KindInvalidRequest, codes.InvalidArgument},
		{llm.KindAuth, codes.FailedPrecondition},
		{llm.KindNotFound, codes.FailedPrecondition},
		{llm.KindContentFiltered, codes.InvalidArgument},
		{llm.KindCancelled, codes.Canceled},
		{llm.KindDeadlineExceeded, codes.DeadlineExceeded},
		{llm.KindUnavailable, codes.Unavailable},
		{llm.KindToolsUnsafe, codes.Aborted},
		{llm.KindOutputInvalid, codes.InvalidArgument},
		{llm.KindBudgetExhausted, codes.ResourceExhausted},
	}
	for _, tt := range tests {
		t.Run(tt.kind.String(), func(t *testing.T) {
			if got := grpcCode(tt.kind); got != tt.code {
				t.Errorf("grpcCode(%v) = %v, want %v", tt.kind, got, tt.code)
			}
			// Every kind has its own wire code, named alike.
			if got := wire.ErrorCode(tt.kind).String(); got != "ERROR_CODE_"+tt.kind.String() {
				t.Errorf("errorCode(%v) = %v", tt.kind, got)
			}
		})
	}
	// The codes of refusals before a turn starts are the server's own.
	refusals := []reason{reasonUnauthenticated, reasonPermissionDenied, reasonLimitExceeded, reasonRequestTooLarge, reason(ReasonStoreFull), reason(ReasonTurnIDReused)}
	for _, r := range refusals {
		if _, ok := turnstilev1.ErrorCode_value["ERROR_CODE_"+string(r)]; !ok {
			t.Errorf("reason %s is no error code", r)
		}
	}
	if n := len(turnstilev1.ErrorCode_name); n != len(tests)+len(refusals)+1 {
		t.Errorf("the proto has %d error codes, the table %d kinds and %d refusals (+UNSPECIFIED)", n, len(tests), len(refusals))
	}
}

func TestTurnStatusDetails(t *testing.T) {
	t.Parallel()
	yes, no := true, false
	tests := []struct {
		name      string
		err       runtime.TurnError
		wantRetry bool
	}{
		{"retryable carries RetryInfo", runtime.TurnError{Kind: llm.KindRateLimited, Message: "slow down", Retryable: &yes, RetryAfter: 3 * time.Second, Model: "fast"}, true},
		{"permanent carries none", runtime.TurnError{Kind: llm.KindAuth, Message: "bad key", Retryable: &no}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := turnStatus(&tt.err)
			var info *errdetails.ErrorInfo
			var retry *errdetails.RetryInfo
			for _, d := range st.Details() {
				switch d := d.(type) {
				case *errdetails.ErrorInfo:
					info = d
				case *errdetails.RetryInfo:
					retry = d
				}
			}
			if info.GetReason() != tt.err.Kind.String() || info.GetDomain() != ErrorDomain || info.GetMetadata()["model"] != tt.err.Model {
				t.Errorf("ErrorInfo = %v", info)
			}
			if (retry != nil) != tt.wantRetry {
				t.Fatalf("RetryInfo = %v", retry)
			}
			if retry != nil && retry.GetRetryDelay().AsDuration() != tt.err.RetryAfter {
				t.Errorf("retry delay = %v", retry.GetRetryDelay().AsDuration())
			}
		})
	}
}

func TestEnumsMatchTheWire(t *testing.T) {
	t.Parallel()
	for r := llm.RoleUser; r <= llm.RoleTool; r++ {
		if got := turnstilev1.Role(r).String(); got != "ROLE_"+strings.ToUpper(r.String()) {
			t.Errorf("role %v maps to %v", r, got)
		}
	}
	for s := llm.StopEndTurn; s <= llm.StopPauseTurn; s++ {
		if got := turnstilev1.StopReason(s).String(); got != "STOP_REASON_"+strings.ToUpper(s.String()) {
			t.Errorf("stop %v maps to %v", s, got)
		}
	}
	for e := runtime.EndTurn; e <= runtime.EndStopSequence; e++ {
		if got := turnstilev1.EndReason(e).String(); got != "END_REASON_"+strings.ToUpper(e.String()) {
			t.Errorf("end reason %v maps to %v", e, got)
		}
	}
}
