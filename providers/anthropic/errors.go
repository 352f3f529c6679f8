package anthropic

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/anthropics/anthropic-sdk-go"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/httpfail"
)

// apiError is an Anthropic error body:
// {"type":"error","error":{"type","message","details":{"error_code"}}}.
type apiError struct {
	Type      string
	Message   string
	ErrorCode string
}

func parseError(raw string) apiError {
	var env struct {
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
			Details struct {
				ErrorCode string `json:"error_code"`
			} `json:"details"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(raw), &env) != nil {
		return apiError{}
	}
	return apiError{Type: env.Error.Type, Message: env.Error.Message, ErrorCode: env.Error.Details.ErrorCode}
}

// typeKinds maps the error types Anthropic documents to their class.
var typeKinds = map[string]llm.Kind{
	"authentication_error": llm.KindAuth,
	"permission_error":     llm.KindAuth,
	"billing_error":        llm.KindQuotaExhausted,
	"not_found_error":      llm.KindNotFound,
	"request_too_large":    llm.KindContextOverflow,
	"rate_limit_error":     llm.KindRateLimited,
	"api_error":            llm.KindServerError,
	"timeout_error":        llm.KindServerError,
	"conflict_error":       llm.KindServerError,
	"overloaded_error":     llm.KindOverloaded,
}

// kindOf classifies an error of HTTP status code (200 for event: error
// mid-stream): a spend limit in details.error_code first, then a
// documented message fragment for invalid requests, then the error type,
// then the status.
func kindOf(code int, e apiError) llm.Kind {
	if strings.Contains(e.ErrorCode, "spend_limit") {
		return llm.KindQuotaExhausted
	}
	if e.Type == "invalid_request_error" || e.Type == "" && code >= 400 && code < 500 {
		if k, ok := httpfail.MatchFragment(httpfail.ScopeAnthropic, e.Message); ok {
			return k
		}
	}
	if k, ok := typeKinds[e.Type]; ok {
		return k
	}
	if e.Type == "invalid_request_error" {
		return llm.KindInvalidRequest
	}
	return httpfail.StatusKind(code)
}

// classify turns the error that ended a stream into a [*llm.Error]. resp
// is the HTTP response, nil when none arrived.
func (p *Provider) classify(err error, resp *http.Response) *llm.Error {
	// Err goes to logs: keep the key out of it too.
	err = httpfail.RedactErr(err, p.secrets...)
	var ae *anthropic.Error
	if !errors.As(err, &ae) {
		code, h := httpfail.Response(resp)
		return httpfail.Untyped(p.name, code, httpfail.RequestID(h), err)
	}
	body := parseError(ae.RawJSON())
	r := httpfail.Reported{Kind: kindOf(ae.StatusCode, body), Message: body.Message, StatusCode: ae.StatusCode, RequestID: ae.RequestID}
	if ae.Response != nil {
		r.Header = ae.Response.Header
	} else if resp != nil {
		r.Header = resp.Header
	}
	if httpfail.Waits(r.Kind, r.StatusCode) {
		r.RetryAfter = retryAfter(r.Header, time.Now())
	}
	return r.Error(p.name, p.secrets, err)
}

// retryAfter reads the wait a response asks for: retry-after-ms or
// retry-after, else the latest anthropic-ratelimit-*-reset time (RFC 3339)
// among the limits whose remaining count is 0.
func retryAfter(h http.Header, now time.Time) time.Duration {
	if d := httpfail.RetryAfter(h, now); d > 0 {
		return d
	}
	var longest time.Duration
	for _, limit := range []string{"requests", "tokens", "input-tokens", "output-tokens"} {
		prefix := "anthropic-ratelimit-" + limit + "-"
		if strings.TrimSpace(h.Get(prefix+"remaining")) != "0" {
			continue
		}
		reset, err := time.Parse(time.RFC3339, strings.TrimSpace(h.Get(prefix+"reset")))
		if err == nil && reset.Sub(now) > longest {
			longest = reset.Sub(now)
		}
	}
	return longest
}
