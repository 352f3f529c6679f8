// Package config reads and validates turnstile's YAML configuration file.
//
// Parsing yields the values the running parts take as they are: the retry
// settings as a [policy.Retry], the turn limits as a [runtime.Limits], each
// providers entry as its type's settings from [registry]. A key the file
// leaves out keeps its default; a key it sets means what it says, 0
// included (jitter: 0 is no jitter, budget_tokens: 0 no budget). Every
// problem of a file is reported at once, as an [*Errors] holding each with
// its YAML path and line, and no secret is ever quoted.
//
// [Schema] (a JSON Schema, for editors) and [Reference] (Markdown) describe
// the file from the same walk of its Go types the decoder makes, with the
// fields' doc comments as help; `go generate ./config` writes their
// committed copies, which a test holds fresh.
//
// The package knows nothing of the wire; cmd/turnstile turns a [Config]
// into running parts.
package config

import (
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/providers/registry"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/store"
)

// DefaultListen is the address served when neither the file nor a flag says.
const DefaultListen = "127.0.0.1:7700"

// Shutdown and connection defaults, chosen for Kubernetes, whose default
// termination grace is 30s: on SIGTERM the server keeps accepting for
// DefaultDrainDelay while health (and /readyz) says NOT_SERVING, so the
// endpoint's removal reaches every proxy before the listener closes; then
// running turns get DefaultShutdownGrace to end before they are handed to
// another replica (with a store) or cancelled, which waits at most 5s
// more. 5s + 15s + 5s leaves 5s of the 30s for the store and telemetry to
// close. A pod given more time (terminationGracePeriodSeconds) can raise
// both.
const (
	DefaultDrainDelay    = 5 * time.Second
	DefaultShutdownGrace = 15 * time.Second
	// DefaultMaxConnectionAge closes a connection this old gracefully,
	// so long-lived clients reconnect and spread over replicas added
	// since. Its grace defaults to 0: RPCs on the old connection run
	// until they end, which turn.max_duration bounds.
	DefaultMaxConnectionAge = 30 * time.Minute
)

// Config is the whole configuration file. Build one with [Parse], [Load]
// or [Default]; the zero value is not valid.
type Config struct {
	// Listen is the gRPC listen address.
	Listen string `yaml:"listen"`
	// Providers maps a provider name to its entry.
	Providers map[string]Provider `yaml:"providers"`
	// Models maps a model alias, which clients name in requests, to a
	// provider's model.
	Models map[string]Model `yaml:"models"`
	// DefaultModel is the alias used when a request names none; a file
	// with one model and no default_model gets that model.
	DefaultModel string `yaml:"default_model"`
	// Retry is the retry policy of every model, each key of which a model
	// may override.
	Retry policy.Retry `yaml:"retry"`
	// Turn bounds each turn.
	Turn Turn `yaml:"turn"`
	// Server tunes the gRPC server.
	Server Server `yaml:"server"`
	// Log sets the log format and level.
	Log Log `yaml:"log"`
	// Telemetry tunes traces and metrics; where they are exported is set by
	// the standard OTEL_* environment variables.
	Telemetry Telemetry `yaml:"telemetry"`
	// Ops configures the HTTP listener for operators: Prometheus metrics
	// and profiles.
	Ops Ops `yaml:"ops"`
	// Store is the turn log that makes turns durable.
	Store store.Config `yaml:"store"`
	// MCPServers maps a name to an MCP server whose tools models may call.
	MCPServers map[string]MCPServer `yaml:"mcp_servers"`
	// Auth lists the client keys; none serves every caller.
	Auth Auth `yaml:"auth"`
	// Pricing sets the currency of the models' prices and the keys' cost
	// limits.
	Pricing Pricing `yaml:"pricing"`

	// file names the source in errors.
	file string
	// lines maps the YAML path of every key and list item the file sets to
	// its line; nil for a Config built in code.
	lines map[string]int
}

