package openai

import (
	"net/http"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

// TestHTTPFailures replays every OpenAI row of provider-errors.md (and the
// compatible servers' rows) as a real response and checks the
// classification, and that each failure cost exactly one request.
func TestHTTPFailures(t *testing.T) {
	t.Parallel()
	date := time.Now().Add(2 * time.Minute).UTC().Format(http.TimeFormat)
	cases := []providertest.HTTPFailure{
		{
			Name: "429 rate limit with retry-after-ms", Status: 429,
			Headers: map[string]string{"retry-after-ms": "644", "retry-after": "1", "x-request-id": "req_1", "x-should-retry": "true"},
			Body:    `{"error":{"message":"Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Used 30000, Requested 100. Please try again in 644ms.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`,
			Want: llm.Error{Kind: llm.KindRateLimited, RequestID: "req_1", RetryAfter: 644 * time.Millisecond, Hint: llm.HintAfter,
				Message: "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Used 30000, Requested 100. Please try again in 644ms."},
		},
		{
			Name: "429 rate limit with retry-after seconds", Status: 429,
			Headers: map[string]string{"retry-after": "20"},
			Body:    `{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}`,
			Want:    llm.Error{Kind: llm.KindRateLimited, RetryAfter: 20 * time.Second, Hint: llm.HintAfter, Message: "Rate limit reached"},
		},
		{
			Name: "429 rate limit with retry-after date", Status: 429,
			Headers:  map[string]string{"retry-after": date},
			Body:     `{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}`,
			Want:     llm.Error{Kind: llm.KindRateLimited, Hint: llm.HintAfter, Message: "Rate limit reached"},
			MinAfter: time.Minute,
		},
		{
			Name: "429 rate limit with x-ratelimit-reset only", Status: 429,
			Headers: map[string]string{"x-ratelimit-reset-requests": "12ms", "x-ratelimit-reset-tokens": "6m0s"},
			Body:    `{"error":{"message":"Rate limit reached","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`,
			Want:    llm.Error{Kind: llm.KindRateLimited, RetryAfter: 6 * time.Minute, Hint: llm.HintAfter, Message: "Rate limit reached"},
		},
		{
			Name: "429 request too large", Status: 429,
			Body: `{"error":{"message":"Request too large for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Requested 45000. The input or output tokens must be reduced in order to run successfully.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`,
			Want: llm.Error{Kind: llm.KindContextOverflow,
				Message: "Request too large for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Requested 45000. The input or output tokens must be reduced in order to run successfully."},
		},
		{
			Name: "429 insufficient_quota", Status: 429,
			Headers: map[string]string{"x-should-retry": "false", "x-request-id": "req_q"},
			Body:    `{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`,
			Want: llm.Error{Kind: llm.KindQuotaExhausted, RequestID: "req_q", Hint: llm.HintNever,
				Message: "You exceeded your current quota, please check your plan and billing details."},
		},
		{
			Name: "429 insufficient_quota, older body with code null", Status: 429,
			Body: `{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","param":null,"code":null}}`,
			Want: llm.Error{Kind: llm.KindQuotaExhausted, Message: "You exceeded your current quota."},
		},
		{
			Name: "429 credit_balance_exhausted", Status: 429,
			Body: `{"error":{"message":"Your credit balance is exhausted.","type":"insufficient_quota","param":null,"code":"credit_balance_exhausted"}}`,
			Want: llm.Error{Kind: llm.KindQuotaExhausted, Message: "Your credit balance is exhausted."},
		},
		{
			Name: "429 spend limit", Status: 429,
			Body: `{"error":{"message":"Monthly spend limit reached.","type":"invalid_request_error","param":null,"code":"monthly_spend_limit_exceeded"}}`,
			Want: llm.Error{Kind: llm.KindQuotaExhausted, Message: "Monthly spend limit reached."},
		},
		{
			Name: "429 organization usage limit", Status: 429,
			Body: `{"error":{"message":"Usage limit reached.","type":"invalid_request_error","param":null,"code":"organization_usage_limit_exceeded"}}`,
			Want: llm.Error{Kind: llm.KindQuotaExhausted, Message: "Usage limit reached."},
		},
		{
			Name: "429 slow_down", Status: 429,
			Headers: map[string]string{"retry-after": "2"},
			Body:    `{"error":{"message":"Please slow down.","type":"rate_limit_error","param":null,"code":"slow_down"}}`,
			Want:    llm.Error{Kind: llm.KindRateLimited, RetryAfter: 2 * time.Second, Hint: llm.HintAfter, Message: "Please slow down."},
		},
		{
			Name: "500 server_error", Status: 500,
			Headers: map[string]string{"x-request-id": "req_500"},
			Body:    `{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}`,
			Want: llm.Error{Kind: llm.KindServerError, RequestID: "req_500",
				Message: "The server had an error while processing your request. Sorry about that!"},
		},
		{
			Name: "502 HTML from a proxy", Status: 502,
			Body: "<html><head><title>502 Bad Gateway</title></head><body>cloudflare</body></html>",
			Want: llm.Error{Kind: llm.KindServerError, Message: "HTTP 502 Bad Gateway"},
		},
		{
			Name: "503 service_unavailable_error", Status: 503,
			Body: `{"error":{"message":"The engine is currently overloaded, please try again later","type":"service_unavailable_error","param":null,"code":null}}`,
			Want: llm.Error{Kind: llm.KindOverloaded, Message: "The engine is currently overloaded, please try again later"},
		},
		{
			Name: "503 server_is_overloaded with retry-after", Status: 503,
			Headers: map[string]string{"retry-after": "3"},
			Body:    `{"error":{"message":"Overloaded","type":"server_error","param":null,"code":"server_is_overloaded"}}`,
			Want:    llm.Error{Kind: llm.KindOverloaded, RetryAfter: 3 * time.Second, Hint: llm.HintAfter, Message: "Overloaded"},
		},
		{
			Name: "504 empty body", Status: 504,
			Want: llm.Error{Kind: llm.KindServerError, Message: "HTTP 504 Gateway Timeout"},
		},
		{
			Name: "400 context_length_exceeded", Status: 400,
			Body: `{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 204308 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`,
			Want: llm.Error{Kind: llm.KindContextOverflow,
				Message: "This model's maximum context length is 128000 tokens. However, your messages resulted in 204308 tokens. Please reduce the length of the messages."},
		},
		{
			Name: "401 invalid_api_key, key redacted", Status: 401,
			Body: `{"error":{"message":"Incorrect API key provided: ` + testKey + `. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`,
			Want: llm.Error{Kind: llm.KindAuth,
				Message: "Incorrect API key provided: [redacted]. You can find your API key at https://platform.openai.com/account/api-keys."},
		},
		{
			Name: "403 unsupported region", Status: 403,
			Body: `{"error":{"message":"Country, region, or territory not supported","type":"request_forbidden","param":null,"code":"unsupported_country_region_territory"}}`,
			Want: llm.Error{Kind: llm.KindAuth, Message: "Country, region, or territory not supported"},
		},
		{
			Name: "404 model_not_found", Status: 404,
			Body: `{"error":{"message":"The model ` + "`gpt-5-nope`" + ` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}`,
			Want: llm.Error{Kind: llm.KindNotFound, Message: "The model `gpt-5-nope` does not exist or you do not have access to it."},
		},
		{
			Name: "400 other invalid_request_error", Status: 400,
			Body: `{"error":{"message":"Invalid type for 'temperature': expected a decimal.","type":"invalid_request_error","param":"temperature","code":"invalid_type"}}`,
			Want: llm.Error{Kind: llm.KindInvalidRequest, Message: "Invalid type for 'temperature': expected a decimal."},
		},
		{
			Name: "400 content policy", Status: 400,
			Body: `{"error":{"message":"Your request was rejected as a result of our safety system.","type":"invalid_request_error","param":null,"code":"content_policy_violation"}}`,
			Want: llm.Error{Kind: llm.KindContentFiltered, Message: "Your request was rejected as a result of our safety system."},
		},
		{
			Name: "vLLM 400 context, numeric code", Status: 400,
			Body: `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens. Please reduce the length of the input messages.","type":"BadRequestError","param":null,"code":400}`,
			Want: llm.Error{Kind: llm.KindContextOverflow,
				Message: "This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens. Please reduce the length of the input messages."},
		},
		{
			Name: "vLLM 404 model", Status: 404,
			Body: `{"object":"error","message":"The model ` + "`x`" + ` does not exist.","type":"NotFoundError","param":null,"code":404}`,
			Want: llm.Error{Kind: llm.KindNotFound, Message: "The model `x` does not exist."},
		},
		{
			Name: "Ollama 404, error as a string", Status: 404,
			Body: `{"error":"model \"x\" not found, try pulling it first"}`,
			Want: llm.Error{Kind: llm.KindNotFound, Message: `model "x" not found, try pulling it first`},
		},
		{
			Name: "Ollama 400 context overflow", Status: 400,
			Body: `{"error":{"message":"the input length exceeds the context length","type":"invalid_request_error","param":null,"code":null}}`,
			Want: llm.Error{Kind: llm.KindContextOverflow, Message: "the input length exceeds the context length"},
		},
		{
			Name: "llama.cpp 400 exceed_context_size_error", Status: 400,
			Body: `{"error":{"code":400,"message":"request (13392 tokens) exceeds the available context size (8192 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":13392,"n_ctx":8192}}`,
			Want: llm.Error{Kind: llm.KindContextOverflow,
				Message: "request (13392 tokens) exceeds the available context size (8192 tokens), try increasing it"},
		},
	}
	providertest.HTTPFailures(t, provider, simpleRequest, "oa", testKey, cases)
}
