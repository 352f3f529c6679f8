// Package config reads and validates turnstile's YAML configuration. It knows
// the file's shape and its defaults (taking the retry defaults from the
// runtime), and nothing of the wire; cmd/turnstile turns a [Config] into
// running parts.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/turnstile-dev/turnstile/policy"
	"gopkg.in/yaml.v3"
)

// DefaultListen is the address served when neither the file nor a flag says.
const DefaultListen = "127.0.0.1:7700"

// Config is the whole configuration file.
type Config struct {
	// Listen is the gRPC listen address.
	Listen string `yaml:"listen"`
	// Providers maps a provider name to its settings.
	Providers map[string]Provider `yaml:"providers"`
	// Models maps a model alias, which clients name in requests, to a
	// provider's model.
	Models map[string]Model `yaml:"models"`
	// DefaultModel is the alias used when a request names none.
	DefaultModel string `yaml:"default_model"`
	// Retry is the retry policy of every model that does not set its own.
	Retry Retry `yaml:"retry"`
	// Turn bounds each turn.
	Turn Turn `yaml:"turn"`
	// Server tunes the gRPC server.
	Server Server `yaml:"server"`
	// Log sets the log format and level.
	Log Log `yaml:"log"`
	// MCPServers maps a name to an MCP server whose tools models may call.
	MCPServers map[string]MCPServer `yaml:"mcp_servers"`
}

// Provider configures one model provider.
type Provider struct {
	// Type selects the implementation: simulator, openai, anthropic, gemini.
	Type string `yaml:"type"`
	// BaseURL overrides the provider's API endpoint.
	BaseURL string `yaml:"base_url"`
	// APIKeyEnv names the environment variable holding the API key. Keys
	// are never read from the file.
	APIKeyEnv string `yaml:"api_key_env"`
	// Headers are extra HTTP headers sent with every request.
	Headers map[string]string `yaml:"headers"`
	// ConnectTimeout bounds connecting to the provider (0: 10s).
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// TokenDelay paces the simulator's output, per token (0: 15ms; a
	// negative value: no pacing at all).
	TokenDelay time.Duration `yaml:"token_delay"`
	// Script lists directives the simulator applies to every call, in the
	// same syntax as the prompt directives (see providers/sim).
	Script []string `yaml:"script"`
}

// Model configures one model alias.
type Model struct {
	// Provider names an entry of providers.
	Provider string `yaml:"provider"`
	// Model is the provider's own model id.
	Model string `yaml:"model"`
	// Fallbacks lists aliases to move to, in order, when this model fails.
	Fallbacks []string `yaml:"fallbacks"`
	// ContextWindow is the model's context size in tokens, used to choose a
	// larger fallback on context overflow (0: unknown).
	ContextWindow int `yaml:"context_window"`
	// MaxOutputTokens is the default output limit per call (0: provider's).
	MaxOutputTokens int `yaml:"max_output_tokens"`
	// FirstTokenTimeout bounds the wait for the first output (0: 60s).
	FirstTokenTimeout time.Duration `yaml:"first_token_timeout"`
	// IdleTimeout bounds the gap between two chunks (0: 60s).
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// Retry overrides the top-level retry policy for this model; fields left
	// zero keep the top-level value.
	Retry *Retry `yaml:"retry"`
	// Tools lists the MCP tools (as models see them, prefix included) this
	// model may call; empty means all.
	Tools []string `yaml:"tools"`
}

// Retry configures retries and backoff. Zero fields take the defaults.
type Retry struct {
	// MaxRetries is the number of retries per model and step (default 2;
	// set -1 for none).
	MaxRetries int `yaml:"max_retries"`
	// InitialBackoff is the first backoff delay (default 500ms).
	InitialBackoff time.Duration `yaml:"initial_backoff"`
	// Multiplier grows the backoff per attempt (default 2).
	Multiplier float64 `yaml:"multiplier"`
	// MaxBackoff caps a backoff delay (default 16s).
	MaxBackoff time.Duration `yaml:"max_backoff"`
	// Jitter spreads each delay by ± this fraction (default 0.25).
	Jitter float64 `yaml:"jitter"`
	// MaxRetryAfter is the longest provider-requested wait honoured (default 60s).
	MaxRetryAfter time.Duration `yaml:"max_retry_after"`
	// Cooldown is how long a failing model is skipped by new turns when the
	// provider gave no Retry-After (default 30s).
	Cooldown time.Duration `yaml:"cooldown"`
	// BudgetTokens sizes the per-model retry budget shared by all turns
	// (default 10): retries stop when fewer than half remain.
	BudgetTokens float64 `yaml:"budget_tokens"`
	// BudgetRatio is what each success earns back (default 0.1).
	BudgetRatio float64 `yaml:"budget_ratio"`
}

