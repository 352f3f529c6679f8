package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	mathrand "math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/turnstile-dev/turnstile/policy"

	"github.com/turnstile-dev/turnstile/llm"
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
	// Tools, when not nil, lists the server-side tools this model may call.
	Tools []string
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
	// StopSequences are passed to the provider.
	StopSequences []string
	// MaxModelCalls overrides the runner's limit when positive.
	MaxModelCalls int
}

// ContinuationPrompt is the user message the runner adds after a reply cut
// short by the output token limit.
const ContinuationPrompt = "Your previous reply was cut off by the output token limit. Continue exactly where it stopped, without repeating or summarising anything."

// Runner runs turns. It is safe for concurrent use; its cooldowns and retry
// budgets are shared by every turn it runs.
type Runner struct {
	models       map[string]*Model
	defaultModel string
	tools        map[string]llm.Tool
	toolSpecs    []llm.ToolSpec // sorted by name
	health       *policy.Health
	opts         options
}

type options struct {
	logger    *slog.Logger
	now       func() time.Time
	jitter    func() float64
	newID     func() string
	compactor Compactor
	limits    Limits
}

// Option configures a [Runner].
type Option func(*options)

// WithLogger sets the logger for what the runner swallows (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithClock sets the source of event timestamps and cooldown times
// (default time.Now).
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
	for _, m := range models {
		if m.Alias == "" || m.Provider == nil {
			return nil, fmt.Errorf("runtime: model %q: alias and provider are required", m.Alias)
		}
		if _, dup := r.models[m.Alias]; dup {
			return nil, fmt.Errorf("runtime: model %q configured twice", m.Alias)
		}
		r.models[m.Alias] = m
	}
	for _, m := range models {
		for _, fb := range m.Fallbacks {
			if _, ok := r.models[fb]; !ok {
				return nil, fmt.Errorf("runtime: model %q: unknown fallback %q", m.Alias, fb)
			}
		}
	}
	if _, ok := r.models[defaultModel]; !ok {
		return nil, fmt.Errorf("runtime: unknown default model %q", defaultModel)
	}
	for _, t := range tools {
		name := t.Spec().Name
		if _, dup := r.tools[name]; dup {
			return nil, fmt.Errorf("runtime: tool %q registered twice", name)
		}
		r.tools[name] = t
	}
	if p := r.opts.limits.Problems(); len(p) > 0 {
		return nil, fmt.Errorf("runtime: limits: %v", p[0])
	}
	r.toolSpecs = r.Tools()
	retries := make(map[string]policy.Retry, len(r.models))
	for alias, m := range r.models {
		retries[alias] = m.Retry
	}
	r.health = policy.NewHealth(retries)
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
// model exists and its client tools do not clash with server tools.
func (r *Runner) Validate(req *TurnRequest) error {
	if req.Model != "" {
		if _, ok := r.models[req.Model]; !ok {
			return &FieldError{Field: "model", Description: fmt.Sprintf("unknown model %q; configured: %v", req.Model, r.Models())}
		}
	}
	for i, t := range req.ClientTools {
		if _, ok := r.tools[t.Name]; ok {
			return &FieldError{Field: fmt.Sprintf("tools[%d].name", i), Description: fmt.Sprintf("%q is a server-side tool", t.Name)}
		}
	}
	return nil
}

