package gemini

import (
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

// TestHTTPFailures replays every Gemini row of provider-errors.md as a real
// response and checks the classification, and that each failure cost
// exactly one request.
func TestHTTPFailures(t *testing.T) {
	t.Parallel()
	cases := []providertest.HTTPFailure{
		{
			Name: "429 per-minute quota with RetryInfo", Status: 429, Headers: map[string]string{"x-request-id": "req_g1"},
			Body: `{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details.","status":"RESOURCE_EXHAUSTED","details":[
				{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_paid_tier_input_token_count","quotaId":"GenerateContentPaidTierInputTokensPerModelPerMinute","quotaDimensions":{"location":"global","model":"gemini-2.5-pro"},"quotaValue":"2000000"}]},
				{"@type":"type.googleapis.com/google.rpc.Help","links":[{"description":"Learn more","url":"https://ai.google.dev/gemini-api/docs/rate-limits"}]},
				{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"55s"}]}}`,
			Want: llm.Error{Kind: llm.KindRateLimited, RequestID: "req_g1", RetryAfter: 55 * time.Second, Hint: llm.HintAfter,
				Message: "You exceeded your current quota, please check your plan and billing details."},
		},
		{
			Name: "429 fractional RetryInfo", Status: 429,
			Body: `{"error":{"code":429,"message":"Resource exhausted.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.5s"}]}}`,
			Want: llm.Error{Kind: llm.KindRateLimited, RetryAfter: 1500 * time.Millisecond, Hint: llm.HintAfter, Message: "Resource exhausted."},
		},
		{
			Name: "429 per-day quota", Status: 429,
			Body: `{"error":{"code":429,"message":"You exceeded your current quota.","status":"RESOURCE_EXHAUSTED","details":[
				{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier","quotaValue":"250"}]},
				{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"20s"}]}}`,
			Want: llm.Error{Kind: llm.KindQuotaExhausted, Message: "You exceeded your current quota."},
		},
		{
			Name: "429 free tier limit 0", Status: 429,
			Body: `{"error":{"code":429,"message":"You exceeded your current quota. Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 0, model: gemini-2.5-pro","status":"RESOURCE_EXHAUSTED"}}`,
			Want: llm.Error{Kind: llm.KindQuotaExhausted,
				Message: "You exceeded your current quota. Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 0, model: gemini-2.5-pro"},
		},
		{
			Name: "503 UNAVAILABLE", Status: 503,
			Body: `{"error":{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}`,
			Want: llm.Error{Kind: llm.KindOverloaded, Message: "The model is overloaded. Please try again later."},
		},
		{
			Name: "500 INTERNAL", Status: 500,
			Body: `{"error":{"code":500,"message":"An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting","status":"INTERNAL"}}`,
			Want: llm.Error{Kind: llm.KindServerError, Message: "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting"},
		},
		{
			Name: "504 DEADLINE_EXCEEDED", Status: 504,
			Body: `{"error":{"code":504,"message":"Deadline expired before operation could complete.","status":"DEADLINE_EXCEEDED"}}`,
			Want: llm.Error{Kind: llm.KindServerError, Message: "Deadline expired before operation could complete."},
		},
		{
			Name: "400 input too long", Status: 400,
			Body: `{"error":{"code":400,"message":"The input token count (3475108) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}`,
			Want: llm.Error{Kind: llm.KindContextOverflow, Message: "The input token count (3475108) exceeds the maximum number of tokens allowed (1048576)."},
		},
		{
			Name: "400 API_KEY_INVALID, key redacted", Status: 400,
			Body: `{"error":{"code":400,"message":"API key not valid: ` + testKey + `. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID","domain":"googleapis.com","metadata":{"service":"generativelanguage.googleapis.com"}}]}}`,
			Want: llm.Error{Kind: llm.KindAuth, Message: "API key not valid: [redacted]. Please pass a valid API key."},
		},
		{
			Name: "400 FAILED_PRECONDITION", Status: 400,
			Body: `{"error":{"code":400,"message":"User location is not supported for the API use.","status":"FAILED_PRECONDITION"}}`,
			Want: llm.Error{Kind: llm.KindAuth, Message: "User location is not supported for the API use."},
		},
		{
			Name: "400 other INVALID_ARGUMENT", Status: 400,
			Body: `{"error":{"code":400,"message":"Invalid JSON payload received.","status":"INVALID_ARGUMENT"}}`,
			Want: llm.Error{Kind: llm.KindInvalidRequest, Message: "Invalid JSON payload received."},
		},
		{
			Name: "403 PERMISSION_DENIED", Status: 403,
			Body: `{"error":{"code":403,"message":"Method doesn't allow unregistered callers.","status":"PERMISSION_DENIED"}}`,
			Want: llm.Error{Kind: llm.KindAuth, Message: "Method doesn't allow unregistered callers."},
		},
		{
			Name: "404 NOT_FOUND", Status: 404,
			Body: `{"error":{"code":404,"message":"models/gemini-9 is not found for API version v1beta.","status":"NOT_FOUND"}}`,
			Want: llm.Error{Kind: llm.KindNotFound, Message: "models/gemini-9 is not found for API version v1beta."},
		},
		{
			Name: "502 HTML from a proxy", Status: 502,
			Body: "<html><body>Bad Gateway</body></html>",
			Want: llm.Error{Kind: llm.KindServerError, Message: "HTTP 502 Bad Gateway"},
		},
	}
	providertest.HTTPFailures(t, provider, simpleRequest, "gm", testKey, cases)
}
