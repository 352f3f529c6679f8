package runtime

import (
	"context"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
)

// Observer watches turns from outside the loop: it is where traces,
// metrics and logs attach. The runner calls its hooks on the turn's own
// goroutine (tool hooks on the tool's goroutine), in order, and never
// waits for anything but the hook itself: hooks must be quick and must not
// block. Hooks that return a context return ctx itself or a child of it
// (for example one carrying a span); the runner uses it for what the hook
// opens: the rest of the turn, the model call (its provider request
// included) or the tool call.
//
// Embed [NopObserver] to implement only some hooks. An Observer must be
// safe for concurrent use: turns run in parallel, and so do the tool calls
// of one message.
type Observer interface {
	// TurnStart is called once a turn is accepted, before its first event.
	TurnStart(ctx context.Context, t TurnInfo) context.Context
	// TurnEnd is called after the turn's last event was emitted (or could
	// not be).
	TurnEnd(ctx context.Context, t TurnInfo, end TurnEnd)
	// AttemptStart is called before a model call is sent.
	AttemptStart(ctx context.Context, a AttemptInfo) context.Context
	// AttemptFirstChunk is called when the model call yields its first
	// chunk, ttfc after the call started.
	AttemptFirstChunk(ctx context.Context, a AttemptInfo, ttfc time.Duration)
	// AttemptEnd is called when the model call ended, successfully or not.
	AttemptEnd(ctx context.Context, a AttemptInfo, end AttemptEnd)
	// Decision is called for each decision the policy takes after a failed
	// model call: retry (with its wait), fallback, compaction or failure.
	Decision(ctx context.Context, d DecisionInfo)
	// Compaction is called for each compaction of the turn's conversation,
	// whatever its trigger (before a call, after an overflow) and strategy,
	// once the conversation was shortened.
	Compaction(ctx context.Context, c CompactionInfo)
	// ToolStart is called before a server-side tool runs.
	ToolStart(ctx context.Context, t ToolInfo) context.Context
	// ToolEnd is called when the tool returned.
	ToolEnd(ctx context.Context, t ToolInfo, end ToolEnd)
	// Approval is called for each decision on a tool call that waited
	// for approval, once the turn acts on it.
	Approval(ctx context.Context, a ApprovalInfo)
	// Steer is called for each steering message the turn commits.
	Steer(ctx context.Context, s SteerInfo)
}

// TurnInfo identifies a turn to an [Observer].
type TurnInfo struct {
	TurnID string
	// Model is the alias the turn starts on (after the default applied).
	Model string
	// Request is the turn's request. Observers must not change it.
	Request *TurnRequest
	// Start is when the turn started.
	Start time.Time
}

// TurnEnd is how a turn ended.
type TurnEnd struct {
	// Completed is the outcome of a turn that completed; nil on failure.
	Completed *TurnCompleted
	// Err is the failure of a turn that failed; nil on success. Its Cause
	// holds the root cause, for logs.
	Err *TurnError
	// Usage and Counters are the turn's totals, failed attempts included.
	Usage    llm.Usage
	Counters Counters
	// Attempts lists the attempts made, per model, in order.
	Attempts []ModelAttempts
	// ServedBy is the alias of the model whose reply was last committed;
	// empty when none was.
	ServedBy string
	// TimeToFirstOutput is the delay from the turn's start to its first
	// streamed output (text, thinking or tool call); zero when none.
	TimeToFirstOutput time.Duration
	// Waited is the time the turn spent in backoff waits.
	Waited time.Duration
	// Duration is the turn's wall time.
	Duration time.Duration
}

// AttemptInfo identifies one model call to an [Observer].
type AttemptInfo struct {
	TurnID string
	// Model is the alias called; Provider the configured provider's name;
	// ProviderModel the provider's own model id.
	Model         string
	Provider      string
	ProviderModel string
	// Deployment is the deployment of Model called (see [Deployment]).
	Deployment string
	// Attempt counts attempts on this model in this step, from 1; Call
	// counts model calls in the turn, from 1; Step counts the turn's
	// steps (one assistant message each), from 1.
	Attempt int
	Call    int
	Step    int
	// Request is what is sent. Observers must not change it.
	Request *llm.Request
	// HedgeFrom is set on a hedged call: the alias of the slow call it
	// races, which had gone HedgeAfter without output.
	HedgeFrom  string
	HedgeAfter time.Duration
	// Continues reports that the call continues a reply cut short (by the
	// output limit, or a cut stream kept): its output extends that reply.
	Continues bool
}

