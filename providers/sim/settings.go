package sim

import (
	"fmt"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// Settings is a providers entry of type simulator in the configuration
// file. The yaml names are the file's keys.
type Settings struct {
	// TokenDelay is the pause before each streamed token; 0 (or a
	// negative value) streams without pause.
	TokenDelay time.Duration `yaml:"token_delay"`
	// Script lists directives applied to every call, as in [Config].
	Script []string `yaml:"script"`
}

// DefaultSettings returns the settings of an entry that sets nothing but
// its type: [DefaultTokenDelay] and no script.
func DefaultSettings() *Settings { return &Settings{TokenDelay: DefaultTokenDelay} }

// Problems lists every malformed script entry, at "script[i]"; none when
// s is valid.
func (s *Settings) Problems() []llm.Problem {
	var out []llm.Problem
	for i, entry := range s.Script {
		if _, err := parseScript(entry); err != nil {
			out = append(out, llm.Problem{Field: fmt.Sprintf("script[%d]", i), Message: err.Error()})
		}
	}
	return out
}

// EnvVars returns nil: the simulator reads no environment variable.
func (s *Settings) EnvVars() map[string]string { return nil }

// Build returns the simulator named name; getenv is not used.
func (s *Settings) Build(name string, _ func(string) string) (llm.Provider, error) {
	delay := s.TokenDelay
	if delay == 0 {
		delay = -1 // Config reads 0 as the default; the file's 0 means none.
	}
	return New(name, Config{TokenDelay: delay, Script: s.Script})
}
