package anthropic

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/anthropics/anthropic-sdk-go"

	"github.com/turnstile-dev/turnstile/providers/internal/httpfail"
	"github.com/turnstile-dev/turnstile/runtime"
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
var typeKinds = map[string]runtime.Kind{
	"authentication_error": runtime.KindAuth,
	"permission_error":     runtime.KindAuth,
	"billing_error":        runtime.KindQuotaExhausted,
	"not_found_error":      runtime.KindNotFound,
	"request_too_large":    runtime.KindContextOverflow,
	"rate_limit_error":     runtime.KindRateLimited,
	"api_error":            runtime.KindServerError,
	"timeout_error":        runtime.KindServerError,
	"conflict_error":       runtime.KindServerError,
	"overloaded_error":     runtime.KindOverloaded,
}

// kindOf classifies an error of HTTP status code (200 for event: error
// mid-stream): a spend limit in details.error_code first, then a
// documented message fragment for invalid requests, then the error type,
// then the status.
func kindOf(code int, e apiError) runtime.Kind {
	if strings.Contains(e.ErrorCode, "spend_limit") {
		return runtime.KindQuotaExhausted
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
		return runtime.KindInvalidRequest
	}
	return httpfail.StatusKind(code)
}

// classify turns the error that ended a stream into a [*runtime.Error], or
// returns the caller's context error when ctx is done.
func (p *Provider) classify(ctx context.Context, err error, resp *http.Response) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	// Err goes to logs: keep the key out of it too.
	err = httpfail.RedactErr(err, p.apiKey)
	var (
		ae   *anthropic.Error
		code int
		h    http.Header
	)
	if resp != nil {
		code, h = resp.StatusCode, resp.Header
	}
	if !errors.As(err, &ae) {
		e := &runtime.Error{Provider: p.name, StatusCode: code, RequestID: httpfail.RequestID(h), Err: err}
		if k, ok := httpfail.Network(err); ok {
			e.Kind, e.Message = k, httpfail.NetworkMessage(k, err)
			return e
		}
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		if errors.As(err, &syn) || errors.As(err, &typ) {
			e.Kind, e.Message = runtime.KindServerError, "the provider sent a malformed stream event"
			return e
		}
		e.Kind, e.Message = runtime.KindInternal, "unexpected failure calling the provider"
		return e
	}
	code = ae.StatusCode
	if ae.Response != nil {
		h = ae.Response.Header
	}
	body := parseError(ae.RawJSON())
	kind := kindOf(code, body)
	var after time.Duration
	if kind == runtime.KindRateLimited || kind == runtime.KindOverloaded || code == http.StatusTooManyRequests || code >= 500 {
		after = retryAfter(h, time.Now())
	}
	msg := httpfail.Redact(body.Message, p.apiKey)
	if msg == "" {
		if code >= 400 {
			msg = httpfail.StatusMessage(code)
		} else {
			msg = "the provider reported an error while streaming"
		}
	}
	id := ae.RequestID
	if id == "" {
		id = httpfail.RequestID(h)
	}
	return &runtime.Error{
		Kind:       kind,
		Message:    msg,
		Provider:   p.name,
		StatusCode: code,
		RequestID:  id,
		RetryAfter: after,
		Hint:       httpfail.Hint(h, after),
		Err:        err,
	}
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
