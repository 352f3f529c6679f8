package config

import (
	"fmt"
	"testing"
)

// TestOperatorMistakes runs real mistakes an operator makes through what
// turnstile serve does with a file (Parse, then CheckEnv with the
// environment) and compares the exact output serve prints; an empty want
// means the file is accepted, and check then looks at what it means.
func TestOperatorMistakes(t *testing.T) {
	tests := []struct {
		name  string
		yaml  string
		env   map[string]string
		want  string
		check func(t *testing.T, c *Config)
	}{{
		name: "fallback instead of fallbacks",
		yaml: `
providers:
  openai: {type: openai, api_key_env: OPENAI_API_KEY}
models:
  fast: {provider: openai, model: gpt-4.1-mini, fallback: [fast2]}
  fast2: {provider: openai, model: gpt-4.1-nano}
default_model: fast
`,
		want: `config.yaml:5: models.fast.fallback: unknown key; did you mean fallbacks?`,
	}, {
		name: "api_key instead of api_key_env",
		yaml: `
providers:
  openai:
    type: openai
    api_key: sk-proj-4f9Qx2LmZ8
models:
  fast: {provider: openai, model: gpt-4.1-mini}
`,
		want: `config.yaml:5: providers.openai.api_key: unknown key; did you mean api_key_env?`,
	}, {
		name: "a key pasted into api_key_env",
		yaml: `
providers:
  openai:
    type: openai
    api_key_env: sk-proj-4f9Qx2LmZ8aB7cD6eF5gH4
models:
  fast: {provider: openai, model: gpt-4.1-mini}
`,
		want: `config.yaml:5: providers.openai.api_key_env: must be the name of an environment variable (letters, digits and _), not the key itself: put the key in a variable and name the variable here (the value is not shown)`,
	}, {
		name: "base_url without scheme",
		yaml: `
providers:
  openai: {type: openai, base_url: api.openai.com/v1}
models:
  fast: {provider: openai, model: gpt-4.1-mini}
`,
		want: `config.yaml:3: providers.openai.base_url: has no scheme: start it with https:// (or http:// for a server without TLS)`,
	}, {
		name: "jitter: 0 means no jitter",
		yaml: `
providers:
  sim: {type: simulator}
models:
  a: {provider: sim, model: m}
retry:
  jitter: 0
`,
		check: func(t *testing.T, c *Config) {
			if j := c.Models["a"].Retry.Jitter; j != 0 {
				t.Errorf("jitter = %v, want 0", j)
			}
		},
	}, {
		name: "budget_tokens: 0 means no budget",
		yaml: `
providers:
  sim: {type: simulator}
models:
  a: {provider: sim, model: m, retry: {budget_tokens: 0}}
`,
		check: func(t *testing.T, c *Config) {
			if b := c.Models["a"].Retry.BudgetTokens; b != 0 {
				t.Errorf("budget_tokens = %v, want 0", b)
			}
			if b := c.Retry.BudgetTokens; b != 20 {
				t.Errorf("top-level budget_tokens = %v, want the default 20", b)
			}
		},
	}, {
		name: "budget_ratio is retired",
		yaml: `
providers:
  sim: {type: simulator}
models:
  a: {provider: sim, model: m}
retry: {budget_tokens: 10, budget_ratio: 0.1}
`,
		want: `config.yaml:6: retry.budget_ratio: no longer used: the retry budget now earns a token back from each retry that works, not from every success, and refills with time (budget_refill); remove it`,
	}, {
		name: "a budget that never refills",
		yaml: `
providers:
  sim: {type: simulator}
models:
  a: {provider: sim, model: m, retry: {budget_refill: 0}}
`,
		want: `config.yaml:5: models.a.retry.budget_refill: must be positive while budget_tokens is set: a budget that never refills stops retries for good (budget_tokens: 0 turns the budget off)`,
	}, {
		name: "budget_tokens: 0 turns the budget off, whatever the refill",
		yaml: `
providers:
  sim: {type: simulator}
models:
  a: {provider: sim, model: m, retry: {budget_tokens: 0, budget_refill: 0}}
`,
		check: func(t *testing.T, c *Config) {
			if r := c.Models["a"].Retry; r.BudgetTokens != 0 || r.BudgetRefill != 0 {
				t.Errorf("retry = %+v", r)
			}
		},
	}, {
		name: "hedge and on_stream_cut",
		yaml: `
providers:
  sim: {type: simulator}
models:
  a: {provider: sim, model: m, fallbacks: [b], hedge: {after: p95}, on_stream_cut: continue}
  b: {provider: sim, model: n, hedge: {after: 250ms, to: self}}
  c: {provider: sim, model: o, hedge: {after: 0, to: self}}
default_model: a
`,
		check: func(t *testing.T, c *Config) {
			for alias, want := range map[string]string{"a": "p95 [] continue", "b": "250ms [self] restart", "c": "0s [self] restart"} {
				m := c.Models[alias]
				if got := fmt.Sprintf("%v [%s] %s", m.Hedge.After, m.Hedge.To, m.OnStreamCut); got != want {
					t.Errorf("%s: %s, want %s", alias, got, want)
				}
			}
		},
	}, {
		name: "hedge mistakes",
		yaml: `
providers:
  sim: {type: simulator}
models:
  a: {provider: sim, model: m, hedge: {after: 2, to: next}}
  b: {provider: sim, model: n, hedge: {to: other}, on_stream_cut: resume}
  c: {provider: sim, model: o, hedge: {after: p20, to: self}}
default_model: a
`,
		want: `config.yaml:5: models.a.hedge.after: expected a duration such as 500ms, or a quantile from p50 to p99.9 such as p95
config.yaml:5: models.a.hedge.to: next needs a model in fallbacks to hedge to (or hedge to self)
config.yaml:6: models.b.hedge.after: required: a duration such as 500ms, or a quantile of the model's observed time to first chunk such as p95
config.yaml:6: models.b.hedge.to: "other" is not next, self or deployment
config.yaml:6: models.b.on_stream_cut: "resume" is not restart or continue
config.yaml:7: models.c.hedge.after: expected a duration such as 500ms, or a quantile from p50 to p99.9 such as p95`,
	}, {
		name: "model input and media bounds",
		yaml: `
providers:
  sim: {type: simulator}
models:
  a: {provider: sim, model: m, input: [text, video, image, image]}
  b: {provider: sim, model: n, input: [image]}
  c: {provider: sim, model: o, input: [text, pdf]}
default_model: a
server:
  max_media_bytes: 9000000
  max_request_media_bytes: 8000000
`,
		want: `config.yaml:5: models.a.input[1]: "video" is not text, image, pdf or audio
config.yaml:5: models.a.input[3]: "image" appears twice
config.yaml:6: models.b.input: must include text: every turn has a prompt
config.yaml:10: server.max_media_bytes: must be at most server.max_request_media_bytes (8000000)`,
	}, {
		name: "refused media hosts",
		yaml: `
providers:
  sim: {type: simulator}
models:
  a: {provider: sim, model: m}
server:
  refused_media_hosts:
    - loopback
    - 10.0.0.0/33
    - "*.internal"
    - https://metadata.example
`,
		want: `config.yaml:9: server.refused_media_hosts[1]: "10.0.0.0/33" is not loopback, private, link_local, unspecified, a network, an IP address, a host name or *.DOMAIN
config.yaml:11: server.refused_media_hosts[3]: "https://metadata.example" is not loopback, private, link_local, unspecified, a network, an IP address, a host name or *.DOMAIN`,
	}, {
		name: "refused media hosts: none",
		yaml: `
providers:
  sim: {type: simulator}
models:
  a: {provider: sim, model: m}
server: {refused_media_hosts: []}
`,
		check: func(t *testing.T, c *Config) {
			if h := c.Server.RefusedMediaHosts; h == nil || len(h) != 0 {
				t.Errorf("refused_media_hosts %q, want set and empty", h)
			}
		},
	}, {
		name: "model input",
		yaml: `
providers:
  sim: {type: simulator}
models:
  a: {provider: sim, model: m, input: [text, pdf]}
  b: {provider: sim, model: n}
default_model: a
`,
		check: func(t *testing.T, c *Config) {
			if got := fmt.Sprint(c.Models["a"].Input, c.Models["b"].Input == nil); got != "[text pdf] true" {
				t.Errorf("inputs: %s, want [text pdf] and unset", got)
			}
		},
	}, {
		name: "max_retries: -1 for none",
		yaml: `
providers:
  sim: {type: simulator}
models:
  a: {provider: sim, model: m}
retry:
  max_retries: -1
`,
		want: `config.yaml:7: retry.max_retries: must not be negative: 0 now means no retries (-1 used to)`,
	}, {
		name: "a duration without unit",
		yaml: `
providers:
  sim: {type: simulator}
models:
  a: {provider: sim, model: m, idle_timeout: 30}
`,
		want: `config.yaml:5: models.a.idle_timeout: expected a duration such as 500ms or 2s, got 30 without a unit (write 30s for seconds)`,
	}, {
		name: "a fallback cycle",
		yaml: `
providers:
  openai: {type: openai}
  claude: {type: anthropic, api_key_env: ANTHROPIC_API_KEY}
models:
  fast: {provider: openai, model: gpt-4.1-mini, fallbacks: [sonnet]}
  sonnet: {provider: claude, model: claude-sonnet-4-5, fallbacks: [fast]}
default_model: fast
`,
		want: `config.yaml:6: models.fast.fallbacks[0]: fallback cycle fast -> sonnet -> fast: fallbacks are not followed transitively (a turn on fast tries fast, then fast's own fallbacks, not those of sonnet), so list each model's whole chain in its own fallbacks`,
	}, {
		name: "a typo in a provider type",
		yaml: `
providers:
  claude: {type: antropic, api_key_env: ANTHROPIC_API_KEY}
models:
  sonnet: {provider: claude, model: claude-sonnet-4-5}
`,
		want: `config.yaml:3: providers.claude.type: unknown provider type "antropic"; did you mean anthropic? (known types: simulator, openai, anthropic, gemini)`,
	}, {
		name: "two errors reported together, sorted by line",
		yaml: `
models:
  a: {provider: sim, model: m, max_retries: 4}
providers:
  sim: {type: simulator, token_delay: 15}
default_model: b
`,
		want: `config.yaml:3: models.a.max_retries: unknown key; did you mean retry.max_retries?
config.yaml:5: providers.sim.token_delay: expected a duration such as 500ms or 2s, got 15 without a unit (write 15s for seconds)
config.yaml:6: default_model: "b" is not a configured model`,
	}, {
		name: "a top-level retry error once, though three models inherit it",
		yaml: `
providers:
  sim: {type: simulator}
models:
  a: {provider: sim, model: m}
  b: {provider: sim, model: m, retry: {max_retries: 1}}
  c: {provider: sim, model: m, retry: {jitter: 2}}
default_model: a
retry:
  multiplier: 0.5
`,
		want: `config.yaml:7: models.c.retry.jitter: must be between 0 and 1
config.yaml:10: retry.multiplier: must be a finite number of at least 1`,
	}, {
		name: "missing environment variables of two providers, together",
		yaml: `
providers:
  openai: {type: openai, api_key_env: OPENAI_API_KEY}
  claude: {type: anthropic, api_key_env: ANTHROPIC_API_KEY}
  gemini: {type: gemini, api_key_env: GEMINI_API_KEY}
models:
  fast: {provider: openai, model: gpt-4.1-mini, fallbacks: [sonnet, flash]}
  sonnet: {provider: claude, model: claude-sonnet-4-5}
  flash: {provider: gemini, model: gemini-2.5-flash}
default_model: fast
`,
		env: map[string]string{"OPENAI_API_KEY": "", "GEMINI_API_KEY": "AIzaSyD-secret"},
		want: `config.yaml:3: providers.openai.api_key_env: the environment variable OPENAI_API_KEY is empty
config.yaml:4: providers.claude.api_key_env: the environment variable ANTHROPIC_API_KEY is not set`,
	}, {
		name: "an unused provider with a missing variable does not stop the server",
		yaml: `
providers:
  sim: {type: simulator}
  claude: {type: anthropic, api_key_env: ANTHROPIC_API_KEY}
models:
  a: {provider: sim, model: m}
`,
		check: func(t *testing.T, c *Config) {
			if _, unused := c.ProvidersInUse(); len(unused) != 1 || unused[0] != "claude" {
				t.Errorf("unused = %v, want [claude]", unused)
			}
		},
	}, {
		name: "a simulator key on an HTTP provider",
		yaml: `
providers:
  local: {type: openai, base_url: "http://127.0.0.1:11434/v1", token_delay: 1ms}
models:
  a: {provider: local, model: qwen3:8b}
`,
		want: `config.yaml:3: providers.local.token_delay: unknown key; token_delay is a key of type simulator, not of openai`,
	}, {
		name: "a model named twice",
		yaml: `
providers:
  sim: {type: simulator}
models:
  a: {provider: sim, model: m}
  a: {provider: sim, model: n}
`,
		want: `config.yaml:6: models.a: appears twice (first on line 5)`,
	}, {
		name: "max_continuations: -1 and a header value on two lines",
		yaml: `
providers:
  openai:
    type: openai
    headers: {Authorization: "Bearer hunter2\r\nX-Evil: 1"}
models:
  a: {provider: openai, model: m}
turn: {max_continuations: -1}
`,
		want: `config.yaml:5: providers.openai.headers.Authorization: the value must be one line without control characters (the value is not shown)
config.yaml:8: turn.max_continuations: must not be negative: 0 now means no continuations (-1 used to)`,
	}, {
		name: "reasoning and output retries out of range, a metadata attribute that is no key",
		yaml: `
providers:
  sim: {type: simulator}
models:
  a:
    provider: sim
    model: m
    reasoning: {effort: extreme, budget_tokens: 100}
    retry: {output_retries: 11}
  b:
    provider: sim
    model: m
    reasoning: {}
telemetry: {metadata_attributes: [session, "user id"]}
default_model: a
`,
		want: `config.yaml:8: models.a.reasoning.budget_tokens: must be from 1024 to 1000000 (0 means the effort's budget)
config.yaml:8: models.a.reasoning.effort: "extreme" is not low, medium or high
config.yaml:9: models.a.retry.output_retries: must be from 0 to 10
config.yaml:13: models.b.reasoning.effort: set effort or budget_tokens
config.yaml:14: telemetry.metadata_attributes[1]: "user id" is not a metadata key: 1 to 64 letters, digits, '_', '-' or '.'`,
	}, {
		name: "capabilities and top_p out of range, all at once",
		yaml: `
providers:
  sim: {type: simulator}
models:
  a:
    provider: sim
    model: m
    top_p: 1.5
    capabilities:
      thinking: deep
      sampling: sometimes
      max_stop_sequences: -1
      max_temperature: 3
`,
		want: `config.yaml:8: models.a.top_p: must be from 0 to 1
config.yaml:10: models.a.capabilities.thinking: "deep" is not default, budget, adaptive or none
config.yaml:11: models.a.capabilities.sampling: "sometimes" is not always, unless_reasoning or never
config.yaml:12: models.a.capabilities.max_stop_sequences: must not be negative (0: the model takes none)
config.yaml:13: models.a.capabilities.max_temperature: must be from 0 to 2`,
	}, {
		name: "capabilities: unset and zero are different",
		yaml: `
providers:
  sim: {type: simulator}
models:
  a:
    provider: sim
    model: m
    top_p: 0
    capabilities: {max_stop_sequences: 0, prefill: false, signed_calls: false, thinking: adaptive}
  b: {provider: sim, model: m}
default_model: a
`,
		check: func(t *testing.T, c *Config) {
			a := c.Models["a"]
			if a.TopP == nil || *a.TopP != 0 {
				t.Errorf("top_p = %v, want 0", a.TopP)
			}
			cc := a.Capabilities
			if cc == nil || cc.MaxStopSequences == nil || *cc.MaxStopSequences != 0 || cc.Prefill == nil || *cc.Prefill || cc.SignedCalls == nil || *cc.SignedCalls || cc.Thinking != "adaptive" ||
				cc.MaxTemperature != nil || cc.SchemaWithTools != nil || cc.TemperatureOrTopP != nil || cc.Sampling != "" {
				t.Errorf("capabilities = %+v", cc)
			}
			if b := c.Models["b"]; b.TopP != nil || b.Capabilities != nil {
				t.Errorf("b: top_p %v, capabilities %+v: want unset", b.TopP, b.Capabilities)
			}
		},
	}, {
		name: "a model's reasoning default",
		yaml: `
providers:
  sim: {type: simulator}
models:
  a: {provider: sim, model: m, reasoning: {effort: high}}
`,
		check: func(t *testing.T, c *Config) {
			if r := c.Models["a"].Reasoning.Reasoning(); r == nil || r.Budget() != 16384 || r.Level().String() != "high" {
				t.Errorf("reasoning = %+v", r)
			}
			if n := c.Models["a"].Retry.OutputRetries; n != 2 {
				t.Errorf("output_retries = %d, want the default 2", n)
			}
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("config.yaml", []byte(tt.yaml))
			if err == nil {
				err = c.CheckEnv(func(name string) (string, bool) {
					v, ok := tt.env[name]
					return v, ok
				})
			}
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("output:\n%s\nwant:\n%s", got, tt.want)
			}
			if tt.check != nil && c != nil {
				tt.check(t, c)
			}
		})
	}
}