// AttemptEnd is how a model call ended.
type AttemptEnd struct {
	// Usage is the call's usage; failed calls may cost tokens too.
	Usage llm.Usage
	// Estimated is what the call is charged when its provider reported no
	// usage of it although it read its prompt, or may have (see
	// [LLMCallFinished].Estimated); zero otherwise, and always with Usage.
	Estimated llm.Usage
	// Stop is why the reply ended, when the call succeeded.
	Stop llm.StopReason
	// ResponseModel is the id of the model that served the reply, as the
	// provider reported it; empty when it did not, or the call failed.
	ResponseModel string
	// ResponseID is the provider's id of the reply; empty when it did not
	// say, or the call failed.
	ResponseID string
	// Message is the reply, when the call succeeded (its Role is zero
	// otherwise). Observers must not change it.
	Message llm.Message
	// Err is the call's classified failure, nil when it succeeded. Its
	// Kind is the class the policy decided on.
	Err *llm.Error
	// Streamed reports that output reached the turn's events.
	Streamed bool
	// Lost reports that the call was cancelled because the other call of
	// its hedged pair answered first; Err is then KindCancelled.
	Lost bool
	// Duration is the call's wall time; TimeToFirstChunk the delay to its
	// first chunk, zero when none came.
	Duration         time.Duration
	TimeToFirstChunk time.Duration
}

// DecisionInfo is a decision the policy took after a failed model call.
type DecisionInfo struct {
	TurnID string
	// Model is the alias that failed, Attempt its attempt number.
	Model   string
	Attempt int
	// Kind is the class of the failure.
	Kind llm.Kind
	// Action is what the turn does next; Delay the wait before a retry;
	// Cooldown how long new turns skip the model (zero: not at all); To
	// the model a fallback moves to.
	Action   policy.Action
	Delay    time.Duration
	Cooldown time.Duration
	To       string
	// Deployment is the deployment of Model that failed; ToDeployment the
	// deployment of the same model a retry moves to, empty when the retry
	// stays on Deployment.
	Deployment   string
	ToDeployment string
}

// CompactionInfo is a compaction of a turn's conversation.
type CompactionInfo struct {
	TurnID string
	// Model is the alias whose context window the conversation was
	// compacted for.
	Model string
	// BeforeCall reports a compaction before a call to Model, because the
	// conversation neared its window (models.ALIAS.compaction); false is
	// one after Model's provider refused attempt Attempt as too long.
	BeforeCall bool
	Attempt    int
	// Strategy is the strategy that compacted: keep_ends, or summarize;
	// keep_ends too when a summary was asked for but nothing was to be
	// summarized, or the summary failed (SummaryError says why).
	Strategy string
	// MessagesBefore and MessagesAfter count the conversation's messages.
	MessagesBefore int
	MessagesAfter  int
	// SummaryModel is the alias asked for a summary (strategy summarize),
	// empty when none was asked; SummaryProvider its configured provider's
	// name. SummaryUsage is what the summary call used, its cost included
	// (zero when no call was made).
	SummaryModel    string
	SummaryProvider string
	SummaryUsage    llm.Usage
	SummaryError    string
}

// ToolInfo identifies one server-side tool call to an [Observer].
type ToolInfo struct {
	TurnID string
	CallID string
	Name   string
	// Arguments is the call's JSON arguments.
	Arguments string
	// ReadOnly and Idempotent are the tool's safety hints.
	ReadOnly   bool
	Idempotent bool
}

// ToolEnd is how a tool call ended.
type ToolEnd struct {
	// Content is the result the model sees; IsError reports a failure.
	Content string
	IsError bool
	// Duration is the call's wall time.
	Duration time.Duration
}

// ApprovalInfo is a decision on a tool call that waited for approval.
type ApprovalInfo struct {
	TurnID string
	CallID string
	Name   string
	// Approved reports that the tool may run; TimedOut that nobody
	// decided before the approval timeout, which denied it.
	Approved bool
	TimedOut bool
	// DecidedBy names the client key that decided; empty when TimedOut
	// or without keys.
	DecidedBy string
	// Waited is how long the call waited for the decision.
	Waited time.Duration
}

