package config

import (
	"strings"
	"testing"
	"time"
)

const example = `
listen: 127.0.0.1:7700
providers:
  openai:    {type: openai, base_url: https://api.openai.com/v1, api_key_env: OPENAI_API_KEY}
  anthropic: {type: anthropic, base_url: https://api.anthropic.com, api_key_env: ANTHROPIC_API_KEY}
  sim:       {type: simulator}
models:
  fast:   {provider: openai, model: gpt-4.1-mini, fallbacks: [claude]}
  claude: {provider: anthropic, model: claude-sonnet-4-5}
default_model: fast
retry: {max_retries: 2, initial_backoff: 500ms, max_backoff: 16s, jitter: 0.25, max_retry_after: 60s}
`

func TestParseExample(t *testing.T) {
	c, err := Parse([]byte(example))
	if err != nil {
		t.Fatal(err)
	}
	if c.DefaultModel != "fast" || c.Models["fast"].Fallbacks[0] != "claude" || c.Providers["openai"].APIKeyEnv != "OPENAI_API_KEY" {
		t.Errorf("parsed %+v", c)
	}
	r := c.Models["claude"].Retry
	if r.MaxRetries != 2 || r.InitialBackoff != 500*time.Millisecond || r.MaxBackoff != 16*time.Second || r.Multiplier != 2 || r.Cooldown != 30*time.Second {
		t.Errorf("model retry = %+v", r)
	}
}

func TestPerModelRetryOverride(t *testing.T) {
	c, err := Parse([]byte(`
providers: {sim: {type: simulator}}
models:
  a: {provider: sim, model: x, retry: {max_retries: 5}}
  b: {provider: sim, model: y}
default_model: a
retry: {initial_backoff: 1s}
`))
	if err != nil {
		t.Fatal(err)
	}
	if a := c.Models["a"].Retry; a.MaxRetries != 5 || a.InitialBackoff != time.Second {
		t.Errorf("a = %+v", a)
	}
	if b := c.Models["b"].Retry; b.MaxRetries != 2 || b.InitialBackoff != time.Second {
		t.Errorf("b = %+v", b)
	}
}

func TestDefaultIsValid(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Listen != DefaultListen || c.DefaultModel != "sim" {
		t.Errorf("default = %+v", c)
	}
}

func TestInvalid(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"unknown key", "listen: x\nproviders: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m}}\nretries: 3\n", "field retries not found"},
		{"unknown provider key", "providers: {sim: {type: simulator, api_key: sk-123}}\nmodels: {a: {provider: sim, model: m}}\n", "field api_key not found"},
		{"bad type", "providers: {p: {type: bedrock}}\nmodels: {a: {provider: p, model: m}}\n", `providers.p.type: "bedrock" is not one of`},
		{"missing provider", "providers: {sim: {type: simulator}}\nmodels: {a: {provider: nope, model: m}}\n", `models.a.provider: "nope" is not a configured provider`},
		{"missing model id", "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim}}\n", "models.a.model: required"},
		{"unknown fallback", "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m, fallbacks: [b]}}\n", `models.a.fallbacks[0]: "b" is not a configured model`},
		{"self fallback", "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m, fallbacks: [a]}}\n", `models.a.fallbacks[0]: "a" appears twice`},
		{"default missing", "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m}, b: {provider: sim, model: n}}\n", "default_model: required"},
		{"default unknown", "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m}}\ndefault_model: z\n", `default_model: "z" is not a configured model`},
		{"jitter", "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m}}\nretry: {jitter: 2}\n", "retry.jitter: must be between 0 and 1"},
		{"model retry", "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m, retry: {multiplier: 0.5}}}\n", "models.a.retry.multiplier: must be at least 1"},
		{"sim with key", "providers: {sim: {type: simulator, api_key_env: X}}\nmodels: {a: {provider: sim, model: m}}\n", "providers.sim: base_url, api_key_env and headers do not apply"},
		{"log format", "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m}}\nlog: {format: xml}\n", `log.format: "xml" is not text or json`},
		{"bad duration", "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m}}\nretry: {max_backoff: soon}\n", "cannot unmarshal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}
