package runtime

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	mathrand "math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
)

// Model is a configured model alias: which provider serves it, under which
// id, and how the turn should treat its failures.
type Model struct {
	// Alias is the name clients use.
	Alias string
	// ProviderName is the configured provider's name, for events and logs.
	ProviderName string
	// Provider serves the model.
	Provider llm.Provider
	// ID is the provider's own model id.
	ID string
	// Fallbacks lists aliases to move to, in order, when this model fails.
	Fallbacks []string
	// ContextWindow is the model's context size in tokens; zero is unknown.
	ContextWindow int
	// MaxOutputTokens is the default output limit per call; zero leaves it
	// to the provider.
	MaxOutputTokens int
	// FirstTokenTimeout bounds the wait for the first chunk; zero is none.
	FirstTokenTimeout time.Duration
	// IdleTimeout bounds the gap between two chunks; zero is none.
	IdleTimeout time.Duration
	// Retry tunes retries on this model.
	Retry policy.Retry
	// Hedge, when not nil, races a second call against a call of this
	// model that is slow to answer (see [HedgeConfig]).
	Hedge *HedgeConfig
	// OnStreamCut says whether text the model streamed before its stream
	// was cut is dropped or continued; empty means [StreamCutRestart].
	OnStreamCut StreamCut
	// Tools, when not nil, lists the server-side tools this model may call.
	Tools []string
	// PromptCache says whether calls ask for the provider's prompt cache;
	// empty means [PromptCacheAuto].
	PromptCache PromptCache
	// Compaction, when not nil, compacts the conversation before a call
	// whose estimated size nears ContextWindow (see [CompactionConfig]).
	Compaction *CompactionConfig
	// Price, when not nil, is what the model's tokens cost: each call's
	// usage carries its cost ([llm.Usage.Cost]). Nil is an unknown price,
	// not a free model.
	Price *llm.Price
	// Input, when not nil, lists the kinds of input the model takes;
	// nil takes what its provider says ([MediaTaker]), or text only.
	Input []llm.Modality
	// Reasoning, when not nil, is the reasoning asked of this model when
	// the request asks for none.
	Reasoning *llm.Reasoning
	// TopP, when not nil, is the top_p of the model's calls when the
	// request sets none (and, on a model that takes temperature or top_p,
	// not both, no temperature either).
	TopP *float64
	// Capabilities, when not nil, overrides what the model's provider says
	// it takes ([Capable]), key by key.
	Capabilities *CapabilitiesConfig
	// Deployments, when not empty, are the places the model is served,
	// each its own provider and model id: turns spread over them by weight
	// (see [Deployment]). Provider, ProviderName and ID may then be left
	// empty (the first deployment's are used). Empty means one deployment,
	// named after ProviderName, of Provider and ID.
	Deployments []Deployment
	// Deployment is the name of the deployment a call of this model goes
	// to: set by the runner on the copies of the model it calls (events
	// and [AttemptInfo] carry it); empty on the models it is given.
	Deployment string

	// key names the deployment's health state; state its routing state.
	// Both are set on the runner's copies.
	key   string
	state *deployState
}

// TurnRequest asks for one turn.
type TurnRequest struct {
	// TurnID identifies the turn; the runner makes one when empty.
	TurnID string
	// Model is the alias to start with; empty means the runner's default.
	Model string
	// System is the system prompt.
	System string
	// Messages is the conversation so far.
	Messages []llm.Message
	// ClientTools are tools the client runs itself: when the model calls
	// one, the turn ends with [EndToolCallsRequired].
	ClientTools []llm.ToolSpec
	// MaxOutputTokens overrides the model's output limit when positive.
	MaxOutputTokens int
	// Temperature is passed to the provider when not nil.
	Temperature *float64
	// TopP is passed to the provider when not nil; nil takes the model's
	// ([Model].TopP).
	TopP *float64
	// StopSequences are passed to the provider.
	StopSequences []string
	// MaxModelCalls overrides the runner's limit when positive.
	MaxModelCalls int
	// OutputSchema, when not nil, asks for a final reply that is one JSON
	// value matching it; the reply is validated (see [WithOutputSchemas]).
	OutputSchema *llm.OutputSchema
	// ToolChoice, when not nil, says which tools the model may or must
	// call. A named tool a fallback model is not offered is not forced on
	// it (auto).
	ToolChoice *llm.ToolChoice
	// Reasoning, when not nil, overrides the model's reasoning default.
	Reasoning *llm.Reasoning
	// Metadata holds the caller's labels of the turn, for logs and spans;
	// its "end_user" ([MetadataEndUser]) goes to the provider.
	Metadata map[string]string
	// Client is the name of the client key that sent the turn, for logs,
	// spans and metrics; empty when the server runs without auth.
	Client string
	// Resume, when set, continues a turn another runner started and did
	// not finish, from what the turn's log holds; see [Resume].
	Resume *Resume
	// Controls, when set, is how the turn's owner decides its tool calls
	// that wait for approval and steers it while it runs; nil gives the
	// turn controls nobody reaches (its approvals time out).
	Controls *Controls
	// Budget, when set, is asked before each model call whether the turn
	// may make it, with what the call may use at most (its bound): a
	// non-nil error (of [llm.KindBudgetExhausted]) ends the turn with it
	// instead. It may hold that bound against the caller's limits until
	// the call's usage is reported (the call's LLMCallFinished and
	// UsageUpdated events, or the turn's end), and wait, until ctx is
	// done, for what other turns hold; the call under way when a budget is
	// crossed finishes, and the next one is not made.
	Budget func(ctx context.Context, next CallBound) error
}

