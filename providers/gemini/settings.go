package gemini

import (
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/endpoint"
)

// DefaultSettings returns the settings of a providers entry of type
// gemini, with the defaults of an entry that sets nothing but its type:
// [DefaultBaseURL], a 10s connect timeout, and no key, which its Problems
// report: api_key_env is required.
func DefaultSettings() *endpoint.Entry {
	return endpoint.NewEntry("gemini", DefaultBaseURL, true, func(c endpoint.Config) (llm.Provider, error) { return New(Config(c)) })
}
