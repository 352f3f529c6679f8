package gemini

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
	"github.com/turnstile-dev/turnstile/runtime"
)

// TestHTTPFailures replays every Gemini row of provider-errors.md as a real
// response and checks the classification, and that each failure cost
// exactly one request.
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
			name: "429 per-minute quota with RetryInfo", status: 429, headers: map[string]string{"x-request-id": "req_g1"},
			body: `{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details.","status":"RESOURCE_EXHAUSTED","details":[
				{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_paid_tier_input_token_count","quotaId":"GenerateContentPaidTierInputTokensPerModelPerMinute","quotaDimensions":{"location":"global","model":"gemini-2.5-pro"},"quotaValue":"2000000"}]},
				{"@type":"type.googleapis.com/google.rpc.Help","links":[{"description":"Learn more","url":"https://ai.google.dev/gemini-api/docs/rate-limits"}]},
				{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"55s"}]}}`,
			want: runtime.Error{Kind: runtime.KindRateLimited, RequestID: "req_g1", RetryAfter: 55 * time.Second, Hint: runtime.HintAfter,
				Message: "You exceeded your current quota, please check your plan and billing details."},
		},
		{
			name: "429 fractional RetryInfo", status: 429,
			body: `{"error":{"code":429,"message":"Resource exhausted.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.5s"}]}}`,
			want: runtime.Error{Kind: runtime.KindRateLimited, RetryAfter: 1500 * time.Millisecond, Hint: runtime.HintAfter, Message: "Resource exhausted."},
		},
		{
			name: "429 per-day quota", status: 429,
			body: `{"error":{"code":429,"message":"You exceeded your current quota.","status":"RESOURCE_EXHAUSTED","details":[
				{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier","quotaValue":"250"}]},
				{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"20s"}]}}`,
			want: runtime.Error{Kind: runtime.KindQuotaExhausted, Message: "You exceeded your current quota."},
		},
		{
			name: "429 free tier limit 0", status: 429,
			body: `{"error":{"code":429,"message":"You exceeded your current quota. Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 0, model: gemini-2.5-pro","status":"RESOURCE_EXHAUSTED"}}`,
			want: runtime.Error{Kind: runtime.KindQuotaExhausted,
				Message: "You exceeded your current quota. Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 0, model: gemini-2.5-pro"},
		},
		{
			name: "503 UNAVAILABLE", status: 503,
			body: `{"error":{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}`,
			want: runtime.Error{Kind: runtime.KindOverloaded, Message: "The model is overloaded. Please try again later."},
		},
		{
			name: "500 INTERNAL", status: 500,
			body: `{"error":{"code":500,"message":"An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting","status":"INTERNAL"}}`,
			want: runtime.Error{Kind: runtime.KindServerError, Message: "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting"},
		},
		{
			name: "504 DEADLINE_EXCEEDED", status: 504,
			body: `{"error":{"code":504,"message":"Deadline expired before operation could complete.","status":"DEADLINE_EXCEEDED"}}`,
			want: runtime.Error{Kind: runtime.KindServerError, Message: "Deadline expired before operation could complete."},
		},
		{
			name: "400 input too long", status: 400,
			body: `{"error":{"code":400,"message":"The input token count (3475108) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}`,
			want: runtime.Error{Kind: runtime.KindContextOverflow, Message: "The input token count (3475108) exceeds the maximum number of tokens allowed (1048576)."},
		},
		{
			name: "400 API_KEY_INVALID, key redacted", status: 400,
			body: `{"error":{"code":400,"message":"API key not valid: ` + testKey + `. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID","domain":"googleapis.com","metadata":{"service":"generativelanguage.googleapis.com"}}]}}`,
			want: runtime.Error{Kind: runtime.KindAuth, Message: "API key not valid: [redacted]. Please pass a valid API key."},
		},
		{
			name: "400 FAILED_PRECONDITION", status: 400,
			body: `{"error":{"code":400,"message":"User location is not supported for the API use.","status":"FAILED_PRECONDITION"}}`,
			want: runtime.Error{Kind: runtime.KindAuth, Message: "User location is not supported for the API use."},
		},
		{
			name: "400 other INVALID_ARGUMENT", status: 400,
			body: `{"error":{"code":400,"message":"Invalid JSON payload received.","status":"INVALID_ARGUMENT"}}`,
			want: runtime.Error{Kind: runtime.KindInvalidRequest, Message: "Invalid JSON payload received."},
		},
		{
			name: "403 PERMISSION_DENIED", status: 403,
			body: `{"error":{"code":403,"message":"Method doesn't allow unregistered callers.","status":"PERMISSION_DENIED"}}`,
			want: runtime.Error{Kind: runtime.KindAuth, Message: "Method doesn't allow unregistered callers."},
		},
		{
			name: "404 NOT_FOUND", status: 404,
			body: `{"error":{"code":404,"message":"models/gemini-9 is not found for API version v1beta.","status":"NOT_FOUND"}}`,
			want: runtime.Error{Kind: runtime.KindNotFound, Message: "models/gemini-9 is not found for API version v1beta."},
		},
		{
			name: "502 HTML from a proxy", status: 502,
			body: "<html><body>Bad Gateway</body></html>",
			want: runtime.Error{Kind: runtime.KindServerError, Message: "HTTP 502 Bad Gateway"},
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
			want.Provider, want.StatusCode = "gm", tt.status
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
