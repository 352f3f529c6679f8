package gemini

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"google.golang.org/genai"

	"github.com/turnstile-dev/turnstile/providers/internal/httpfail"
	"github.com/turnstile-dev/turnstile/runtime"
)

// The google.rpc detail types the classification reads.
const (
	typeRetryInfo    = "type.googleapis.com/google.rpc.RetryInfo"
	typeQuotaFailure = "type.googleapis.com/google.rpc.QuotaFailure"
	typeErrorInfo    = "type.googleapis.com/google.rpc.ErrorInfo"
)

// classify turns a failed call into a classified error. h holds the
// response's headers when there was a response.
func (p *Provider) classify(err error, h http.Header, output bool) *runtime.Error {
	var api genai.APIError
	var apip *genai.APIError
	switch {
	case errors.As(err, &api):
	case errors.As(err, &apip):
		api = *apip
	default:
		if k, ok := httpfail.Network(err); ok {
			e := &runtime.Error{Kind: k, Provider: p.name, Message: httpfail.NetworkMessage(k, err), RequestID: httpfail.RequestID(h), Err: err}
			if output && k == runtime.KindNetwork {
				e.Kind = runtime.KindStreamInterrupted
			}
			return e
		}
		// A malformed stream (bytes that are not the API's framing).
		return &runtime.Error{
			Kind: runtime.KindServerError, Provider: p.name, RequestID: httpfail.RequestID(h),
			Message: "the provider sent a response that could not be read", Err: errors.New(httpfail.Redact(err.Error(), p.apiKey)),
		}
	}
	if !canonical(api.Status) {
		// Not a google.rpc status but a bare HTTP error, such as a proxy's
		// HTML page: its body is no message for a person.
		api.Status, api.Message = "", ""
	}
	e := &runtime.Error{
		Kind:       classifyAPI(api),
		Provider:   p.name,
		StatusCode: api.Code,
		Message:    httpfail.Redact(api.Message, p.apiKey),
		RequestID:  httpfail.RequestID(h),
		Err:        errors.New(httpfail.Redact(api.Error(), p.apiKey)),
	}
	if e.Message == "" {
		e.Message = httpfail.StatusMessage(api.Code)
	}
	if d, ok := retryDelay(api.Details); ok {
		e.RetryAfter = d
	} else {
		e.RetryAfter = httpfail.RetryAfter(h, time.Now())
	}
	e.Hint = httpfail.Hint(h, e.RetryAfter)
	return e
}

// classifyAPI classifies a google.rpc status from its canonical status name
// and details first, its HTTP code last.
func classifyAPI(api genai.APIError) runtime.Kind {
	switch api.Status {
	case "RESOURCE_EXHAUSTED":
		if dailyQuota(api.Details) {
			return runtime.KindQuotaExhausted
		}
		if k, ok := httpfail.MatchFragment(httpfail.ScopeGemini, api.Message); ok {
			return k
		}
		return runtime.KindRateLimited
	case "UNAVAILABLE":
		return runtime.KindOverloaded
	case "INTERNAL", "DEADLINE_EXCEEDED", "UNKNOWN", "ABORTED":
		return runtime.KindServerError
	case "INVALID_ARGUMENT":
		if reason(api.Details) == "API_KEY_INVALID" {
			return runtime.KindAuth
		}
		if k, ok := httpfail.MatchFragment(httpfail.ScopeGemini, api.Message); ok {
			return k
		}
		return runtime.KindInvalidRequest
	case "FAILED_PRECONDITION", "PERMISSION_DENIED", "UNAUTHENTICATED":
		// Failed precondition: billing not enabled, region not served; a
		// problem of this account with this model, as auth is.
		return runtime.KindAuth
	case "NOT_FOUND":
		return runtime.KindNotFound
	}
	if api.Code == 0 {
		return runtime.KindServerError
	}
	return httpfail.StatusKind(api.Code)
}

// retryDelay returns the RetryInfo delay among the details.
func retryDelay(details []map[string]any) (time.Duration, bool) {
	for _, d := range details {
		if d["@type"] != typeRetryInfo {
			continue
		}
		if s, ok := d["retryDelay"].(string); ok {
			return httpfail.ParseDuration(s)
		}
	}
	return 0, false
}

// dailyQuota reports a QuotaFailure whose violated quota resets daily:
// waiting minutes does not help.
func dailyQuota(details []map[string]any) bool {
	for _, d := range details {
		if d["@type"] != typeQuotaFailure {
			continue
		}
		vs, _ := d["violations"].([]any)
		for _, v := range vs {
			m, _ := v.(map[string]any)
			id, _ := m["quotaId"].(string)
			if strings.Contains(id, "PerDay") {
				return true
			}
		}
	}
	return false
}

// reason returns the ErrorInfo reason among the details.
func reason(details []map[string]any) string {
	for _, d := range details {
		if d["@type"] == typeErrorInfo {
			r, _ := d["reason"].(string)
			return r
		}
	}
	return ""
}

// canonical reports whether s looks like a google.rpc canonical status name
// such as RESOURCE_EXHAUSTED, as opposed to an HTTP status line.
func canonical(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if (r < 'A' || r > 'Z') && r != '_' {
			return false
		}
	}
	return true
}