// Turn bounds each turn.
type Turn struct {
	// MaxModelCalls is the default limit of model calls per turn (default 16).
	MaxModelCalls int `yaml:"max_model_calls"`
	// MaxContinuations is how often a reply cut by the output limit is
	// continued (default 3; -1 for never).
	MaxContinuations int `yaml:"max_continuations"`
	// ToolConcurrency bounds the tool calls run at once (default 4).
	ToolConcurrency int `yaml:"tool_concurrency"`
	// ToolTimeout bounds one tool call (default 60s).
	ToolTimeout time.Duration `yaml:"tool_timeout"`
}

// Server tunes the gRPC server.
type Server struct {
	// ShutdownGrace is how long running turns may finish after SIGTERM
	// before they are cancelled with a retryable error (default 30s).
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`
	// DrainDelay is how long health reports NOT_SERVING before the server
	// stops accepting turns, so load balancers notice (default 0).
	DrainDelay time.Duration `yaml:"drain_delay"`
	// KeepaliveTime is the server's ping interval on idle connections
	// (default 30s).
	KeepaliveTime time.Duration `yaml:"keepalive_time"`
	// MaxConcurrentStreams bounds the streams of one connection (default 256).
	MaxConcurrentStreams uint32 `yaml:"max_concurrent_streams"`
}

// Log sets logging.
type Log struct {
	// Format is text or json (default text).
	Format string `yaml:"format"`
	// Level is debug, info, warn or error (default info).
	Level string `yaml:"level"`
}

// ProviderTypes lists the known provider types.
var ProviderTypes = []string{"simulator", "openai", "anthropic", "gemini"}

// Default returns the configuration used when no file is given: the
// embedded simulator as the only provider and the default model.
func Default() *Config {
	c := &Config{
		Providers:    map[string]Provider{"sim": {Type: "simulator"}},
		Models:       map[string]Model{"sim": {Provider: "sim", Model: "turnstile-sim-1", ContextWindow: 32000}},
		DefaultModel: "sim",
	}
	c.applyDefaults()
	return c
}

// Load reads and validates the file at path.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes and validates YAML. Unknown keys are errors.
func Parse(b []byte) (*Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	c.applyDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

func (c *Config) applyDefaults() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	c.Retry = c.Retry.WithDefaults(DefaultRetry())
	if c.Turn.MaxModelCalls == 0 {
		c.Turn.MaxModelCalls = 16
	}
	if c.Turn.MaxContinuations == 0 {
		c.Turn.MaxContinuations = 3
	}
	if c.Turn.ToolConcurrency == 0 {
		c.Turn.ToolConcurrency = 4
	}
	if c.Turn.ToolTimeout == 0 {
		c.Turn.ToolTimeout = 60 * time.Second
	}
	if c.Server.ShutdownGrace == 0 {
		c.Server.ShutdownGrace = 30 * time.Second
	}
	if c.Server.KeepaliveTime == 0 {
		c.Server.KeepaliveTime = 30 * time.Second
	}
	if c.Server.MaxConcurrentStreams == 0 {
		c.Server.MaxConcurrentStreams = 256
	}
	if c.Log.Format == "" {
		c.Log.Format = "text"
	}
	if c.Log.Level == "" {
		c.Log.Level = "info"
	}
	if len(c.Models) == 1 && c.DefaultModel == "" {
		for alias := range c.Models {
			c.DefaultModel = alias
		}
	}
	for alias, m := range c.Models {
		if m.FirstTokenTimeout == 0 {
			m.FirstTokenTimeout = 60 * time.Second
		}
		if m.IdleTimeout == 0 {
			m.IdleTimeout = 60 * time.Second
		}
		if m.Retry == nil {
			r := c.Retry
			m.Retry = &r
		} else {
			r := m.Retry.WithDefaults(c.Retry)
			m.Retry = &r
		}
		c.Models[alias] = m
	}
}

// DefaultRetry returns the built-in retry settings: the runtime's
// defaults, so the two never drift apart.
func DefaultRetry() Retry {
	d := policy.DefaultRetry()
	return Retry{
		MaxRetries:     d.MaxRetries,
		InitialBackoff: d.InitialBackoff,
		Multiplier:     d.Multiplier,
		MaxBackoff:     d.MaxBackoff,
		Jitter:         d.Jitter,
		MaxRetryAfter:  d.MaxRetryAfter,
		Cooldown:       d.Cooldown,
		BudgetTokens:   d.BudgetTokens,
		BudgetRatio:    d.BudgetRatio,
	}
}

// WithDefaults returns r with each zero field taken from d.
func (r Retry) WithDefaults(d Retry) Retry {
	if r.MaxRetries == 0 {
		r.MaxRetries = d.MaxRetries
	}
	if r.InitialBackoff == 0 {
		r.InitialBackoff = d.InitialBackoff
	}
	if r.Multiplier == 0 {
		r.Multiplier = d.Multiplier
	}
	if r.MaxBackoff == 0 {
		r.MaxBackoff = d.MaxBackoff
	}
	if r.Jitter == 0 {
		r.Jitter = d.Jitter
	}
	if r.MaxRetryAfter == 0 {
		r.MaxRetryAfter = d.MaxRetryAfter
	}
	if r.Cooldown == 0 {
		r.Cooldown = d.Cooldown
	}
	if r.BudgetTokens == 0 {
		r.BudgetTokens = d.BudgetTokens
	}
	if r.BudgetRatio == 0 {
		r.BudgetRatio = d.BudgetRatio
	}
	return r
}

// Validate reports the first problem found, naming the field.
func (c *Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(c.Providers) == 0 {
		add("providers: at least one provider is required")
	}
	for _, name := range sortedKeys(c.Providers) {
		p := c.Providers[name]
		field := "providers." + name
		if !slices.Contains(ProviderTypes, p.Type) {
			add("%s.type: %q is not one of %s", field, p.Type, strings.Join(ProviderTypes, ", "))
		}
		if p.Type == "simulator" {
			if p.BaseURL != "" || p.APIKeyEnv != "" || len(p.Headers) > 0 {
				add("%s: base_url, api_key_env and headers do not apply to type simulator", field)
			}
		} else if p.TokenDelay != 0 || len(p.Script) > 0 {
			add("%s: token_delay and script apply only to type simulator", field)
		}
		if p.APIKeyEnv != "" && strings.ContainsAny(p.APIKeyEnv, " =") {
			add("%s.api_key_env: %q must be an environment variable name", field, p.APIKeyEnv)
		}
		if p.ConnectTimeout < 0 {
			add("%s: durations must not be negative", field)
		}
	}
	if len(c.Models) == 0 {
		add("models: at least one model is required")
	}
	for _, alias := range sortedKeys(c.Models) {
		m := c.Models[alias]
		field := "models." + alias
		if _, ok := c.Providers[m.Provider]; !ok {
			add("%s.provider: %q is not a configured provider", field, m.Provider)
		}
		if m.Model == "" {
			add("%s.model: required", field)
		}
		seen := map[string]bool{alias: true}
		for i, fb := range m.Fallbacks {
			if _, ok := c.Models[fb]; !ok {
				add("%s.fallbacks[%d]: %q is not a configured model", field, i, fb)
			}
			if seen[fb] {
				add("%s.fallbacks[%d]: %q appears twice in the chain", field, i, fb)
			}
			seen[fb] = true
		}
		if m.ContextWindow < 0 || m.MaxOutputTokens < 0 || m.FirstTokenTimeout < 0 || m.IdleTimeout < 0 {
			add("%s: numbers and durations must not be negative", field)
		}
		if m.Retry != nil {
			if err := m.Retry.validate(field + ".retry"); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if c.DefaultModel == "" {
		add("default_model: required when several models are configured")
	} else if _, ok := c.Models[c.DefaultModel]; !ok {
		add("default_model: %q is not a configured model", c.DefaultModel)
	}
	if err := c.Retry.validate("retry"); err != nil {
		errs = append(errs, err)
	}
	if c.Turn.MaxModelCalls < 1 {
		add("turn.max_model_calls: must be at least 1")
	}
	if c.Turn.MaxContinuations < -1 {
		add("turn.max_continuations: must be -1 or more")
	}
	if c.Turn.ToolConcurrency < 1 {
		add("turn.tool_concurrency: must be at least 1")
	}
	if c.Turn.ToolTimeout < 0 {
		add("turn.tool_timeout: must not be negative")
	}
	if c.Server.ShutdownGrace < 0 || c.Server.DrainDelay < 0 || c.Server.KeepaliveTime < 0 {
		add("server: durations must not be negative")
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		add("log.format: %q is not text or json", c.Log.Format)
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.Log.Level) {
		add("log.level: %q is not debug, info, warn or error", c.Log.Level)
	}
	errs = append(errs, c.validateMCP()...)
	return errors.Join(errs...)
}

func (r Retry) validate(field string) error {
	switch {
	case r.MaxRetries < -1:
		return fmt.Errorf("%s.max_retries: must be -1 (none) or more", field)
	case r.InitialBackoff < 0 || r.MaxBackoff < 0 || r.MaxRetryAfter < 0 || r.Cooldown < 0:
		return fmt.Errorf("%s: durations must not be negative", field)
	case r.Multiplier < 1:
		return fmt.Errorf("%s.multiplier: must be at least 1", field)
	case r.Jitter < 0 || r.Jitter > 1:
		return fmt.Errorf("%s.jitter: must be between 0 and 1", field)
	case r.BudgetTokens < 0 || r.BudgetRatio < 0:
		return fmt.Errorf("%s: budget_tokens and budget_ratio must not be negative", field)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