// Models returns the configured aliases, sorted.
func (r *Runner) Models() []string {
	out := make([]string, 0, len(r.models))
	for a := range r.models {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}

// Tools returns the specs of the server-side tools, sorted by name.
func (r *Runner) Tools() []llm.ToolSpec {
	out := make([]llm.ToolSpec, 0, len(r.tools))
	for _, t := range r.tools {
		out = append(out, t.Spec())
	}
	slices.SortFunc(out, func(a, b llm.ToolSpec) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

// Run runs one turn, emitting its events into sink in order. It returns the
// turn's outcome, which it also emitted as the last event, or a
// [*TurnError] equal to the last event emitted. When the sink fails, Run
// stops and returns a TurnError it could not emit. Run blocks until the
// turn ends; when ctx is done it stops the model call and tools at once and
// emits only the terminal error. A panic in the turn ends it with
// [KindInternal].
func (r *Runner) Run(ctx context.Context, req *TurnRequest, sink Sink) (res *TurnCompleted, err error) {
	t := &turn{r: r, req: req, sink: sink, id: req.TurnID}
	if t.id == "" {
		t.id = r.opts.newID()
	}
	defer func() {
		if p := recover(); p != nil {
			r.opts.logger.Error("turn panicked", "turn_id", t.id, "panic", p)
			res, err = nil, t.fail(ctx, &llm.Error{Kind: llm.KindInternal, Message: "internal error"})
		}
	}()
	return t.run(ctx)
}

// Events runs a turn like [Runner.Run] and returns its events as an
// iterator. The turn runs as the iteration proceeds, on the caller's
// goroutine; stopping the iteration early cancels it.
func (r *Runner) Events(ctx context.Context, req *TurnRequest) iter.Seq[Event] {
	return func(yield func(Event) bool) {
		stopped := errors.New("iteration stopped")
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		_, _ = r.Run(ctx, req, SinkFunc(func(_ context.Context, ev Event) error {
			if !yield(ev) {
				cancel(stopped)
				return stopped
			}
			return nil
		}))
	}
}

// turn is the state of one running turn.
type turn struct {
	r    *Runner
	req  *TurnRequest
	sink Sink
	id   string

	mu       sync.Mutex // serialises emit from parallel tools
	seq      uint64
	sinkErr  error
	usage    llm.Usage
	counters Counters
	attempts []ModelAttempts

	chain []*Model
	pos   int
	probe string // alias being probed, released when the turn ends

	conv  []llm.Message // the conversation as the model sees it
	added []llm.Message // the messages the turn committed
	// unsafeRunning counts the tools with side effects started since the
	// last commit: replaying the step could run them twice.
	unsafeRunning int
	// breaker counts each tool's consecutive failures in this turn.
	breaker map[string]int
}

func (t *turn) emit(ctx context.Context, ev Event) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sinkErr != nil {
		return t.sinkErr
	}
	t.seq++
	ev.Seq, ev.Time, ev.TurnID = t.seq, t.r.opts.now(), t.id
	if err := t.sink.Emit(ctx, ev); err != nil {
		t.sinkErr = fmt.Errorf("runtime: emit: %w", err)
		return t.sinkErr
	}
	return nil
}

func (t *turn) nextSeq() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.seq + 1
}

func (t *turn) run(ctx context.Context) (*TurnCompleted, error) {
	r := t.r
	alias := t.req.Model
	if alias == "" {
		alias = r.defaultModel
	}
	t.buildChain(alias)
	t.conv = slices.Clone(t.req.Messages)
	defer func() {
		if t.probe != "" {
			r.health.Release(t.probe)
		}
	}()

	if err := t.emit(ctx, Event{TurnStarted: &TurnStarted{Model: alias}}); err != nil {
		return nil, t.sinkFailure(ctx)
	}
	t.pickStart()

	maxCalls := r.opts.limits.MaxModelCalls
	if t.req.MaxModelCalls > 0 {
		maxCalls = t.req.MaxModelCalls
	}
	continuations := 0
	for {
		if t.counters.ModelCalls >= maxCalls {
			return t.complete(ctx, EndMaxModelCalls)
		}
		msg, stop, err := t.step(ctx, maxCalls)
		if err != nil {
			return nil, t.fail(ctx, err)
		}
		if err := t.commit(ctx, msg); err != nil {
			return nil, t.sinkFailure(ctx)
		}
		calls := msg.ToolCalls()
		if len(calls) > 0 {
			done, err := t.runTools(ctx, calls)
			if err != nil {
				return nil, t.fail(ctx, err)
			}
			if !done {
				return t.complete(ctx, EndToolCallsRequired)
			}
			continue
		}
		switch stop {
		case llm.StopMaxTokens:
			if continuations >= r.opts.limits.MaxContinuations {
				return t.complete(ctx, EndMaxTokens)
			}
			continuations++
			if err := t.commit(ctx, llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(ContinuationPrompt)}}); err != nil {
				return nil, t.sinkFailure(ctx)
			}
		case llm.StopPauseTurn:
			// The provider paused a long turn: sending the conversation
			// again continues it.
		case llm.StopRefusal:
			return t.complete(ctx, EndRefusal)
		case llm.StopSequence:
			return t.complete(ctx, EndStopSequence)
		default:
			return t.complete(ctx, EndTurn)
		}
	}
}

// buildChain resolves alias and its fallbacks, in order, without repeats.
func (t *turn) buildChain(alias string) {
	seen := map[string]bool{}
	var add func(a string)
	add = func(a string) {
		m := t.r.models[a]
		if m == nil || seen[a] {
			return
		}
		seen[a] = true
		t.chain = append(t.chain, m)
	}
	add(alias)
	for _, fb := range t.r.models[alias].Fallbacks {
		add(fb)
	}
}

