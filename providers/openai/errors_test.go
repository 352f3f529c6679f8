package openai

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
	"github.com/turnstile-dev/turnstile/runtime"
)

// TestHTTPFailures replays every OpenAI row of provider-errors.md (and the
// compatible servers' rows) as a real response and checks the
// classification, and that each failure cost exactly one request.
func TestHTTPFailures(t *testing.T) {
	t.Parallel()
	date := time.Now().Add(2 * time.Minute).UTC().Format(http.TimeFormat)
	tests := []struct {
		name    string
		status  int
		headers map[string]string
		body    string
		want    runtime.Error // Provider, StatusCode and Err are filled in or ignored
		// minAfter, when set, checks RetryAfter loosely (HTTP dates).
		minAfter time.Duration
	}{
		{
			name: "429 rate limit with retry-after-ms", status: 429,
			headers: map[string]string{"retry-after-ms": "644", "retry-after": "1", "x-request-id": "req_1", "x-should-retry": "true"},
			body:    `{"error":{"message":"Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Used 30000, Requested 100. Please try again in 644ms.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`,
			want: runtime.Error{Kind: runtime.KindRateLimited, RequestID: "req_1", RetryAfter: 644 * time.Millisecond, Hint: runtime.HintAfter,
				Message: "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Used 30000, Requested 100. Please try again in 644ms."},
		},
		{
			name: "429 rate limit with retry-after seconds", status: 429,
			headers: map[string]string{"retry-after": "20"},
			body:    `{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}`,
			want:    runtime.Error{Kind: runtime.KindRateLimited, RetryAfter: 20 * time.Second, Hint: runtime.HintAfter, Message: "Rate limit reached"},
		},
		{
			name: "429 rate limit with retry-after date", status: 429,
			headers:  map[string]string{"retry-after": date},
			body:     `{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}`,
			want:     runtime.Error{Kind: runtime.KindRateLimited, Hint: runtime.HintAfter, Message: "Rate limit reached"},
			minAfter: time.Minute,
		},
		{
			name: "429 rate limit with x-ratelimit-reset only", status: 429,
			headers: map[string]string{"x-ratelimit-reset-requests": "12ms", "x-ratelimit-reset-tokens": "6m0s"},
			body:    `{"error":{"message":"Rate limit reached","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`,
			want:    runtime.Error{Kind: runtime.KindRateLimited, RetryAfter: 6 * time.Minute, Hint: runtime.HintAfter, Message: "Rate limit reached"},
		},
		{
			name: "429 request too large", status: 429,
			body: `{"error":{"message":"Request too large for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Requested 45000. The input or output tokens must be reduced in order to run successfully.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`,
			want: runtime.Error{Kind: runtime.KindContextOverflow,
				Message: "Request too large for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Requested 45000. The input or output tokens must be reduced in order to run successfully."},
		},
		{
			name: "429 insufficient_quota", status: 429,
			headers: map[string]string{"x-should-retry": "false", "x-request-id": "req_q"},
			body:    `{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`,
			want: runtime.Error{Kind: runtime.KindQuotaExhausted, RequestID: "req_q", Hint: runtime.HintNever,
				Message: "You exceeded your current quota, please check your plan and billing details."},
		},
		{
			name: "429 insufficient_quota, older body with code null", status: 429,
			body: `{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","param":null,"code":null}}`,
			want: runtime.Error{Kind: runtime.KindQuotaExhausted, Message: "You exceeded your current quota."},
		},
		{
			name: "429 credit_balance_exhausted", status: 429,
			body: `{"error":{"message":"Your credit balance is exhausted.","type":"insufficient_quota","param":null,"code":"credit_balance_exhausted"}}`,
			want: runtime.Error{Kind: runtime.KindQuotaExhausted, Message: "Your credit balance is exhausted."},
		},
		{
			name: "429 spend limit", status: 429,
			body: `{"error":{"message":"Monthly spend limit reached.","type":"invalid_request_error","param":null,"code":"monthly_spend_limit_exceeded"}}`,
			want: runtime.Error{Kind: runtime.KindQuotaExhausted, Message: "Monthly spend limit reached."},
		},
		{
			name: "429 organization usage limit", status: 429,
			body: `{"error":{"message":"Usage limit reached.","type":"invalid_request_error","param":null,"code":"organization_usage_limit_exceeded"}}`,
			want: runtime.Error{Kind: runtime.KindQuotaExhausted, Message: "Usage limit reached."},
		},
		{
			name: "429 slow_down", status: 429,
			headers: map[string]string{"retry-after": "2"},
			body:    `{"error":{"message":"Please slow down.","type":"rate_limit_error","param":null,"code":"slow_down"}}`,
			want:    runtime.Error{Kind: runtime.KindRateLimited, RetryAfter: 2 * time.Second, Hint: runtime.HintAfter, Message: "Please slow down."},
		},
		{
			name: "500 server_error", status: 500,
			headers: map[string]string{"x-request-id": "req_500"},
			body:    `{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}`,
			want: runtime.Error{Kind: runtime.KindServerError, RequestID: "req_500",
				Message: "The server had an error while processing your request. Sorry about that!"},
		},
		{
			name: "502 HTML from a proxy", status: 502,
			body: "<html><head><title>502 Bad Gateway</title></head><body>cloudflare</body></html>",
			want: runtime.Error{Kind: runtime.KindServerError, Message: "HTTP 502 Bad Gateway"},
		},
		{
			name: "503 service_unavailable_error", status: 503,
			body: `{"error":{"message":"The engine is currently overloaded, please try again later","type":"service_unavailable_error","param":null,"code":null}}`,
			want: runtime.Error{Kind: runtime.KindOverloaded, Message: "The engine is currently overloaded, please try again later"},
		},
		{
			name: "503 server_is_overloaded with retry-after", status: 503,
			headers: map[string]string{"retry-after": "3"},
			body:    `{"error":{"message":"Overloaded","type":"server_error","param":null,"code":"server_is_overloaded"}}`,
			want:    runtime.Error{Kind: runtime.KindOverloaded, RetryAfter: 3 * time.Second, Hint: runtime.HintAfter, Message: "Overloaded"},
		},
		{
			name: "504 empty body", status: 504,
			want: runtime.Error{Kind: runtime.KindServerError, Message: "HTTP 504 Gateway Timeout"},
		},
		{
			name: "400 context_length_exceeded", status: 400,
			body: `{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 204308 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`,
			want: runtime.Error{Kind: runtime.KindContextOverflow,
				Message: "This model's maximum context length is 128000 tokens. However, your messages resulted in 204308 tokens. Please reduce the length of the messages."},
		},
		{
			name: "401 invalid_api_key, key redacted", status: 401,
			body: `{"error":{"message":"Incorrect API key provided: ` + testKey + `. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`,
			want: runtime.Error{Kind: runtime.KindAuth,
				Message: "Incorrect API key provided: [redacted]. You can find your API key at https://platform.openai.com/account/api-keys."},
		},
		{
			name: "403 unsupported region", status: 403,
			body: `{"error":{"message":"Country, region, or territory not supported","type":"request_forbidden","param":null,"code":"unsupported_country_region_territory"}}`,
			want: runtime.Error{Kind: runtime.KindAuth, Message: "Country, region, or territory not supported"},
		},
		{
			name: "404 model_not_found", status: 404,
			body: `{"error":{"message":"The model ` + "`gpt-5-nope`" + ` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}`,
			want: runtime.Error{Kind: runtime.KindNotFound, Message: "The model `gpt-5-nope` does not exist or you do not have access to it."},
		},
		{
			name: "400 other invalid_request_error", status: 400,
			body: `{"error":{"message":"Invalid type for 'temperature': expected a decimal.","type":"invalid_request_error","param":"temperature","code":"invalid_type"}}`,
			want: runtime.Error{Kind: runtime.KindInvalidRequest, Message: "Invalid type for 'temperature': expected a decimal."},
		},
		{
			name: "400 content policy", status: 400,
			body: `{"error":{"message":"Your request was rejected as a result of our safety system.","type":"invalid_request_error","param":null,"code":"content_policy_violation"}}`,
			want: runtime.Error{Kind: runtime.KindContentFiltered, Message: "Your request was rejected as a result of our safety system."},
		},
		{
			name: "vLLM 400 context, numeric code", status: 400,
			body: `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens. Please reduce the length of the input messages.","type":"BadRequestError","param":null,"code":400}`,
			want: runtime.Error{Kind: runtime.KindContextOverflow,
				Message: "This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens. Please reduce the length of the input messages."},
		},
		{
			name: "vLLM 404 model", status: 404,
			body: `{"object":"error","message":"The model ` + "`x`" + ` does not exist.","type":"NotFoundError","param":null,"code":404}`,
			want: runtime.Error{Kind: runtime.KindNotFound, Message: "The model `x` does not exist."},
		},
		{
			name: "Ollama 404, error as a string", status: 404,
			body: `{"error":"model \"x\" not found, try pulling it first"}`,
			want: runtime.Error{Kind: runtime.KindNotFound, Message: `model "x" not found, try pulling it first`},
		},
		{
			name: "Ollama 400 context overflow", status: 400,
			body: `{"error":{"message":"the input length exceeds the context length","type":"invalid_request_error","param":null,"code":null}}`,
			want: runtime.Error{Kind: runtime.KindContextOverflow, Message: "the input length exceeds the context length"},
		},
		{
			name: "llama.cpp 400 exceed_context_size_error", status: 400,
			body: `{"error":{"code":400,"message":"request (13392 tokens) exceeds the available context size (8192 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":13392,"n_ctx":8192}}`,
			want: runtime.Error{Kind: runtime.KindContextOverflow,
				Message: "request (13392 tokens) exceeds the available context size (8192 tokens), try increasing it"},
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
			want.Provider, want.StatusCode = "oa", tt.status
			got := *e
			if tt.minAfter > 0 {
				if got.RetryAfter < tt.minAfter {
					t.Errorf("RetryAfter = %v, want at least %v", got.RetryAfter, tt.minAfter)
				}
				got.RetryAfter = 0
			}
			if diff := cmp.Diff(want, got, cmpError); diff != "" {
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
