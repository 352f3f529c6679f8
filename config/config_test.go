package config

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/providers/sim"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/store"
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
	c, err := Parse("config.yaml", []byte(example))
	if err != nil {
		t.Fatal(err)
	}
	if c.DefaultModel != "fast" || c.Models["fast"].Fallbacks[0] != "claude" {
		t.Errorf("parsed %+v", c)
	}
	o := c.Providers["openai"].Settings
	if got := fmt.Sprintf("%+v", o); o.EnvVars()["api_key_env"] != "OPENAI_API_KEY" ||
		!strings.Contains(got, "BaseURL:https://api.openai.com/v1 ") || !strings.Contains(got, "ConnectTimeout:10s") {
		t.Errorf("openai settings = %s", got)
	}
	if diff := cmp.Diff(policy.DefaultRetry(), c.Models["claude"].Retry); diff != "" {
		t.Errorf("claude's retry (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(runtime.DefaultLimits(), c.Turn.Limits); diff != "" {
		t.Errorf("turn (-want +got):\n%s", diff)
	}
}

// TestRetryInheritsKeyByKey: a model's retry block replaces only the keys
// it sets; the others come from the top-level block, wherever the file
// puts it.
func TestRetryInheritsKeyByKey(t *testing.T) {
	c, err := Parse("config.yaml", []byte(`
providers: {sim: {type: simulator}}
models:
  a: {provider: sim, model: x, retry: {max_retries: 5, jitter: 0}}
  b: {provider: sim, model: y}
default_model: a
retry: {initial_backoff: 1s, jitter: 0.5}
`))
	if err != nil {
		t.Fatal(err)
	}
	top := policy.DefaultRetry()
	top.InitialBackoff, top.Jitter = time.Second, 0.5
	a := top
	a.MaxRetries, a.Jitter = 5, 0
	for alias, want := range map[string]policy.Retry{"a": a, "b": top} {
		if diff := cmp.Diff(want, c.Models[alias].Retry); diff != "" {
			t.Errorf("%s's retry (-want +got):\n%s", alias, diff)
		}
	}
	if diff := cmp.Diff(top, c.Retry); diff != "" {
		t.Errorf("top-level retry (-want +got):\n%s", diff)
	}
}