// retiredKeys explains, per type decoded into, keys it no longer has.
var retiredKeys = map[reflect.Type]map[string]string{
	reflect.TypeFor[policy.Retry](): {
		"budget_ratio": "no longer used: the retry budget now earns a token back from each retry that works, not from every success, and refills with time (budget_refill); remove it",
	},
}

// Provider is one entry of providers: its type, and the entry's other keys
// decoded into that type's settings.
type Provider struct {
	// Type names the provider type in the [registry].
	Type string
	// Settings holds the entry's settings; nil when Type is unknown.
	Settings registry.Settings
}

// Model configures one model alias.
type Model struct {
	// Provider names an entry of providers. Set it and model, or
	// deployments, not both.
	Provider string `yaml:"provider"`
	// Model is the provider's own model id.
	Model string `yaml:"model"`
	// Deployments spreads the model over several providers (keys,
	// endpoints, regions), each entry a provider, its model id, a weight
	// and a name: turns go to the healthy ones by weight (the least
	// loaded for its weight when another is busier), and a failure of one
	// key (rate limited, quota, auth, overloaded) moves the call to
	// another deployment before any fallback. Unset, the model is one
	// deployment, of provider and model, named after the provider.
	Deployments []Deployment `yaml:"deployments"`
	// Fallbacks lists aliases to move to, in order, when this model fails.
	// They are not followed transitively: a turn on this model tries it,
	// then these, and none of their own fallbacks.
	Fallbacks []string `yaml:"fallbacks"`
	// ContextWindow is the model's context size in tokens, used to choose a
	// larger fallback on context overflow; 0 is unknown.
	ContextWindow int `yaml:"context_window"`
	// MaxOutputTokens is the default output limit per call; 0 leaves it to
	// the provider.
	MaxOutputTokens int `yaml:"max_output_tokens"`
	// FirstTokenTimeout bounds the wait for the first output (default 60s;
	// 0 is none).
	FirstTokenTimeout time.Duration `yaml:"first_token_timeout"`
	// IdleTimeout bounds the gap between two chunks (default 60s; 0 is
	// none).
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// Retry is this model's retry policy: the top-level retry, with each
	// key the model's retry block sets replaced.
	Retry policy.Retry `yaml:"retry"`
	// Hedge, when set, races a second call against a call of this model
	// that has no output after hedge.after (see [runtime.HedgeConfig]).
	Hedge *runtime.HedgeConfig `yaml:"hedge"`
	// OnStreamCut is restart (default: text a cut stream showed is dropped
	// and the reply asked for anew) or continue (it is kept and continued).
	OnStreamCut runtime.StreamCut `yaml:"on_stream_cut"`
	// Tools lists the MCP tools (as models see them, prefix included) this
	// model may call; empty means all.
	Tools []string `yaml:"tools"`
	// PromptCache is auto (default: Anthropic cache_control breakpoints on
	// the tools, the system prompt and the conversation; an OpenAI
	// prompt_cache_key per conversation) or off.
	PromptCache runtime.PromptCache `yaml:"prompt_cache"`
	// Compaction, when set, compacts the conversation before a call once
	// its estimated size reaches compaction.at of context_window (which it
	// needs), not only after the provider refused it as too long.
	Compaction *runtime.CompactionConfig `yaml:"compaction"`
	// Input lists the kinds of input the model takes, text among them
	// (text, image, pdf, audio); unset takes what its provider type's
	// models take (openai: text, image, pdf, and audio for its audio
	// models; anthropic: all but audio; gemini and the simulator: all). A
	// request with media the model cannot take is refused.
	Input []llm.Modality `yaml:"input"`
	// Reasoning, when set, is the reasoning asked of this model when a
	// request's generation.reasoning is unset.
	Reasoning *runtime.ReasoningConfig `yaml:"reasoning"`
	// TopP, when set, is the top_p (nucleus sampling, from 0 to 1) of the
	// model's calls when a request's generation.top_p is unset; on a model
	// that takes temperature or top_p, not both, a request's temperature
	// replaces it. Unset leaves it to the provider.
	TopP *float64 `yaml:"top_p"`
	// Capabilities, when set, overrides what the provider's table says the
	// model takes, key by key: for a model the table does not know (a
	// fine-tuned or newer one) or knows wrong. The table is in
	// providers/README.md; a model it does not know takes its provider's
	// default row.
	Capabilities *runtime.CapabilitiesConfig `yaml:"capabilities"`
	// Price, when set, is what the model's tokens cost (per million, in
	// pricing.currency): each call's and turn's usage then carries its
	// cost. Unset is an unknown price, never 0.
	Price *Price `yaml:"price"`
}

