package anthropic

import (
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/endpoint"
)

// Settings is a providers entry of type anthropic in the configuration
// file: base_url, api_key_env (required), headers and connect_timeout.
type Settings struct {
	endpoint.Settings `yaml:",inline"`
}

// DefaultSettings returns the settings of an entry that sets nothing but
// its type: [DefaultBaseURL], no key (which [Settings.Problems] reports),
// a 10s connect timeout.
func DefaultSettings() *Settings {
	return &Settings{endpoint.Defaults(DefaultBaseURL)}
}

// Problems lists every setting that is wrong, without looking at the
// environment; none when s is valid. Field is the setting's yaml key.
func (s *Settings) Problems() []llm.Problem { return s.Check("anthropic", true) }

// Build returns the provider named name, its API key read through getenv
// from the variable api_key_env names.
func (s *Settings) Build(name string, getenv func(string) string) (llm.Provider, error) {
	return New(Config{Name: name, BaseURL: s.BaseURL, APIKey: s.APIKey(getenv), Headers: s.Headers, ConnectTimeout: s.ConnectTimeout})
}