// Runner runs turns. It is safe for concurrent use; its cooldowns and retry
// budgets are shared by every turn it runs.
type Runner struct {
	models       map[string]*Model
	defaultModel string
	tools        map[string]llm.Tool
	toolSpecs    []llm.ToolSpec // sorted by name
	health       *policy.Health
	sharer       sharerSlot // tells other replicas the cooldowns decided here
	// routers pick the deployment of each model, by alias; byKey holds
	// every deployment by the name of its health state.
	routers map[string]*router
	byKey   map[string]*Model
	// latencies holds the recent times to first chunk of the models that
	// hedge at a quantile of them.
	latencies map[string]*latencies
	// approval and endsTurn are the tools of [ToolRules], by name.
	approval map[string]bool
	endsTurn map[string]bool
	opts     options
}

type options struct {
	logger    *slog.Logger
	observer  Observer
	now       func() time.Time
	jitter    func() float64
	newID     func() string
	compactor Compactor
	limits    Limits
	rules     ToolRules
	schemas   OutputSchemas
	// mediaHosts are the hosts a media URI may not name.
	mediaHosts *HostRules
}

// Option configures a [Runner].
type Option func(*options)

// WithLogger sets the logger for what the runner swallows (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithObserver sets the observer of every turn (default: none). Combine
// several with [Observers].
func WithObserver(obs Observer) Option { return func(o *options) { o.observer = obs } }