// Deployment is one entry of a model's deployments: one place the model
// is served.
type Deployment struct {
	// Name identifies the deployment within its model, on the wire
	// (llm_call_started, retry) and in telemetry; unique per model.
	// Default: the provider's name.
	Name string `yaml:"name"`
	// Provider names an entry of providers.
	Provider string `yaml:"provider"`
	// Model is the provider's own model id.
	Model string `yaml:"model"`
	// Weight is the deployment's share of the model's turns relative to
	// the others' (default 1; positive).
	Weight int `yaml:"weight"`
	// Price, when set, is what this deployment's tokens cost, when it
	// differs from the model's price; unset takes the model's.
	Price *Price `yaml:"price"`
}

// newDeployment returns the value a deployments entry starts from.
func newDeployment() Deployment { return Deployment{Weight: 1} }

// Routes returns the deployments m is served by: its deployments, each
// named (after its provider when it has no name), or the one its provider
// and model make, named after the provider.
func (m Model) Routes() []Deployment {
	if len(m.Deployments) == 0 {
		return []Deployment{{Name: m.Provider, Provider: m.Provider, Model: m.Model, Weight: 1}}
	}
	out := make([]Deployment, len(m.Deployments))
	for i, d := range m.Deployments {
		if d.Name == "" {
			d.Name = d.Provider
		}
		out[i] = d
	}
	return out
}

// Turn is the turn block: the runtime's limits on each turn, and how
// long a turn outlives its clients.
type Turn struct {
	runtime.Limits `yaml:",inline"`
	// DetachGrace is how long a turn keeps running after its last watcher
	// left, before it is cancelled (default 30s; positive). It needs a
	// store.
	DetachGrace time.Duration `yaml:"detach_grace"`
}

// Problems lists the turn block's values out of range.
func (t Turn) Problems() []llm.Problem {
	out := t.Limits.Problems()
	if t.DetachGrace <= 0 {
		out = append(out, llm.Problem{Field: "detach_grace", Message: "must be positive"})
	}
	return out
}

// Auth lists the client keys. With at least one key, every RPC but health
// checks needs one.
type Auth struct {
	// Keys are the client keys.
	Keys []AuthKey `yaml:"keys"`
}

// AuthKey is one client key. Its token is never in the file: the file
// names the environment variable holding it (token_env) or gives its
// SHA-256 digest (token_sha256), exactly one of the two.
type AuthKey struct {
	// Name identifies the key in logs; unique.
	Name string `yaml:"name"`
	// TokenEnv names the environment variable holding the bearer token.
	TokenEnv string `yaml:"token_env"`
	// TokenSHA256 is the SHA-256 digest of the token, 64 hex digits.
	TokenSHA256 string `yaml:"token_sha256"`
	// Models lists the model aliases the key may use; empty: every model.
	Models []string `yaml:"models"`
	// Limits bound what the key may use; a limit left out is none.
	Limits server.KeyLimits `yaml:"limits"`
}

// Log sets logging.
type Log struct {
	// Format is text or json (default text).
	Format string `yaml:"format"`
	// Level is debug, info, warn or error (default info).
	Level string `yaml:"level"`
}

// Telemetry tunes traces and metrics.
type Telemetry struct {
	// CaptureContent records prompts, completions, tool arguments and tool
	// results on spans (default false: they hold user data).
	CaptureContent bool `yaml:"capture_content"`
	// MetadataAttributes lists the keys of a request's metadata whose
	// values are recorded on the turn's span as turnstile.metadata.KEY
	// (default none: values are user data). The turn's log line holds all
	// of them.
	MetadataAttributes []string `yaml:"metadata_attributes"`
}

