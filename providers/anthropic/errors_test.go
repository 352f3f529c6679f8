package anthropic

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
	"github.com/turnstile-dev/turnstile/runtime"
)

func body(typ, msg string) string {
	return `{"type":"error","error":{"type":"` + typ + `","message":"` + msg + `"},"request_id":"req_body"}`
}

// TestHTTPFailures replays every Anthropic row of provider-errors.md as a
// real response and checks the classification, and that each failure cost
// exactly one request.
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

func TestHTTPFailures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		status  int
		headers map[string]string
		body    string
		want    runtime.Error
	}{
		{
			name: "400 prompt is too long", status: 400, headers: map[string]string{"request-id": "req_1"},
			body: body("invalid_request_error", "prompt is too long: 205351 tokens > 200000 maximum"),
			want: runtime.Error{Kind: runtime.KindContextOverflow, RequestID: "req_1", Message: "prompt is too long: 205351 tokens > 200000 maximum"},
		},
		{
			name: "400 input and max_tokens exceed context limit", status: 400,
			body: body("invalid_request_error", "input length and `max_tokens` exceed context limit: 189136 + 20000 > 204648, decrease input length or `max_tokens` and try again"),
			want: runtime.Error{Kind: runtime.KindContextOverflow, Message: "input length and `max_tokens` exceed context limit: 189136 + 20000 > 204648, decrease input length or `max_tokens` and try again"},
		},
		{
			name: "400 credit balance too low", status: 400,
			body: body("invalid_request_error", "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."),
			want: runtime.Error{Kind: runtime.KindQuotaExhausted, Message: "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."},
		},
		{
			name: "400 other invalid request", status: 400,
			body: body("invalid_request_error", "messages: text content blocks must be non-empty"),
			want: runtime.Error{Kind: runtime.KindInvalidRequest, Message: "messages: text content blocks must be non-empty"},
		},
		{
			name: "401 authentication_error, key redacted", status: 401, headers: map[string]string{"x-should-retry": "false"},
			body: body("authentication_error", "invalid x-api-key "+testKey),
			want: runtime.Error{Kind: runtime.KindAuth, Hint: runtime.HintNever, Message: "invalid x-api-key [redacted]"},
		},
		{
			name: "402 billing_error", status: 402,
			body: body("billing_error", "Your account has a billing issue."),
			want: runtime.Error{Kind: runtime.KindQuotaExhausted, Message: "Your account has a billing issue."},
		},
		{
			name: "403 permission_error", status: 403,
			body: body("permission_error", "Your API key does not have permission to use the specified resource."),
			want: runtime.Error{Kind: runtime.KindAuth, Message: "Your API key does not have permission to use the specified resource."},
		},
		{
			name: "404 not_found_error", status: 404,
			body: body("not_found_error", "model: claude-nope"),
			want: runtime.Error{Kind: runtime.KindNotFound, Message: "model: claude-nope"},
		},
		{
			name: "413 request_too_large", status: 413,
			body: body("request_too_large", "Request exceeds the maximum allowed number of bytes."),
			want: runtime.Error{Kind: runtime.KindContextOverflow, Message: "Request exceeds the maximum allowed number of bytes."},
		},
		{
			name: "429 rate_limit_error with retry-after", status: 429,
			headers: map[string]string{"retry-after": "17", "x-should-retry": "true", "request-id": "req_429",
				"anthropic-ratelimit-tokens-reset": "2026-11-22T00:10:00Z"},
			body: body("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
			want: runtime.Error{Kind: runtime.KindRateLimited, RequestID: "req_429", RetryAfter: 17 * time.Second, Hint: runtime.HintAfter,
				Message: "Number of request tokens has exceeded your per-minute rate limit"},
		},
		{
			name: "429 enforced spend limit", status: 429,
			body: `{"type":"error","error":{"type":"rate_limit_error","message":"You have reached your specified workspace API usage limits.","details":{"error_code":"enforced_spend_limit_reached"}}}`,
			want: runtime.Error{Kind: runtime.KindQuotaExhausted, Message: "You have reached your specified workspace API usage limits."},
		},
		{
			name: "500 api_error", status: 500,
			body: body("api_error", "Internal server error"),
			want: runtime.Error{Kind: runtime.KindServerError, Message: "Internal server error"},
		},
		{
			name: "504 timeout_error", status: 504,
			body: body("timeout_error", "Request timed out"),
			want: runtime.Error{Kind: runtime.KindServerError, Message: "Request timed out"},
		},
		{
			name: "409 conflict_error", status: 409,
			body: body("conflict_error", "Conflict"),
			want: runtime.Error{Kind: runtime.KindServerError, Message: "Conflict"},
		},
		{
			name: "529 overloaded_error", status: 529, headers: map[string]string{"x-should-retry": "true"},
			body: body("overloaded_error", "Overloaded"),
			want: runtime.Error{Kind: runtime.KindOverloaded, Hint: runtime.HintBackoff, Message: "Overloaded"},
		},
		{
			name: "529 without a body", status: 529,
			want: runtime.Error{Kind: runtime.KindOverloaded, Message: "HTTP 529 Overloaded"},
		},
		{
			name: "502 HTML from the edge", status: 502,
			body: "<html><body>502 Bad Gateway</body></html>",
			want: runtime.Error{Kind: runtime.KindServerError, Message: "HTTP 502 Bad Gateway"},
		},
		{
			name: "503 with retry-after", status: 503, headers: map[string]string{"retry-after": "5"},
			body: "service unavailable",
			want: runtime.Error{Kind: runtime.KindOverloaded, RetryAfter: 5 * time.Second, Hint: runtime.HintAfter, Message: "HTTP 503 Service Unavailable"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
				for k, v := range tt.headers {
					w.Header().Set(k, v)
				}
				if tt.body != "" && tt.body[0] == '{' {
					w.Header().Set("Content-Type", "application/json")
				}
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.body))
			})
			chunks, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
			if len(chunks) != 0 {
				t.Errorf("chunks = %+v, want none", chunks)
			}
			e := providertest.AsError(t, err)
			want := tt.want
			want.Provider, want.StatusCode = "an", tt.status
			if diff := cmp.Diff(want, *e, cmpError); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if e.Err == nil {
				t.Error("Err is nil, want the SDK's error for logs")
			}
			if strings.Contains(e.Error(), testKey) {
				t.Errorf("the API key leaks into the error's text: %q", e.Error())
			}
			if n := f.Requests(); n != 1 {
				t.Errorf("requests = %d, want exactly 1 (SDK retries must be off)", n)
			}
		})
	}
}
