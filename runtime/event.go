package runtime

import (
	"context"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// A Sink receives a turn's events in order, one at a time. Emit blocks
// while the consumer is slow, which slows the turn down: no event is dropped
// and nothing is buffered without bound. An error from Emit ends the turn:
// the runner cancels the turn's context once and emits nothing more.
type Sink interface {
	Emit(ctx context.Context, ev Event) error
}

// SinkFunc adapts a function to a [Sink].
type SinkFunc func(ctx context.Context, ev Event) error

// Emit calls f(ctx, ev).
func (f SinkFunc) Emit(ctx context.Context, ev Event) error { return f(ctx, ev) }

// Event is one step of a turn, a plain value that can be stored and replayed.
// Seq starts at 1 and has no gaps within a turn. The last event of every
// turn has a *TurnCompleted or a *TurnError payload.
type Event struct {
	// Seq numbers the event within its turn, from 1.
	Seq uint64
	// Time is when the event happened.
	Time time.Time
	// TurnID identifies the turn.
	TurnID string
	// Payload is what happened: one of the payload types of this package.
	Payload Payload
}

// Terminal reports whether ev ends its turn.
func (ev Event) Terminal() bool {
	switch ev.Payload.(type) {
	case *TurnCompleted, *TurnError:
		return true
	}
	return false
}

// Payload is the content of an [Event]. The set of payloads is closed:
// *TurnStarted, *LLMCallStarted, *TextDelta, *ThinkingDelta,
// *ToolCallDelta, *LLMCallFinished, *UsageUpdated, *Retry, *Fallback,
// *Hedge, *Compaction, *MessageCompleted, *ToolStarted, *ToolProgress,
// *ToolFinished, *ToolApprovalRequested, *ToolApprovalDecided, *Steered,
// *TurnCompleted and *TurnError. A consumer that maps them
// (the server does, to the wire) must handle every one; the server's tests
// fail when a payload of this package has no mapping.
type Payload interface {
	isPayload()
}

func (*TurnStarted) isPayload()           {}
func (*LLMCallStarted) isPayload()        {}
func (*TextDelta) isPayload()             {}
func (*ThinkingDelta) isPayload()         {}
func (*ToolCallDelta) isPayload()         {}
func (*LLMCallFinished) isPayload()       {}
func (*UsageUpdated) isPayload()          {}
func (*Retry) isPayload()                 {}
func (*Fallback) isPayload()              {}
func (*Hedge) isPayload()                 {}
func (*Compaction) isPayload()            {}
func (*MessageCompleted) isPayload()      {}
func (*ToolStarted) isPayload()           {}
func (*ToolProgress) isPayload()          {}
func (*ToolFinished) isPayload()          {}
func (*TurnCompleted) isPayload()         {}
func (*ToolApprovalRequested) isPayload() {}
func (*ToolApprovalDecided) isPayload()   {}
func (*Steered) isPayload()               {}
func (*TurnError) isPayload()             {}

// TurnStarted opens a turn.
type TurnStarted struct {
	// Model is the alias the turn asked for (after applying the default).
	Model string
}

// LLMCallStarted opens one attempt at a model call.
type LLMCallStarted struct {
	// Model is the model alias called.
	Model string
	// Provider is the configured provider name.
	Provider string
	// ProviderModel is the provider's own model id.
	ProviderModel string
	// Deployment is the deployment of Model that serves the call: its
	// provider's name for a model of one deployment (see [Deployment]).
	Deployment string
	// Attempt counts attempts on this model for this step, from 1.
	Attempt int
	// Call counts model calls in the turn, from 1, retries included.
	Call int
}

// TextDelta is a fragment of the reply's text.
type TextDelta struct{ Text string }

// ThinkingDelta is a fragment of the model's reasoning, or the signature of
// a reasoning block.
type ThinkingDelta struct {
	Text      string
	Signature string
}

// ToolCallDelta is a fragment of a tool call as the model writes it.
type ToolCallDelta struct {
	// Index is the call's position within the message.
	Index int
	// CallID and Name are set on the call's first delta.
	CallID string
	Name   string
	// ArgumentsDelta is a fragment of the JSON arguments.
	ArgumentsDelta string
}

// MessageCompleted carries a message exactly as committed to the
// conversation: an assistant reply after its stream completed, or the tool
// results of a step. A reply continued over several model calls (cut by the
// output token limit, or a cut stream continued) is committed once, when
// its last call completes: every text delta until then belongs to it. A
// turn that fails or runs out of model calls while continuing a reply cut
// by the output limit commits what it has before it ends. A cancelled
// turn commits what closes its conversation (see [Runner.Run]): the
// reply cut short, cancelled tool results, and a user message saying the
// user interrupted it.
type MessageCompleted struct{ Message llm.Message }

// ToolStarted says a server-side tool began running.
type ToolStarted struct {
	CallID    string
	Name      string
	Arguments string
}

// ToolProgress relays a running tool's progress report.
type ToolProgress struct {
	CallID string
	Name   string
	llm.ToolProgress
}

// ToolFinished says a tool call ended, with the result the model will see.
type ToolFinished struct {
	CallID   string
	Name     string
	Content  string
	IsError  bool
	Duration time.Duration
}

// ToolApprovalRequested says a tool call waits for a decision (see
// [Controls.Decide]) before it runs. The calls of one reply that need
// approval are requested together.
type ToolApprovalRequested struct {
	CallID    string
	Name      string
	Arguments string
	// Preview says what the call would do, when its tool can say (see
	// [Previewer]); else empty.
	Preview string
	// Deadline is when the approval timeout denies the call.
	Deadline time.Time
}

// ToolApprovalDecided says how a call that waited for approval was
// decided. A denied call's error result follows; an approved call runs.
type ToolApprovalDecided struct {
	CallID   string
	Name     string
	Approved bool
	// Reason is the decision's reason, or the timeout's.
	Reason string
	// TimedOut reports that nobody decided before the deadline.
	TimedOut bool
	// DecidedBy names the client key that decided; empty when TimedOut
	// or without keys.
	DecidedBy string
}

// Steered says a user message reached the running turn (see
// [Controls.Steer]); it is committed at the turn's next step boundary.
type Steered struct {
	Message llm.Message
	// RequestID is the client's id for the message ([Controls.SteerOnce]);
	// empty when none.
	RequestID string
}

// LLMCallFinished closes one attempt at a model call.
type LLMCallFinished struct {
	Model   string
	Attempt int
	// Usage is the attempt's usage; failed attempts cost tokens too.
	Usage llm.Usage
	// Stop is why the reply ended, when it succeeded.
	Stop llm.StopReason
	// Err is the attempt's failure, nil when it succeeded.
	Err *TurnError
	// Duration is the attempt's wall time.
	Duration time.Duration
	// TimeToFirstChunk is the delay before the first output, zero if none.
	TimeToFirstChunk time.Duration
	// Estimated is what a call of which the provider reported no usage is
	// charged: an estimate of its prompt's input tokens and, when it
	// completed, of its reply's output tokens (see [TurnError.Estimated]);
	// zero otherwise, and always zero with Usage. It is for whoever pays
	// (a client key's limits); it is not sent.
	Estimated llm.Usage
}

// UsageUpdated carries the turn's running token totals, after each attempt
// that used tokens.
type UsageUpdated struct {
	Total llm.Usage
}

// Retry says a failed attempt will be retried on the same model.
type Retry struct {
	// Attempt is the number of the attempt about to start.
	Attempt int
	// MaxAttempts is the most attempts this model gets in this step.
	MaxAttempts int
	Model       string
	// Delay is how long the runtime waits before the attempt.
	Delay time.Duration
	// Kind is the class of the failure that caused the retry.
	Kind    llm.Kind
	Message string
	// DiscardPartial reports that output streamed since DiscardFromSeq
	// belongs to the failed attempt and must be dropped by every consumer.
	// It is false when the output is kept: the model is told to continue
	// it (see [StreamCutContinue]), and the next call's deltas extend it.
	DiscardPartial bool
	// DiscardFromSeq is the first event of the failed attempt's output.
	DiscardFromSeq uint64
	// ToDeployment, when not empty, is the deployment of Model the retry
	// moves to, after a failure that belongs to one key (see
	// [policy.Rule].PerKey); empty when it stays on the same deployment.
	ToDeployment string
}

// Fallback says the turn moves to the next model of its chain.
type Fallback struct {
	From string
	To   string
	// Kind is the class of the failure that caused the move.
	Kind    llm.Kind
	Message string
	// DiscardPartial and DiscardFromSeq are as in [Retry].
	DiscardPartial bool
	DiscardFromSeq uint64
}

// Hedge says a call was slow to answer, so the same request went to
// another model, or the same one, in parallel: the LLMCallStarted of the
// hedged call follows. The first of the two calls to answer streams its
// output; the other ends with an LLMCallFinished whose error is
// [llm.KindCancelled] before any output of the winner.
type Hedge struct {
	// From is the alias of the slow call's model; To the alias the hedged
	// call goes to (From itself when the model hedges to itself).
	From string
	To   string
	// After is how long the slow call had gone without output.
	After time.Duration
	// ToDeployment is the deployment of To the hedged call goes to.
	ToDeployment string
}

// Compaction says the conversation was shortened to fit a context window,
// and how: messages ReplacedFrom to ReplacedFrom+ReplacedCount of the
// conversation (the client's messages followed by those this turn
// committed, as earlier compactions of the turn left it) are replaced by
// Replacement, which a client applies to the conversation it sends next.
type Compaction struct {
	Strategy       string
	MessagesBefore int
	MessagesAfter  int
	// BytesBefore and BytesAfter measure the conversation's text size.
	BytesBefore int
	BytesAfter  int
	// BeforeCall reports a compaction before a call, because the
	// conversation neared the model's context window; false is one after
	// the provider refused it as too long.
	BeforeCall bool
	// ReplacedFrom, ReplacedCount and Replacement say what replaces what.
	ReplacedFrom  int
	ReplacedCount int
	Replacement   []llm.Message
	// ReplacementOmitted reports that Replacement was left out of the
	// event as sent and stored (too large for one event): set only on a
	// compaction read back from a turn's log, whose edit cannot be
	// replayed. The runtime never sets it.
	ReplacementOmitted bool
	// SummaryError, when not empty, says why the summarize strategy fell
	// back to keep_ends (Strategy is then keep_ends).
	SummaryError string
	// EstimatedTokens is the conversation's estimated size that triggered
	// a compaction before a call; zero otherwise.
	EstimatedTokens int
}

// EndReason says why a turn completed.
type EndReason uint8

// The reasons a turn completes.
const (
	// EndTurn means the model finished.
	EndTurn EndReason = iota + 1
	// EndToolCallsRequired means the model called client-side tools: the
	// client runs them and sends the results in its next turn.
	EndToolCallsRequired
	// EndMaxModelCalls means the turn's model-call limit was reached.
	EndMaxModelCalls
	// EndMaxTokens means the reply was truncated and no continuation was left.
	EndMaxTokens
	// EndRefusal means the model or its provider declined to answer.
	EndRefusal
	// EndStopSequence means a stop sequence ended the reply.
	EndStopSequence
	// EndToolEndedTurn means a server-side tool that ends the turn (see
	// [ToolRules]) succeeded: its result is committed and no model call
	// follows.
	EndToolEndedTurn
)

// String returns the reason's snake_case name.
func (r EndReason) String() string {
	switch r {
	case EndTurn:
		return "end_turn"
	case EndToolCallsRequired:
		return "tool_calls_required"
	case EndMaxModelCalls:
		return "max_model_calls"
	case EndMaxTokens:
		return "max_tokens"
	case EndRefusal:
		return "refusal"
	case EndStopSequence:
		return "stop_sequence"
	case EndToolEndedTurn:
		return "tool_ended_turn"
	}
	return "unspecified"
}

// TurnCompleted ends a turn that reached an outcome.
type TurnCompleted struct {
	Reason EndReason
	// Messages are the messages the turn added, to append to the conversation.
	Messages []llm.Message
	// MessagesOmitted reports that Messages were left out of the event as
	// sent and stored (too large for one event; the message_completed
	// events hold them): set only on an event read back from a turn's
	// log. The runtime never sets it.
	MessagesOmitted bool
	Usage           llm.Usage
	Counters        Counters
}

// Counters count what happened in a turn.
type Counters struct {
	ModelCalls int
	Retries    int
	Fallbacks  int
	// Hedges counts hedged calls started.
	Hedges      int
	Compactions int
	ToolCalls   int
	ToolErrors  int
	// ApprovalsRequested counts the tool calls that waited for approval;
	// ApprovalsDenied those denied, by a decision or the approval timeout.
	ApprovalsRequested int
	ApprovalsDenied    int
	// Steered counts the steering messages the turn committed.
	Steered int
}

// TurnError is the terminal failure of a turn, or of one attempt in
// [LLMCallFinished]. It is also the error [Runner.Run] returns.
type TurnError struct {
	Kind    llm.Kind
	Message string
	// Retryable is nil when there is no advice; true when re-sending the
	// conversation plus the turn's committed messages is safe and may
	// succeed; false when a person must act.
	Retryable *bool
	// RetryAfter is the delay a client should wait before retrying.
	RetryAfter time.Duration
	// Model is the model alias the error concerns.
	Model string
	// Attempts lists the attempts made, per model, in order.
	Attempts []ModelAttempts
	// Cause is the underlying failure, for logs only: its text may hold
	// details (addresses, the provider's raw answer) that must never reach
	// a client. Nil when there is nothing more than Message. TurnError does
	// not unwrap to it: the error's class is Kind, whatever Cause says.
	Cause error
	// Usage is what the whole turn used, its cost included: the running
	// totals of the last UsageUpdated, and what the providers reported of
	// a call the turn's end cut short, which no UsageUpdated carries. It
	// is for whoever pays (a client key's limits); it is not sent.
	Usage llm.Usage
	// Estimated is what the turn's calls of which the providers reported
	// no usage are charged besides Usage: calls that completed (a server
	// that ignores include_usage) and calls cut after they were sent (a
	// cancel, the client leaving, a timeout, a stream cut after the reply
	// began). For each, an estimate of its prompt's input tokens, made as
	// for compaction, and for a completed call of its reply's output
	// tokens (a quarter of its bytes), priced at its model's prices.
	// OpenAI reports a call's usage only at its end, so without it a
	// client cancelling each turn before its reply ends would use the
	// prompts for free, and a server reporting none would be free. Like
	// Usage, it is not sent.
	Estimated llm.Usage
}

// Error returns the kind and message.
func (e *TurnError) Error() string { return e.Kind.String() + ": " + e.Message }

// ModelAttempts counts the attempts made on one model.
type ModelAttempts struct {
	Model    string
	Attempts int
	// Deployments, for a model of several deployments, names the
	// deployment of each attempt, in order; nil for a model of one.
	Deployments []string
	// LastKind is the class of the model's last failure, when Succeeded is
	// false.
	LastKind llm.Kind
	// Succeeded reports that the model's last attempt succeeded.
	Succeeded bool
}