// Ops configures the ops HTTP listener.
type Ops struct {
	// Listen is the listener's host:port; empty (the default) is no
	// listener. It always serves the probes' /healthz and /readyz.
	Listen string `yaml:"listen"`
	// Metrics serves /metrics in the Prometheus format, which turns
	// metrics on (default true).
	Metrics bool `yaml:"metrics"`
	// PProf also serves Go's profiles at /debug/pprof/, and the runtime's
	// allocation counters (/debug/alloc), a forced collection
	// (POST /debug/gc) and, with a turn store, what its log holds
	// (/debug/store) (default false).
	PProf bool `yaml:"pprof"`
}

// defaults returns a configuration holding every default and no provider
// or model.
func defaults() *Config {
	return &Config{
		Listen: DefaultListen,
		Retry:  policy.DefaultRetry(),
		Turn:   Turn{Limits: runtime.DefaultLimits(), DetachGrace: 30 * time.Second},
		Store:  store.DefaultConfig(),
		Server: defaultServer(),
		Log:    Log{Format: "text", Level: "info"},
		Ops:    Ops{Metrics: true},
	}
}

// newModel returns the model a models entry starts from: the default
// timeouts and the top-level retry policy r.
func newModel(r policy.Retry) Model {
	return Model{FirstTokenTimeout: 60 * time.Second, IdleTimeout: 60 * time.Second, Retry: r, OnStreamCut: runtime.StreamCutRestart, PromptCache: runtime.PromptCacheAuto}
}

// Default returns the configuration used when no file is given: the
// embedded simulator as the only provider and the default model.
func Default() *Config {
	c := defaults()
	t, _ := registry.Lookup("simulator")
	c.Providers = map[string]Provider{"sim": {Type: t.Name, Settings: t.New()}}
	m := newModel(c.Retry)
	m.Provider, m.Model, m.ContextWindow = "sim", "turnstile-sim-1", 32000
	c.Models = map[string]Model{"sim": m}
	c.DefaultModel = "sim"
	return c
}

// Load reads and validates the file at path. Problems with its content
// come as an [*Errors] naming path.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(path, b)
}

// Parse decodes and validates the YAML b; name is the file's name, used in
// messages. It returns every problem found as an [*Errors].
func Parse(name string, b []byte) (*Config, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(b, &root); err != nil {
		return nil, newErrors(name, []Problem{syntaxProblem(err)})
	}
	c := defaults()
	c.file = name
	d := newDecoder()
	d.starts[reflect.TypeFor[Model]()] = func() reflect.Value { return reflect.ValueOf(newModel(c.Retry)) }
	d.starts[reflect.TypeFor[MCPServer]()] = func() reflect.Value { return reflect.ValueOf(newMCPServer()) }
	d.starts[reflect.TypeFor[Deployment]()] = func() reflect.Value { return reflect.ValueOf(newDeployment()) }
	if n := d.resolve(&root, ""); n != nil {
		// The top-level retry first: each model's retry starts from it,
		// wherever the file puts it.
		if n.Kind == yaml.MappingNode {
			var retry *pair
			for _, p := range d.pairs(n, "") {
				if p.key.Kind == yaml.ScalarNode && p.key.Value == "retry" {
					retry = &p
				}
			}
			if retry != nil {
				d.lines["retry"] = retry.key.Line
				d.decode(retry.value, reflect.ValueOf(&c.Retry).Elem(), "retry")
			}
		}
		d.decodeStruct(n, reflect.ValueOf(c).Elem(), "", []string{"retry"}, nil)
	}
	c.lines = d.lines
	if _, set := c.lines["default_model"]; !set && len(c.Models) == 1 {
		for alias := range c.Models {
			c.DefaultModel = alias
		}
	}
	// Left out, the per-address cap follows a smaller max_connections.
	if _, set := c.lines["server.max_connections_per_peer"]; !set && c.Server.MaxConnections > 0 {
		c.Server.MaxConnectionsPerPeer = min(c.Server.MaxConnectionsPerPeer, c.Server.MaxConnections)
	}
	// So does the bound on handshakes, to a quarter of it.
	if _, set := c.lines["server.max_handshakes"]; !set && c.Server.MaxConnections > 0 {
		c.Server.MaxHandshakes = min(c.Server.MaxHandshakes, max(1, c.Server.MaxConnections/4))
	}
	// A key that could not be decoded is reported once, by what was wrong
	// with it, not again by the checks of the value it left behind.
	undecoded := map[string]bool{}
	for _, p := range d.problems {
		undecoded[p.Path] = true
	}
	problems := d.problems
	for _, p := range c.problems() {
		if !undecoded[p.Path] {
			problems = append(problems, p)
		}
	}
	if err := newErrors(name, problems); err != nil {
		return nil, err
	}
	return c, nil
}

