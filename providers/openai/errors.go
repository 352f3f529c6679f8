package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/httpfail"
)

// apiError is an error body as OpenAI and compatible servers send it:
// {"error":{"message","type","code","param"}}, {"error":"text"} (Ollama),
// or a numeric code (llama.cpp, vLLM).
type apiError struct {
	Message string
	Type    string
	Code    string
}

// parseError reads an error body; fields it cannot find stay empty.
func parseError(body []byte) apiError {
	var env struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Code    json.RawMessage `json:"code"`
	}
	if json.Unmarshal(body, &env) != nil {
		return apiError{}
	}
	var text string
	if json.Unmarshal(env.Error, &text) == nil {
		return apiError{Message: text}
	}
	var obj struct {
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Code    json.RawMessage `json:"code"`
	}
	if json.Unmarshal(env.Error, &obj) == nil && (obj.Message != "" || obj.Type != "" || len(obj.Code) > 0) {
		return apiError{Message: obj.Message, Type: obj.Type, Code: codeString(obj.Code)}
	}
	return apiError{Message: env.Message, Type: env.Type, Code: codeString(env.Code)}
}

// codeString returns a code that is a JSON string or number as text.
func codeString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}

// quotaCodes are the codes and types of a spent quota or credit: waiting
// does not help.
var quotaCodes = map[string]bool{
	"insufficient_quota":                true,
	"credit_balance_exhausted":          true,
	"organization_usage_limit_exceeded": true,
	"billing_hard_limit_reached":        true,
}

// kindOf classifies an error body of a response with HTTP status code
// (200 for an error event mid-stream): by code and type first, then by a
// documented message fragment, then by status.
func kindOf(code int, e apiError) llm.Kind {
	switch {
	case quotaCodes[e.Code] || quotaCodes[e.Type] || strings.HasSuffix(e.Code, "_spend_limit_exceeded"):
		return llm.KindQuotaExhausted
	case e.Code == "context_length_exceeded" || e.Type == "exceed_context_size_error":
		return llm.KindContextOverflow
	case e.Code == "invalid_api_key" || e.Code == "unsupported_country_region_territory" || e.Type == "authentication_error":
		return llm.KindAuth
	case e.Code == "model_not_found":
		return llm.KindNotFound
	case e.Code == "content_policy_violation" || e.Code == "content_filter":
		return llm.KindContentFiltered
	case e.Code == "server_is_overloaded" || e.Type == "service_unavailable_error" || e.Type == "overloaded_error":
		return llm.KindOverloaded
	}
	if code >= 400 && code < 500 {
		if k, ok := httpfail.MatchFragment(httpfail.ScopeOpenAI, e.Message); ok {
			return k
		}
	}
	switch {
	case e.Code == "rate_limit_exceeded" || e.Code == "slow_down" || e.Type == "rate_limit_error":
		return llm.KindRateLimited
	case code >= 400:
		return httpfail.StatusKind(code)
	case e.Type == "invalid_request_error":
		return llm.KindInvalidRequest
	}
	return llm.KindServerError
}

// classify turns the error that ended a stream into a [*llm.Error]. resp
// is the HTTP response, nil when none arrived.
func (p *Provider) classify(err error, resp *http.Response) *llm.Error {
	// Err goes to logs: keep the key out of it too.
	err = httpfail.RedactErr(err, p.secrets...)
	var (
		se   *ssestream.StreamError
		ae   *openai.Error
		body apiError
	)
	code, h := httpfail.Response(resp)
	switch {
	case errors.As(err, &se):
		body = parseError(se.Event.Data)
		if body == (apiError{}) {
			body.Type = "server_error"
		}
	case errors.As(err, &ae):
		body = apiError{Message: ae.Message, Type: ae.Type, Code: ae.Code}
		code = ae.StatusCode
		if ae.Response != nil {
			h = ae.Response.Header
			if body == (apiError{}) {
				// No "error" object: vLLM's top-level error, or HTML.
				body = rereadError(ae.Response)
			}
		}
	case code >= 400:
		// A body the SDK could not read as its error type, such as
		// {"error":"text"}.
		body = rereadError(resp)
	default:
		return httpfail.Untyped(p.name, code, httpfail.RequestID(h), err)
	}
	r := httpfail.Reported{Kind: kindOf(code, body), Message: body.Message, StatusCode: code, Header: h}
	if httpfail.Waits(r.Kind, code) {
		r.RetryAfter = retryAfter(h)
	}
	return r.Error(p.name, p.secrets, err)
}

// rereadError parses the error body of resp, which the SDK read and put
// back, and puts it back again.
func rereadError(resp *http.Response) apiError {
	if resp.Body == nil {
		return apiError{}
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return parseError(b)
}

// retryAfter reads the wait a response asks for: retry-after-ms, then
// retry-after, then the longest of OpenAI's x-ratelimit-reset-requests and
// x-ratelimit-reset-tokens ("6m0s", "12ms").
func retryAfter(h http.Header) time.Duration {
	if d := httpfail.RetryAfter(h, time.Now()); d > 0 {
		return d
	}
	var longest time.Duration
	for _, key := range []string{"x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"} {
		v := strings.TrimSpace(h.Get(key))
		if v == "" {
			continue
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			if s, serr := strconv.ParseFloat(v, 64); serr == nil {
				d, err = time.Duration(s*float64(time.Second)), nil
			}
		}
		if err == nil && d > longest {
			longest = d
		}
	}
	return longest
}
