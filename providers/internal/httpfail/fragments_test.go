package httpfail

import (
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
)

// TestMatchFragment holds one real message per entry of the fragment
// table, as the provider sends it.
func TestMatchFragment(t *testing.T) {
	t.Parallel()
	tests := []struct {
		scope, msg string
		want       llm.Kind
		ok         bool
	}{
		{ScopeNetHTTP, `http2: server sent GOAWAY and closed the connection; LastStreamID=1, ErrCode=NO_ERROR, debug=""`, llm.KindNetwork, true},
		{ScopeOpenAI, "Request too large for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Requested 45000. The input or output tokens must be reduced in order to run successfully.", llm.KindContextOverflow, true},
		{ScopeOpenAI, "This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens.", llm.KindContextOverflow, true},
		{ScopeOpenAI, "the input length exceeds the context length", llm.KindContextOverflow, true},
		{ScopeOpenAI, "request (13392 tokens) exceeds the available context size (8192 tokens), try increasing it", llm.KindContextOverflow, true},
		{ScopeAnthropic, "prompt is too long: 205351 tokens > 200000 maximum", llm.KindContextOverflow, true},
		{ScopeAnthropic, "input length and `max_tokens` exceed context limit: 189136 + 20000 > 204648, decrease input length or `max_tokens` and try again", llm.KindContextOverflow, true},
		{ScopeAnthropic, "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.", llm.KindQuotaExhausted, true},
		{ScopeGemini, "The input token count (3475108) exceeds the maximum number of tokens allowed (1048576).", llm.KindContextOverflow, true},
		{ScopeGemini, "You exceeded your current quota. Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 0, model: gemini-2.5-pro", llm.KindQuotaExhausted, true},
		// Scopes do not leak into each other, and ordinary text matches nothing.
		{ScopeOpenAI, "prompt is too long: 205351 tokens > 200000 maximum", 0, false},
		{ScopeAnthropic, "Overloaded", 0, false},
		{ScopeGemini, "The model is overloaded. Please try again later.", 0, false},
	}
	for _, tt := range tests {
		got, ok := MatchFragment(tt.scope, tt.msg)
		if got != tt.want || ok != tt.ok {
			t.Errorf("MatchFragment(%s, %q) = %v, %v, want %v, %v", tt.scope, tt.msg, got, ok, tt.want, tt.ok)
		}
	}
}
