package openai

import (
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/endpoint"
)

// DefaultSettings returns the settings of a providers entry of type openai,
// with the defaults of an entry that sets nothing but its type:
// [DefaultBaseURL], no key, a 10s connect timeout. The key is optional,
// since local OpenAI-compatible servers (Ollama, llama.cpp) take none.
func DefaultSettings() *endpoint.Entry {
	return endpoint.NewEntry("openai", DefaultBaseURL, false, func(c endpoint.Config) (llm.Provider, error) { return New(Config(c)) })
}