// yamlError matches the line yaml.v3 puts in its syntax errors.
var yamlError = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// syntaxProblem turns a YAML syntax error into a Problem.
func syntaxProblem(err error) Problem {
	if m := yamlError.FindStringSubmatch(err.Error()); m != nil {
		line, _ := strconv.Atoi(m[1])
		return Problem{Line: line, Message: "invalid YAML: " + m[2]}
	}
	return Problem{Message: "invalid YAML: " + err.Error()}
}

// decodeNode decodes a providers entry: its type first, then the other
// keys into that type's settings, so an unknown key is suggested one of
// the type's own.
func (p *Provider) decodeNode(d *decoder, n *yaml.Node, path string) {
	if n.Kind != yaml.MappingNode {
		d.expected(n, path, "a block of key: value pairs with a type")
		return
	}
	typePath := join(path, "type")
	var typeNode *yaml.Node
	for _, pr := range d.pairs(n, path) {
		if pr.key.Kind == yaml.ScalarNode && pr.key.Value == "type" {
			typeNode = pr.value
			d.lines[typePath] = pr.key.Line
		}
	}
	if typeNode == nil {
		d.problem(n.Line, typePath, "required: one of %s", list(registry.Names()))
		return
	}
	before := len(d.problems)
	d.decode(typeNode, reflect.ValueOf(&p.Type).Elem(), typePath)
	if len(d.problems) > before {
		return
	}
	if p.Type == "" {
		d.problem(typeNode.Line, typePath, "required: one of %s", list(registry.Names()))
		return
	}
	t, ok := registry.Lookup(p.Type)
	if !ok {
		d.problem(typeNode.Line, typePath, "unknown provider type %q%s (known types: %s)", p.Type, didYouMean(p.Type, registry.Names()), list(registry.Names()))
		return
	}
	p.Settings = t.New()
	d.decodeStruct(n, reflect.ValueOf(p.Settings).Elem(), path, []string{"type"}, func(key string) string {
		return otherTypesKey(key, t.Name)
	})
}

// otherTypesKey explains a key unknown to provider type typ that is, or
// looks like, a key of other types.
func otherTypesKey(key, typ string) string {
	byKey := map[string][]string{}
	var all []string
	for _, name := range registry.Names() {
		if name == typ {
			continue
		}
		other, _ := registry.Lookup(name)
		for _, k := range keys(reflect.TypeOf(other.New()).Elem()) {
			if byKey[k] == nil {
				all = append(all, k)
			}
			byKey[k] = append(byKey[k], name)
		}
	}
	if in := byKey[key]; in != nil {
		return fmt.Sprintf("%s is a key of %s %s, not of %s", key, plural(len(in), "type", "types"), list(in), typ)
	}
	if s := suggest(key, all); s != "" {
		in := byKey[s]
		return fmt.Sprintf("did you mean %s? that is a key of %s %s, not of %s", s, plural(len(in), "type", "types"), list(in), typ)
	}
	return ""
}