// pickStart places the turn on the first model of its chain that is not
// cooling down. When every model is, the turn still gets its one chance on
// the model whose cooldown ends first: cooldowns steer turns to healthy
// models, they never take away a turn's only option. The retry budget then
// keeps such turns from retrying a model that keeps failing.
func (t *turn) pickStart() {
	now := t.r.opts.now()
	soonest, until := 0, time.Time{}
	for i, m := range t.chain {
		a := t.r.health.Admit(m.Alias, now)
		if a.OK {
			t.pos = i
			if a.Probe {
				t.probe = m.Alias
			}
			return
		}
		if until.IsZero() || a.Until.Before(until) {
			soonest, until = i, a.Until
		}
	}
	t.pos = soonest
}

// nextModel returns the index of the next model of the chain after the
// current one that is not cooling down, or -1.
func (t *turn) nextModel(reserve bool) int {
	now := t.r.opts.now()
	for i := t.pos + 1; i < len(t.chain); i++ {
		if !reserve {
			if t.r.health.Available(t.chain[i].Alias, now) {
				return i
			}
			continue
		}
		a := t.r.health.Admit(t.chain[i].Alias, now)
		if a.OK {
			if a.Probe {
				if t.probe != "" {
					t.r.health.Release(t.probe)
				}
				t.probe = t.chain[i].Alias
			}
			return i
		}
	}
	return -1
}

func (t *turn) hasLargerFallback(from int) bool {
	cur := t.chain[t.pos].ContextWindow
	if cur == 0 {
		return false
	}
	for i := from; i < len(t.chain); i++ {
		if t.chain[i].ContextWindow > cur {
			return true
		}
	}
	return false
}

func (t *turn) commit(ctx context.Context, m llm.Message) error {
	t.conv = append(t.conv, m)
	t.added = append(t.added, m)
	return t.emit(ctx, Event{MessageCompleted: &MessageCompleted{Message: m}})
}

func (t *turn) complete(ctx context.Context, reason EndReason) (*TurnCompleted, error) {
	tc := &TurnCompleted{Reason: reason, Messages: t.added, Usage: t.usage, Counters: t.counters}
	if err := t.emit(ctx, Event{TurnCompleted: tc}); err != nil {
		return nil, t.sinkFailure(ctx)
	}
	return tc, nil
}

// sinkFailure reports a turn that could not emit its events.
func (t *turn) sinkFailure(ctx context.Context) *TurnError {
	e := llm.AsError(t.ctxErr(ctx))
	if ctx.Err() == nil {
		e = &llm.Error{Kind: llm.KindInternal, Message: "the event stream failed", Err: t.sinkErr}
	}
	return t.toTurnError(e, policy.Decision{})
}

// ctxErr returns the cause of ctx's end, or nil while it is live.
func (t *turn) ctxErr(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	return context.Cause(ctx)
}

// fail emits the terminal error for err and returns it.
func (t *turn) fail(ctx context.Context, err error) *TurnError {
	var te *TurnError
	if errors.As(err, &te) {
		_ = t.emit(context.WithoutCancel(ctx), Event{Error: te})
		return te
	}
	te = t.toTurnError(llm.AsError(err), policy.Decision{})
	_ = t.emit(context.WithoutCancel(ctx), Event{Error: te})
	return te
}

// toTurnError builds the terminal error for e, with the retry advice it
// deserves.
func (t *turn) toTurnError(e *llm.Error, d policy.Decision) *TurnError {
	te := &TurnError{Kind: e.Kind, Message: e.Message, Model: e.Model, Attempts: slices.Clone(t.attempts)}
	if te.Message == "" {
		te.Message = e.Kind.String()
	}
	advice := policy.Advise(e.Kind, t.unsafeRunning > 0)
	retryable := advice.Retryable
	if advice.Kind != e.Kind {
		te.Kind = advice.Kind
		te.Message += "; a tool with side effects was interrupted, check its effects before retrying"
	}
	te.Retryable = &retryable
	if retryable {
		te.RetryAfter = max(d.RetryAfter, e.RetryAfter)
	}
	return te
}

// Error returns the kind and message.
func (e *TurnError) Error() string { return e.Kind.String() + ": " + e.Message }

// countAttempt records an attempt on alias; err is nil when it succeeded.
func (t *turn) countAttempt(alias string, err *llm.Error) {
	n := len(t.attempts)
	if n == 0 || t.attempts[n-1].Model != alias {
		t.attempts = append(t.attempts, ModelAttempts{Model: alias})
		n++
	}
	a := &t.attempts[n-1]
	a.Attempts++
	a.Succeeded = err == nil
	if err != nil {
		a.LastKind = err.Kind
	}
}