// WithClock sets the source of event timestamps, and the clock of the
// models' cooldowns and retry budgets (default time.Now).
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithJitter sets the source of backoff jitter draws in [0, 1) (default a
// uniform random source).
func WithJitter(f func() float64) Option { return func(o *options) { o.jitter = f } }

// WithIDs sets the generator of turn ids and missing tool call ids
// (default 16 random hex digits).
func WithIDs(f func() string) Option { return func(o *options) { o.newID = f } }

// WithCompactor sets the strategy that shortens an overflowing conversation
// (default [KeepEnds] with its defaults).
func WithCompactor(c Compactor) Option { return func(o *options) { o.compactor = c } }

// WithRefusedMediaHosts refuses a request whose media name by URI a host
// that h refuses (see [HostRules]): the provider would fetch it. Default:
// none is refused.
func WithRefusedMediaHosts(h *HostRules) Option { return func(o *options) { o.mediaHosts = h } }

// WithOutputSchemas sets the compiler of output schemas, which the runner
// needs to take requests with an output schema (default none: such a
// request is refused).
func WithOutputSchemas(c OutputSchemas) Option { return func(o *options) { o.schemas = c } }

// WithLimits sets the limits of every turn (default [DefaultLimits]).
func WithLimits(l Limits) Option { return func(o *options) { o.limits = l } }

// ErrNoModels is returned by [New] when no model is configured.
var ErrNoModels = errors.New("runtime: no models")

// New returns a Runner over models, starting turns that name no model on
// defaultModel, with the server-side tools given.
func New(models []*Model, defaultModel string, tools []llm.Tool, opts ...Option) (*Runner, error) {
	if len(models) == 0 {
		return nil, ErrNoModels
	}
	r := &Runner{
		models:       make(map[string]*Model, len(models)),
		defaultModel: defaultModel,
		tools:        make(map[string]llm.Tool, len(tools)),
		opts: options{
			logger:    slog.New(slog.DiscardHandler),
			observer:  NopObserver{},
			now:       time.Now,
			jitter:    mathrand.Float64,
			newID:     randomID,
			compactor: KeepEnds{},
			limits:    DefaultLimits(),
		},
	}
	for _, o := range opts {
		o(&r.opts)
	}
	if r.opts.observer == nil {
		r.opts.observer = NopObserver{}
	}
	var errs []error
	for _, m := range models {
		if m.Provider == nil && len(m.Deployments) > 0 {
			d := m.Deployments[0]
			m.Provider, m.ProviderName, m.ID = d.Provider, d.ProviderName, d.ID
		}
		switch {
		case m.Alias == "" || m.Provider == nil:
			errs = append(errs, fmt.Errorf("model %q: alias and provider are required", m.Alias))
		case r.models[m.Alias] != nil:
			errs = append(errs, fmt.Errorf("model %q configured twice", m.Alias))
		default:
			r.models[m.Alias] = m
		}
		for _, p := range m.Retry.Problems() {
			errs = append(errs, fmt.Errorf("model %q: retry.%v", m.Alias, p))
		}
		if m.Hedge != nil {
			for _, p := range m.Hedge.Problems() {
				errs = append(errs, fmt.Errorf("model %q: hedge.%v", m.Alias, p))
			}
		}
		if !m.OnStreamCut.valid() {
			errs = append(errs, fmt.Errorf("model %q: on_stream_cut: %q is not restart or continue", m.Alias, string(m.OnStreamCut)))
		}
		if m.Capabilities != nil {
			for _, p := range m.Capabilities.Problems() {
				errs = append(errs, fmt.Errorf("model %q: capabilities.%v", m.Alias, p))
			}
		}
		if p := m.TopP; p != nil && !(*p >= 0 && *p <= 1) {
			errs = append(errs, fmt.Errorf("model %q: top_p must be from 0 to 1", m.Alias))
		}
	}
	for _, m := range models {
		for _, fb := range m.Fallbacks {
			if r.models[fb] == nil {
				errs = append(errs, fmt.Errorf("model %q: unknown fallback %q", m.Alias, fb))
			}
		}
	}
	if r.models[defaultModel] == nil {
		errs = append(errs, fmt.Errorf("unknown default model %q", defaultModel))
	}
	for _, t := range tools {
		name := t.Spec().Name
		if r.tools[name] != nil {
			errs = append(errs, fmt.Errorf("tool %q registered twice", name))
		}
		r.tools[name] = t
	}
	r.approval, r.endsTurn = map[string]bool{}, map[string]bool{}
	for _, set := range []struct {
		field string
		names []string
		into  map[string]bool
	}{{"require_approval", r.opts.rules.RequireApproval, r.approval}, {"ends_turn", r.opts.rules.EndsTurn, r.endsTurn}} {
		for _, name := range set.names {
			if r.tools[name] == nil {
				errs = append(errs, fmt.Errorf("tool rules: %s: %q is no server-side tool", set.field, name))
			}
			set.into[name] = true
		}
	}
	for _, p := range r.opts.limits.Problems() {
		errs = append(errs, fmt.Errorf("limits: %v", p))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("runtime: %w", errors.Join(errs...))
	}
	r.toolSpecs = r.Tools()
	retries := make(map[string]policy.Retry, len(r.models))
	r.latencies = map[string]*latencies{}
	r.routers = make(map[string]*router, len(r.models))
	r.byKey = make(map[string]*Model, len(r.models))
	for _, alias := range r.Models() {
		m := r.models[alias]
		rt, derrs := newRouter(m)
		errs = append(errs, derrs...)
		r.routers[alias] = rt
		for _, d := range rt.deps {
			if r.byKey[d.key] != nil {
				errs = append(errs, fmt.Errorf("model %q: deployment %q: its state's name %q is another model's", alias, d.Deployment, d.key))
				continue
			}
			r.byKey[d.key] = d
			retries[d.key] = m.Retry
			if m.Hedge != nil && m.Hedge.After.quantile > 0 {
				r.latencies[d.key] = &latencies{}
			}
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("runtime: %w", errors.Join(errs...))
	}
	r.health = policy.NewHealth(retries, r.opts.now)
	return r, nil
}

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// FieldError is a request field that fails validation.
type FieldError struct {
	// Field is the field's path, e.g. "messages[2].parts[0].tool_call.id".
	Field string
	// Description says what is wrong with it.
	Description string
}

// Error returns "Field: Description".
func (e *FieldError) Error() string { return e.Field + ": " + e.Description }

// Validate checks what only the runner knows about a request: that its
// model exists and takes the request's media and generation options (its
// stop sequences, temperature and top_p, within the limits of every
// deployment of the model: [Capable]), and its client tools do not clash
// with server tools. It returns every problem, each a [*FieldError],
// joined with [errors.Join].
func (r *Runner) Validate(req *TurnRequest) error {
	var errs []error
	if req.Model != "" && r.models[req.Model] == nil {
		// %.64q: the client's text is quoted back, but not all of it.
		errs = append(errs, &FieldError{Field: "model", Description: fmt.Sprintf("unknown model %.64q; configured: %v", req.Model, r.Models())})
	} else {
		alias := cmp.Or(req.Model, r.defaultModel)
		m := r.models[alias]
		for _, ref := range requestMedia(req.Messages) {
			if msg := mediaProblem(m, ref.media); msg != "" {
				errs = append(errs, &FieldError{Field: ref.field, Description: msg})
			}
		}
		seen := map[string]bool{}
		for _, d := range r.routers[alias].deps {
			for _, err := range optionProblems(d, req) {
				if f := err.(*FieldError).Field; !seen[f] {
					seen[f] = true
					errs = append(errs, err)
				}
			}
		}
	}
	for _, ref := range requestMedia(req.Messages) {
		if ref.media.URI == "" {
			continue
		}
		if msg := r.opts.mediaHosts.Refused(ref.media.URI); msg != "" {
			errs = append(errs, &FieldError{Field: ref.field + ".uri", Description: msg})
		}
	}
	for i, t := range req.ClientTools {
		if r.tools[t.Name] != nil {
			errs = append(errs, &FieldError{Field: fmt.Sprintf("tools[%d].name", i), Description: fmt.Sprintf("%q is a server-side tool", t.Name)})
		}
	}
	errs = append(errs, r.validateOptions(req)...)
	return errors.Join(errs...)
}

// DefaultModel returns the alias of the model a request naming none runs on.
func (r *Runner) DefaultModel() string { return r.defaultModel }

// Models returns the configured aliases, sorted.
func (r *Runner) Models() []string {
	out := make([]string, 0, len(r.models))
	for a := range r.models {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}

// Health returns the shared state of every model (retry budget, cooldown),
// sorted by alias, one per deployment of a model of several (Deployment
// names it): a copy, for gauges and status pages.
func (r *Runner) Health() []policy.ModelHealth {
	out := r.health.Snapshot()
	for i, h := range out {
		if d := r.byKey[h.Alias]; d != nil && d.routed() {
			out[i].Alias, out[i].Deployment = d.Alias, d.Deployment
		}
	}
	return out
}

// Tools returns the specs of the server-side tools, sorted by name.
func (r *Runner) Tools() []llm.ToolSpec {
	out := make([]llm.ToolSpec, 0, len(r.tools))
	for _, t := range r.tools {
		out = append(out, t.Spec())
	}
	slices.SortFunc(out, func(a, b llm.ToolSpec) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Run runs one turn, emitting its events into sink in order. It returns the
// turn's outcome, which it also emitted as the last event, or a
// [*TurnError] equal to the last event emitted. When the sink fails, Run
// stops and returns a TurnError it could not emit. Run blocks until the
// turn ends; when ctx is done it stops the model call and tools at once
// and emits nothing more of them. A turn whose ctx ends with a cause of
// class [llm.KindCancelled] (context.Canceled, or an [*llm.Error] of that
// kind: its caller cancelled it) then commits what closes its
// conversation, each a MessageCompleted: the reply it was writing as far
// as it got (its complete tool calls included), a result for each tool
// call of its last reply left without one ([CancelledToolResult]), and a
// user message, [InterruptedNote] or [InterruptedToolUseNote]; a client
// that appends every committed message to its conversation can send the
// next turn from it. Any other end of ctx (its deadline, a shutdown's
// cause) emits only the terminal error. A panic in the turn ends it with
// [llm.KindInternal].
func (r *Runner) Run(ctx context.Context, req *TurnRequest, sink Sink) (res *TurnCompleted, err error) {
	t, ctx, cancel := newTurn(ctx, r, req, sink)
	defer cancel(nil)
	ctx = t.obs.TurnStart(ctx, t.info)
	defer func() {
		if p := recover(); p != nil {
			r.opts.logger.Error("turn panicked", "turn_id", t.info.TurnID, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			res, err = nil, t.fail(ctx, &llm.Error{Kind: llm.KindInternal, Message: "internal error", Err: fmt.Errorf("panic: %v", p)})
		}
		t.end(ctx, res, err)
	}()
	return t.run(ctx)
}

// Events runs a turn like [Runner.Run] and returns its events as an
// iterator. The turn runs as the iteration proceeds, on the caller's
// goroutine; stopping the iteration early cancels it.
func (r *Runner) Events(ctx context.Context, req *TurnRequest) iter.Seq[Event] {
	return func(yield func(Event) bool) {
		stopped := errors.New("iteration stopped")
		_, _ = r.Run(ctx, req, SinkFunc(func(_ context.Context, ev Event) error {
			if !yield(ev) {
				return stopped
			}
			return nil
		}))
	}
}