// TestZeroIsNotUnset: a key left out keeps its default; a key set to 0
// means 0, which the runtime reads as "none".
func TestZeroIsNotUnset(t *testing.T) {
	c, err := Parse("config.yaml", []byte(`
providers: {sim: {type: simulator, token_delay: 0}}
models:
  m: {provider: sim, model: x, first_token_timeout: 0, idle_timeout: 0}
retry: {max_retries: 0, jitter: 0, budget_tokens: 0, cooldown: 0}
turn: {max_continuations: 0}
server: {drain_delay: 0}
`))
	if err != nil {
		t.Fatal(err)
	}
	wantRetry := policy.DefaultRetry()
	wantRetry.MaxRetries, wantRetry.Jitter, wantRetry.BudgetTokens, wantRetry.Cooldown = 0, 0, 0, 0
	if diff := cmp.Diff(wantRetry, c.Models["m"].Retry); diff != "" {
		t.Errorf("retry (-want +got):\n%s", diff)
	}
	wantTurn := runtime.DefaultLimits()
	wantTurn.MaxContinuations = 0
	if diff := cmp.Diff(wantTurn, c.Turn.Limits); diff != "" {
		t.Errorf("turn (-want +got):\n%s", diff)
	}
	if m := c.Models["m"]; m.FirstTokenTimeout != 0 || m.IdleTimeout != 0 {
		t.Errorf("timeouts = %v, %v, want 0 (none)", m.FirstTokenTimeout, m.IdleTimeout)
	}
	if s := c.Providers["sim"].Settings.(*sim.Settings); s.TokenDelay != 0 {
		t.Errorf("token_delay = %v, want 0", s.TokenDelay)
	}

	// The same file without those keys gets the defaults.
	c, err = Parse("config.yaml", []byte("providers: {sim: {type: simulator}}\nmodels: {m: {provider: sim, model: x}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(policy.DefaultRetry(), c.Models["m"].Retry); diff != "" {
		t.Errorf("default retry (-want +got):\n%s", diff)
	}
	if m := c.Models["m"]; m.FirstTokenTimeout != 60*time.Second || m.IdleTimeout != 60*time.Second {
		t.Errorf("default timeouts = %v, %v, want 60s", m.FirstTokenTimeout, m.IdleTimeout)
	}
	if s := c.Providers["sim"].Settings.(*sim.Settings); s.TokenDelay != sim.DefaultTokenDelay {
		t.Errorf("default token_delay = %v", s.TokenDelay)
	}
	want := Server{
		ShutdownGrace: 15 * time.Second, DrainDelay: 5 * time.Second, MaxConnectionAge: 30 * time.Minute,
		KeepaliveTime: 30 * time.Second, MaxConcurrentStreams: 256, Reflection: true,
		MaxConcurrentTurns: 512, MaxConnections: 1024, MaxConnectionsPerPeer: 64, MaxHandshakes: 256, MaxConnectionIdle: 5 * time.Minute, HandshakeTimeout: 10 * time.Second,
		MaxHeaderBytes:  32 << 10,
		MaxRequestBytes: 4 << 20, MaxEventBytes: 2 << 20, SendTimeout: 30 * time.Second, MaxRunningTurns: 1024,
		MaxMediaBytes: 5 << 20, MaxRequestMediaBytes: 16 << 20,
		RefusedMediaHosts: []string{"loopback", "private", "link_local", "unspecified"},
	}
	if !reflect.DeepEqual(c.Server, want) || c.Log != (Log{Format: "text", Level: "info"}) || c.Listen != DefaultListen || c.DefaultModel != "m" {
		t.Errorf("defaults: server %+v, log %+v, listen %q, default_model %q", c.Server, c.Log, c.Listen, c.DefaultModel)
	}
	if !reflect.DeepEqual(c.Telemetry, Telemetry{}) || c.Ops != (Ops{Metrics: true}) {
		t.Errorf("defaults: telemetry %+v, ops %+v; want content not captured and no ops listener (metrics on when there is one)", c.Telemetry, c.Ops)
	}
}

func TestParseTelemetryAndOps(t *testing.T) {
	c, err := Parse("config.yaml", []byte(`
providers: {sim: {type: simulator}}
models: {m: {provider: sim, model: x}}
telemetry: {capture_content: true, metadata_attributes: [session, tenant.id]}
ops: {listen: ":9464", pprof: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.Telemetry, Telemetry{CaptureContent: true, MetadataAttributes: []string{"session", "tenant.id"}}) || c.Ops != (Ops{Listen: ":9464", Metrics: true, PProf: true}) {
		t.Errorf("telemetry %+v, ops %+v", c.Telemetry, c.Ops)
	}
}

func TestDefaultIsValid(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Listen != DefaultListen || c.DefaultModel != "sim" || c.Providers["sim"].Type != "simulator" {
		t.Errorf("default = %+v", c)
	}
	if used, unused := c.ProvidersInUse(); len(used) != 1 || len(unused) != 0 {
		t.Errorf("ProvidersInUse = %v, %v", used, unused)
	}
	if err := c.CheckEnv(func(string) (string, bool) { return "", false }); err != nil {
		t.Errorf("CheckEnv = %v, want nil: the simulator reads no variable", err)
	}
}

// TestInvalid checks one problem each; TestOperatorMistakes checks whole
// outputs.
func TestInvalid(t *testing.T) {
	const ok = "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m}}\n"
	tests := []struct {
		name, yaml, want string
	}{
		{"unknown key", "listen: x\n" + ok + "retries: 3\n", "config.yaml:4: retries: unknown key (known keys: listen, providers, models, default_model, retry, turn, server, log, telemetry, ops, store, mcp_servers, auth, pricing)"},
		{"unknown provider key", "providers: {sim: {type: simulator, api_key: sk-123}}\nmodels: {a: {provider: sim, model: m}}\n", "config.yaml:1: providers.sim.api_key: unknown key; did you mean api_key_env? that is a key of types openai, anthropic, gemini, not of simulator"},
		{"bad type", "providers: {p: {type: bedrock}}\nmodels: {a: {provider: p, model: m}}\n", `config.yaml:1: providers.p.type: unknown provider type "bedrock" (known types: simulator, openai, anthropic, gemini)`},
		{"no type", "providers: {p: {base_url: http://x}}\nmodels: {a: {provider: p, model: m}}\n", `config.yaml:1: providers.p.type: required: one of simulator, openai, anthropic, gemini`},
		{"missing provider", "providers: {sim: {type: simulator}}\nmodels: {a: {provider: nope, model: m}}\n", `config.yaml:2: models.a.provider: "nope" is not a configured provider`},
		{"missing model id", "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim}}\n", "config.yaml:2: models.a.model: required: the provider's model id"},
		{"unknown fallback", "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m, fallbacks: [b]}}\n", `config.yaml:2: models.a.fallbacks[0]: "b" is not a configured model`},
		{"self fallback", "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m, fallbacks: [a]}}\n", `config.yaml:2: models.a.fallbacks[0]: "a" is the model itself`},
		{"fallback twice", "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m, fallbacks: [b, b]}, b: {provider: sim, model: m}}\ndefault_model: a\n", `config.yaml:2: models.a.fallbacks[1]: "b" appears twice`},
		{"default missing", "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m}, b: {provider: sim, model: n}}\n", "default_model: required when several models are configured"},
		{"default unknown", ok + "default_model: z\n", `config.yaml:3: default_model: "z" is not a configured model`},
		{"jitter", ok + "retry: {jitter: 2}\n", "config.yaml:3: retry.jitter: must be between 0 and 1"},
		{"model retry", "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m, retry: {multiplier: 0.5}}}\n", "config.yaml:2: models.a.retry.multiplier: must be a finite number of at least 1"},
		{"log format", ok + "log: {format: xml}\n", `config.yaml:3: log.format: "xml" is not text or json`},
		{"ops listen", ok + "ops: {listen: nine}\n", `config.yaml:3: ops.listen: "nine" is not host:port`},
		{"ops port", ok + "ops: {listen: \"localhost:99999\"}\n", `config.yaml:3: ops.listen: "localhost:99999" is not host:port`},
		{"ops on the grpc address", "listen: 127.0.0.1:7700\n" + ok + "ops: {listen: 127.0.0.1:7700}\n", `config.yaml:4: ops.listen: "127.0.0.1:7700" is also the gRPC listen address`},
		{"pprof alone", ok + "ops: {pprof: true}\n", "config.yaml:3: ops.pprof: needs ops.listen"},
		{"capture content", ok + "telemetry: {capture_content: maybe}\n", "config.yaml:3: telemetry.capture_content: expected true or false"},
		{"bad duration", ok + "retry: {max_backoff: soon}\n", "config.yaml:3: retry.max_backoff: expected a duration such as 500ms or 2s"},
		{"tool failures", ok + "turn: {tool_failures: 0}\n", "config.yaml:3: turn.tool_failures: must be at least 1"},
		{"approval timeout", ok + "turn: {approval_timeout: 0s}\n", "config.yaml:3: turn.approval_timeout: must be positive"},
		{"steering queue", ok + "turn: {max_steer_messages: 0}\n", "config.yaml:3: turn.max_steer_messages: must be at least 1"},
		{"zero grace", ok + "server: {shutdown_grace: 0s}\n", "config.yaml:3: server.shutdown_grace: must be positive"},
		{"zero connect timeout", "providers: {o: {type: openai, connect_timeout: 0}}\nmodels: {a: {provider: o, model: m}}\n", "config.yaml:1: providers.o.connect_timeout: must be positive"},
		{"required key", "providers: {c: {type: anthropic}}\nmodels: {a: {provider: c, model: m}}\n", "config.yaml:1: providers.c.api_key_env: required for type anthropic"},
		{"bad script", "providers: {sim: {type: simulator, script: [\"fail=nope\"]}}\nmodels: {a: {provider: sim, model: m}}\n", "config.yaml:1: providers.sim.script[0]: invalid simulator directive"},
		{"header value", "providers: {o: {type: openai, headers: {X-Key: \"hunter2\\nX-Evil: 1\"}}}\nmodels: {a: {provider: o, model: m}}\n", "config.yaml:1: providers.o.headers.X-Key: the value must be one line"},
		{"negative window", "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m, context_window: -1}}\n", "config.yaml:2: models.a.context_window: must not be negative (0 means unknown)"},
		{"nats url", ok + "store: {mode: nats, nats: {url: \"nats://a:4222,nats://u:hunter2@b:port\"}}\n", `config.yaml:3: store.nats.url: server 2 of the list is not a URL: invalid port ":port" after host`},
		{"zero max turns", ok + "store: {max_turns: 0}\n", "config.yaml:3: store.max_turns: must be positive, or -1 for no bound"},
		{"negative frame interval", ok + "store: {frame_interval: -1ms}\n", "config.yaml:3: store.frame_interval: must be between 0 (no floor) and 10s"},
		{"long frame interval", ok + "store: {frame_interval: 11s}\n", "config.yaml:3: store.frame_interval: must be between 0 (no floor) and 10s"},
		{"no providers", "models: {a: {provider: sim, model: m}}\n", "config.yaml: providers: at least one provider is required"},
		{"not a mapping", "- a\n- b\n", "config.yaml:1: expected a block of key: value pairs, got a list"},
		{"syntax", "providers: {sim: {type: simulator}\n", "config.yaml:1: invalid YAML:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("config.yaml", []byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse error = %v, want it to contain %q", err, tt.want)
			}
			var errs *Errors
			if !errors.As(err, &errs) || len(errs.Problems) == 0 {
				t.Errorf("Parse error = %#v, want an *Errors", err)
			}
			if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "sk-123") {
				t.Errorf("Parse error = %q reveals a secret", err)
			}
		})
	}
}

// TestMaxTurns: store.max_turns unset is the default, -1 no bound, and any
// other positive value is taken as it is.
func TestMaxTurns(t *testing.T) {
	const ok = "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m}}\n"
	for _, tt := range []struct {
		yaml string
		want int64
	}{
		{"", store.DefaultConfig().MaxTurns},
		{"store: {max_turns: -1}\n", -1},
		{"store: {max_turns: 1}\n", 1},
		{"store: {max_turns: 5000000}\n", 5000000},
	} {
		c, err := Parse("config.yaml", []byte(ok+tt.yaml))
		if err != nil {
			t.Fatalf("%q: %v", tt.yaml, err)
		}
		if c.Store.MaxTurns != tt.want {
			t.Errorf("%q: max_turns %v, want %v", tt.yaml, c.Store.MaxTurns, tt.want)
		}
	}
}

// TestFrameInterval: store.frame_interval unset is the default, 0 is no
// floor, and any other value is taken as it is.
func TestFrameInterval(t *testing.T) {
	const ok = "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m}}\n"
	for _, tt := range []struct {
		yaml string
		want time.Duration
	}{
		{"", store.DefaultFrameInterval},
		{"store: {frame_interval: 0s}\n", 0},
		{"store: {frame_interval: 0}\n", 0},
		{"store: {frame_interval: 40ms}\n", 40 * time.Millisecond},
		{"store: {frame_interval: 10s}\n", 10 * time.Second},
	} {
		c, err := Parse("config.yaml", []byte(ok+tt.yaml))
		if err != nil {
			t.Fatalf("%q: %v", tt.yaml, err)
		}
		if c.Store.FrameInterval != tt.want {
			t.Errorf("%q: frame_interval %v, want %v", tt.yaml, c.Store.FrameInterval, tt.want)
		}
	}
}

func TestProvidersInUse(t *testing.T) {
	c, err := Parse("config.yaml", []byte(`
providers:
  sim: {type: simulator}
  openai: {type: openai, api_key_env: OPENAI_API_KEY}
  claude: {type: anthropic, api_key_env: ANTHROPIC_API_KEY}
models:
  m: {provider: sim, model: x}
  n: {provider: claude, model: y}
default_model: m
`))
	if err != nil {
		t.Fatal(err)
	}
	used, unused := c.ProvidersInUse()
	if diff := cmp.Diff([]string{"claude", "sim"}, used); diff != "" {
		t.Errorf("used (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"openai"}, unused); diff != "" {
		t.Errorf("unused (-want +got):\n%s", diff)
	}
}

func TestSuggest(t *testing.T) {
	keys := []string{"provider", "model", "fallbacks", "context_window", "retry", "tools", "api_key_env", "base_url"}
	tests := []struct{ word, want string }{
		{"fallback", "fallbacks"},
		{"api_key", "api_key_env"},
		{"fallbakcs", "fallbacks"},
		{"modle", "model"},
		{"Provider", "provider"},
		{"baseurl", "base_url"},
		{"retries", ""},
		{"x", ""},
		{"context", "context_window"},
	}
	for _, tt := range tests {
		if got := suggest(tt.word, keys); got != tt.want {
			t.Errorf("suggest(%q) = %q, want %q", tt.word, got, tt.want)
		}
	}
	if got := suggest("b", []string{"a"}); got != "" {
		t.Errorf(`suggest("b", [a]) = %q, want none`, got)
	}
}
