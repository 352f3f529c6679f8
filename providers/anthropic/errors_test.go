package anthropic

import (
	"net/http"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

func body(typ, msg string) string {
	return `{"type":"error","error":{"type":"` + typ + `","message":"` + msg + `"},"request_id":"req_body"}`
}

func TestRetryAfterFromRateLimitReset(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	h := http.Header{}
	h.Set("anthropic-ratelimit-requests-remaining", "12")
	h.Set("anthropic-ratelimit-requests-reset", now.Add(time.Hour).Format(time.RFC3339))
	h.Set("anthropic-ratelimit-input-tokens-remaining", "0")
	h.Set("anthropic-ratelimit-input-tokens-reset", now.Add(30*time.Second).Format(time.RFC3339))
	if got := retryAfter(h, now); got != 30*time.Second {
		t.Errorf("retryAfter = %v, want 30s (the exhausted limit's reset)", got)
	}
	h.Set("retry-after", "7")
	if got := retryAfter(h, now); got != 7*time.Second {
		t.Errorf("retryAfter = %v, want retry-after's 7s", got)
	}
}

// TestHTTPFailures replays every Anthropic row of provider-errors.md as a
// real response and checks the classification, and that each failure cost
// exactly one request.
func TestHTTPFailures(t *testing.T) {
	t.Parallel()
	cases := []providertest.HTTPFailure{
		{
			Name: "400 prompt is too long", Status: 400, Headers: map[string]string{"request-id": "req_1"},
			Body: body("invalid_request_error", "prompt is too long: 205351 tokens > 200000 maximum"),
			Want: llm.Error{Kind: llm.KindContextOverflow, RequestID: "req_1", Message: "prompt is too long: 205351 tokens > 200000 maximum"},
		},
		{
			Name: "400 input and max_tokens exceed context limit", Status: 400,
			Body: body("invalid_request_error", "input length and `max_tokens` exceed context limit: 189136 + 20000 > 204648, decrease input length or `max_tokens` and try again"),
			Want: llm.Error{Kind: llm.KindContextOverflow, Message: "input length and `max_tokens` exceed context limit: 189136 + 20000 > 204648, decrease input length or `max_tokens` and try again"},
		},
		{
			Name: "400 credit balance too low", Status: 400,
			Body: body("invalid_request_error", "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."),
			Want: llm.Error{Kind: llm.KindQuotaExhausted, Message: "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."},
		},
		{
			Name: "400 other invalid request", Status: 400,
			Body: body("invalid_request_error", "messages: text content blocks must be non-empty"),
			Want: llm.Error{Kind: llm.KindInvalidRequest, Message: "messages: text content blocks must be non-empty"},
		},
		{
			Name: "401 authentication_error, key redacted", Status: 401, Headers: map[string]string{"x-should-retry": "false"},
			Body: body("authentication_error", "invalid x-api-key "+testKey),
			Want: llm.Error{Kind: llm.KindAuth, Hint: llm.HintNever, Message: "invalid x-api-key [redacted]"},
		},
		{
			Name: "402 billing_error", Status: 402,
			Body: body("billing_error", "Your account has a billing issue."),
			Want: llm.Error{Kind: llm.KindQuotaExhausted, Message: "Your account has a billing issue."},
		},
		{
			Name: "403 permission_error", Status: 403,
			Body: body("permission_error", "Your API key does not have permission to use the specified resource."),
			Want: llm.Error{Kind: llm.KindAuth, Message: "Your API key does not have permission to use the specified resource."},
		},
		{
			Name: "404 not_found_error", Status: 404,
			Body: body("not_found_error", "model: claude-nope"),
			Want: llm.Error{Kind: llm.KindNotFound, Message: "model: claude-nope"},
		},
		{
			Name: "413 request_too_large", Status: 413,
			Body: body("request_too_large", "Request exceeds the maximum allowed number of bytes."),
			Want: llm.Error{Kind: llm.KindContextOverflow, Message: "Request exceeds the maximum allowed number of bytes."},
		},
		{
			Name: "429 rate_limit_error with retry-after", Status: 429,
			Headers: map[string]string{"retry-after": "17", "x-should-retry": "true", "request-id": "req_429",
				"anthropic-ratelimit-tokens-reset": "2026-11-22T00:10:00Z"},
			Body: body("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
			Want: llm.Error{Kind: llm.KindRateLimited, RequestID: "req_429", RetryAfter: 17 * time.Second, Hint: llm.HintAfter,
				Message: "Number of request tokens has exceeded your per-minute rate limit"},
		},
		{
			Name: "429 enforced spend limit", Status: 429,
			Body: `{"type":"error","error":{"type":"rate_limit_error","message":"You have reached your specified workspace API usage limits.","details":{"error_code":"enforced_spend_limit_reached"}}}`,
			Want: llm.Error{Kind: llm.KindQuotaExhausted, Message: "You have reached your specified workspace API usage limits."},
		},
		{
			Name: "500 api_error", Status: 500,
			Body: body("api_error", "Internal server error"),
			Want: llm.Error{Kind: llm.KindServerError, Message: "Internal server error"},
		},
		{
			Name: "504 timeout_error", Status: 504,
			Body: body("timeout_error", "Request timed out"),
			Want: llm.Error{Kind: llm.KindServerError, Message: "Request timed out"},
		},
		{
			Name: "409 conflict_error", Status: 409,
			Body: body("conflict_error", "Conflict"),
			Want: llm.Error{Kind: llm.KindServerError, Message: "Conflict"},
		},
		{
			Name: "529 overloaded_error", Status: 529, Headers: map[string]string{"x-should-retry": "true"},
			Body: body("overloaded_error", "Overloaded"),
			Want: llm.Error{Kind: llm.KindOverloaded, Hint: llm.HintBackoff, Message: "Overloaded"},
		},
		{
			Name: "529 without a body", Status: 529,
			Want: llm.Error{Kind: llm.KindOverloaded, Message: "HTTP 529 Overloaded"},
		},
		{
			Name: "502 HTML from the edge", Status: 502,
			Body: "<html><body>502 Bad Gateway</body></html>",
			Want: llm.Error{Kind: llm.KindServerError, Message: "HTTP 502 Bad Gateway"},
		},
		{
			Name: "503 with retry-after", Status: 503, Headers: map[string]string{"retry-after": "5"},
			Body: "service unavailable",
			Want: llm.Error{Kind: llm.KindOverloaded, RetryAfter: 5 * time.Second, Hint: llm.HintAfter, Message: "HTTP 503 Service Unavailable"},
		},
	}
	providertest.HTTPFailures(t, provider, simpleRequest, "an", testKey, cases)
}
