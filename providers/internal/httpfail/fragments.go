package httpfail

import (
	"strings"

	"github.com/turnstile-dev/turnstile/llm"
)

// The scopes of [MatchFragment]: which wire a fragment was documented on.
const (
	ScopeNetHTTP   = "net/http"
	ScopeOpenAI    = "openai"
	ScopeAnthropic = "anthropic"
	ScopeGemini    = "gemini"
)

// fragments is the one table of message fragments that classify a failure.
// An entry is allowed only where the provider gives no typed field (status,
// error type, error code, header) that tells the cases apart; each is
// matched case-insensitively within its scope, in order, and each has a
// fixture in fragments_test.go.
var fragments = []struct {
	scope, fragment string
	kind            llm.Kind
}{
	// net/http's bundled HTTP/2 transport returns GOAWAY as plain text.
	{ScopeNetHTTP, "http2: server sent goaway", llm.KindNetwork},

	// OpenAI's 429 rate_limit_exceeded for a request larger than the
	// per-minute limit: waiting never helps, shrinking does.
	{ScopeOpenAI, "request too large", llm.KindContextOverflow},
	// vLLM's 400 (no code): "This model's maximum context length is 4096
	// tokens. However, your request has 5000 input tokens."
	{ScopeOpenAI, "maximum context length", llm.KindContextOverflow},
	// Ollama with truncate: false.
	{ScopeOpenAI, "the input length exceeds the context length", llm.KindContextOverflow},
	// llama.cpp (also typed as exceed_context_size_error).
	{ScopeOpenAI, "exceeds the available context size", llm.KindContextOverflow},

	// Anthropic's plain 400 invalid_request_error bodies.
	{ScopeAnthropic, "prompt is too long", llm.KindContextOverflow},
	{ScopeAnthropic, "exceed context limit", llm.KindContextOverflow},
	{ScopeAnthropic, "credit balance is too low", llm.KindQuotaExhausted},

	// Gemini's 400 INVALID_ARGUMENT for an oversized input.
	{ScopeGemini, "exceeds the maximum number of tokens allowed", llm.KindContextOverflow},
	// Gemini's free tier answers 429 with "limit: 0": no wait helps.
	{ScopeGemini, "limit: 0", llm.KindQuotaExhausted},
}

// MatchFragment returns the class of the first fragment of scope found in
// msg, and false when none is.
func MatchFragment(scope, msg string) (llm.Kind, bool) {
	lower := strings.ToLower(msg)
	for _, f := range fragments {
		if f.scope == scope && strings.Contains(lower, f.fragment) {
			return f.kind, true
		}
	}
	return 0, false
}