// SteerInfo is a steering message the turn committed. Observers get its
// size, never its text.
type SteerInfo struct {
	TurnID string
	// Bytes is the size of the message's text.
	Bytes int
}

// NopObserver is an [Observer] whose hooks do nothing. Embed it to
// implement only some hooks.
type NopObserver struct{}

// TurnStart returns ctx.
func (NopObserver) TurnStart(ctx context.Context, _ TurnInfo) context.Context { return ctx }

// TurnEnd does nothing.
func (NopObserver) TurnEnd(context.Context, TurnInfo, TurnEnd) {}

// AttemptStart returns ctx.
func (NopObserver) AttemptStart(ctx context.Context, _ AttemptInfo) context.Context { return ctx }

// AttemptFirstChunk does nothing.
func (NopObserver) AttemptFirstChunk(context.Context, AttemptInfo, time.Duration) {}

// AttemptEnd does nothing.
func (NopObserver) AttemptEnd(context.Context, AttemptInfo, AttemptEnd) {}

// Decision does nothing.
func (NopObserver) Decision(context.Context, DecisionInfo) {}

// Compaction does nothing.
func (NopObserver) Compaction(context.Context, CompactionInfo) {}

// ToolStart returns ctx.
func (NopObserver) ToolStart(ctx context.Context, _ ToolInfo) context.Context { return ctx }

// ToolEnd does nothing.
func (NopObserver) ToolEnd(context.Context, ToolInfo, ToolEnd) {}

// Approval does nothing.
func (NopObserver) Approval(context.Context, ApprovalInfo) {}

// Steer does nothing.
func (NopObserver) Steer(context.Context, SteerInfo) {}

// Observers returns an [Observer] that calls each of obs in order; the
// context one hook returns is passed to the next. Nil entries are skipped.
func Observers(obs ...Observer) Observer {
	var list multiObserver
	for _, o := range obs {
		if o != nil {
			list = append(list, o)
		}
	}
	switch len(list) {
	case 0:
		return NopObserver{}
	case 1:
		return list[0]
	}
	return list
}

type multiObserver []Observer

func (m multiObserver) TurnStart(ctx context.Context, t TurnInfo) context.Context {
	for _, o := range m {
		ctx = o.TurnStart(ctx, t)
	}
	return ctx
}

func (m multiObserver) TurnEnd(ctx context.Context, t TurnInfo, end TurnEnd) {
	for _, o := range m {
		o.TurnEnd(ctx, t, end)
	}
}

func (m multiObserver) AttemptStart(ctx context.Context, a AttemptInfo) context.Context {
	for _, o := range m {
		ctx = o.AttemptStart(ctx, a)
	}
	return ctx
}

func (m multiObserver) AttemptFirstChunk(ctx context.Context, a AttemptInfo, ttfc time.Duration) {
	for _, o := range m {
		o.AttemptFirstChunk(ctx, a, ttfc)
	}
}

func (m multiObserver) AttemptEnd(ctx context.Context, a AttemptInfo, end AttemptEnd) {
	for _, o := range m {
		o.AttemptEnd(ctx, a, end)
	}
}

func (m multiObserver) Decision(ctx context.Context, d DecisionInfo) {
	for _, o := range m {
		o.Decision(ctx, d)
	}
}

func (m multiObserver) Compaction(ctx context.Context, c CompactionInfo) {
	for _, o := range m {
		o.Compaction(ctx, c)
	}
}

func (m multiObserver) ToolStart(ctx context.Context, t ToolInfo) context.Context {
	for _, o := range m {
		ctx = o.ToolStart(ctx, t)
	}
	return ctx
}

func (m multiObserver) ToolEnd(ctx context.Context, t ToolInfo, end ToolEnd) {
	for _, o := range m {
		o.ToolEnd(ctx, t, end)
	}
}

func (m multiObserver) Approval(ctx context.Context, a ApprovalInfo) {
	for _, o := range m {
		o.Approval(ctx, a)
	}
}

func (m multiObserver) Steer(ctx context.Context, st SteerInfo) {
	for _, o := range m {
		o.Steer(ctx, st)
	}
}
