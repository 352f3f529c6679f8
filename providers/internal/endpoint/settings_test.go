package endpoint

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/turnstile-dev/turnstile/llm"
)

func TestCheck(t *testing.T) {
	valid := Defaults("https://api.example.com/v1")
	tests := []struct {
		name        string
		edit        func(*Settings)
		keyRequired bool
		want        []llm.Problem
	}{
		{name: "defaults", edit: func(*Settings) {}},
		{name: "local server over http", edit: func(s *Settings) { s.BaseURL = "http://127.0.0.1:11434/v1" }},
		{name: "no scheme", edit: func(s *Settings) { s.BaseURL = "api.openai.com/v1" },
			want: []llm.Problem{{Field: "base_url", Message: "has no scheme: start it with https:// (or http:// for a server without TLS)"}}},
		{name: "host and port without scheme", edit: func(s *Settings) { s.BaseURL = "localhost:11434/v1" },
			want: []llm.Problem{{Field: "base_url", Message: "has no scheme: start it with https:// (or http:// for a server without TLS)"}}},
		{name: "other scheme", edit: func(s *Settings) { s.BaseURL = "ftp://user:secret@host/v1" },
			want: []llm.Problem{{Field: "base_url", Message: "must be an http or https URL"}}},
		{name: "no host", edit: func(s *Settings) { s.BaseURL = "https:///v1" },
			want: []llm.Problem{{Field: "base_url", Message: "has no host"}}},
		{name: "empty", edit: func(s *Settings) { s.BaseURL = "" },
			want: []llm.Problem{{Field: "base_url", Message: "must not be empty: leave the key out for the provider's own endpoint"}}},
		{name: "key required", edit: func(*Settings) {}, keyRequired: true,
			want: []llm.Problem{{Field: "api_key_env", Message: "required for type test: name the environment variable holding the API key"}}},
		{name: "variable name", edit: func(s *Settings) { s.APIKeyEnv = "OPENAI_API_KEY" }, keyRequired: true},
		{name: "lower-case variable name", edit: func(s *Settings) { s.APIKeyEnv = "my_key_2" }},
		{name: "pasted key", edit: func(s *Settings) { s.APIKeyEnv = "sk-proj-secret" }, want: keyProblem},
		{name: "pasted Gemini key", edit: func(s *Settings) { s.APIKeyEnv = "AIzaSyDsecret0123456789" }, want: keyProblem},
		{name: "random-looking", edit: func(s *Settings) { s.APIKeyEnv = "x9Fq2LmZ8aB7cD6eF5gH4secret" }, want: keyProblem},
		{name: "with a space", edit: func(s *Settings) { s.APIKeyEnv = "OPENAI KEY secret" }, want: keyProblem},
		{name: "starts with a digit", edit: func(s *Settings) { s.APIKeyEnv = "1secret" }, want: keyProblem},
		{name: "headers", edit: func(s *Settings) {
			s.Headers = map[string]string{"X-Team": "a\tb", "Bad Name": "v", "X-Token": "secret\r\nX-Evil: 1", "X-Nul": "secret\x00"}
		}, want: []llm.Problem{
			{Field: "headers", Message: `"Bad Name" is not a header name`},
			{Field: "headers.X-Nul", Message: "the value must be one line without control characters (the value is not shown)"},
			{Field: "headers.X-Token", Message: "the value must be one line without control characters (the value is not shown)"},
		}},
		{name: "headers from env", edit: func(s *Settings) {
			s.Headers = map[string]string{"X-Team": "search"}
			s.HeadersFromEnv = map[string]string{"x-team": "TEAM", "X-Auth": "Bearer sk-secret", "Bad Name": "V", "X-Ok": "OK_VAR"}
		}, want: []llm.Problem{
			{Field: "headers_from_env", Message: `"Bad Name" is not a header name`},
			{Field: "headers_from_env.X-Auth", Message: "must be the name of an environment variable (letters, digits and _), not the value itself (the value is not shown)"},
			{Field: "headers_from_env.x-team", Message: `"X-Team" is also set in headers`},
		}},
		{name: "credentials in the URL", edit: func(s *Settings) { s.BaseURL = "https://user:secret@api.example.com/v1" },
			want: []llm.Problem{{Field: "base_url", Message: "must not hold a user or password: put the key in the variable api_key_env names, or a header in headers_from_env (the value is not shown)"}}},
		{name: "zero connect timeout", edit: func(s *Settings) { s.ConnectTimeout = 0 },
			want: []llm.Problem{{Field: "connect_timeout", Message: "must be positive"}}},
		{name: "negative connect timeout", edit: func(s *Settings) { s.ConnectTimeout = -time.Second },
			want: []llm.Problem{{Field: "connect_timeout", Message: "must be positive"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := valid
			tt.edit(&s)
			got := s.Check("test", tt.keyRequired)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Check (-want +got):\n%s", diff)
			}
			for _, p := range got {
				if strings.Contains(p.Message, "secret") {
					t.Errorf("%s: message %q reveals a value", p.Field, p.Message)
				}
			}
		})
	}
}

var keyProblem = []llm.Problem{{Field: "api_key_env", Message: "must be the name of an environment variable (letters, digits and _), not the key itself: put the key in a variable and name the variable here (the value is not shown)"}}

func TestAPIKey(t *testing.T) {
	getenv := func(name string) string { return map[string]string{"K": "v"}[name] }
	if got := (Settings{APIKeyEnv: "K"}).APIKey(getenv); got != "v" {
		t.Errorf("APIKey = %q, want v", got)
	}
	if got := (Settings{}).APIKey(getenv); got != "" {
		t.Errorf("APIKey without api_key_env = %q, want none", got)
	}
	if got := (Settings{APIKeyEnv: "K"}).EnvVars(); !cmp.Equal(got, map[string]string{"api_key_env": "K"}) {
		t.Errorf("EnvVars = %v", got)
	}
	if got := (Settings{}).EnvVars(); got != nil {
		t.Errorf("EnvVars without api_key_env = %v, want nil", got)
	}
}

func TestHeadersFromEnv(t *testing.T) {
	s := Settings{APIKeyEnv: "K", Headers: map[string]string{"X-Team": "search"}, HeadersFromEnv: map[string]string{"X-Secret": "SECRET_VAR"}}
	if got := s.EnvVars(); !cmp.Equal(got, map[string]string{"api_key_env": "K", "headers_from_env.X-Secret": "SECRET_VAR"}) {
		t.Errorf("EnvVars = %v", got)
	}
	getenv := func(name string) string { return map[string]string{"SECRET_VAR": "hdr-value"}[name] }
	if got := s.AllHeaders(getenv); !cmp.Equal(got, map[string]string{"X-Team": "search", "X-Secret": "hdr-value"}) {
		t.Errorf("AllHeaders = %v", got)
	}
	if s.Headers["X-Secret"] != "" {
		t.Error("AllHeaders changed Headers")
	}
	if got := (Config{APIKey: "key", Headers: map[string]string{"X-Secret": "hdr-value"}}).Secrets(); !cmp.Equal(got, []string{"key", "hdr-value"}) {
		t.Errorf("Secrets = %v", got)
	}
}
