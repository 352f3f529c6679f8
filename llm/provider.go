package llm

import (
	"context"
	"iter"
)

// Provider streams one model call. Implementations live in providers/...;
// each translates [Request] to its API and the API's stream to [Chunk]s.
//
// Stream yields chunks as they arrive and ends after a [ChunkStop]. A failure
// is yielded once, as (Chunk{}, err) with err a [*Error] carrying the
// provider's classification, and ends the sequence. A stream that ends
// without a ChunkStop is treated by the runtime as interrupted.
//
// A Provider never retries by itself: the runtime owns retries, so every
// attempt is counted by its [Policy] and shows up as an event. Stream must
// stop promptly when ctx is done and must be safe for concurrent use.
type Provider interface {
	Stream(ctx context.Context, req *Request) iter.Seq2[Chunk, error]
}

// Request is one model call, in provider-neutral form.
type Request struct {
	// TurnID identifies the turn the call belongs to; empty outside a
	// turn. Adapters of real APIs do not send it; the simulator keys its
	// per-turn state (times=K) on it.
	TurnID string
	// Model is the provider's own model id, e.g. "gpt-4.1-mini".
	Model string
	// System is the system prompt; empty means none.
	System string
	// Messages is the conversation, oldest first.
	Messages []Message
	// Tools lists the tools the model may call.
	Tools []ToolSpec
	// MaxOutputTokens caps the reply; zero means the provider's default.
	MaxOutputTokens int
	// Temperature is the sampling temperature; nil means the provider's default.
	Temperature *float64
	// TopP is the nucleus sampling cutoff, from 0 to 1; nil means the
	// provider's default.
	TopP *float64
	// StopSequences end the reply when generated.
	StopSequences []string
	// CachePrompt asks the adapter to mark the request's stable prefix for
	// the provider's prompt cache where the provider needs marks
	// (Anthropic's cache_control breakpoints); false sends none.
	CachePrompt bool
	// PromptCacheKey, when not empty, is sent as the provider's prompt
	// cache routing key (OpenAI's prompt_cache_key) so one conversation's
	// calls land on the same cache. It is a digest, never prompt text.
	PromptCacheKey string
	// OutputSchema, when not nil, asks for a reply that is one JSON value
	// matching a schema, in the provider's structured-output mode.
	OutputSchema *OutputSchema
	// ToolChoice, when not nil, says which tools the model may or must
	// call; nil leaves it to the provider (auto).
	ToolChoice *ToolChoice
	// Reasoning, when not nil, asks for an amount of reasoning; nil leaves
	// it to the provider.
	Reasoning *Reasoning
	// EndUser identifies the end user to the provider (a stable, opaque
	// id); empty sends none.
	EndUser string
	// Capabilities, when not nil, is what the model takes, as the runtime
	// resolved it (the adapter's table, with the model's configuration
	// over it); nil: the adapter looks the model up in its own table.
	Capabilities *Capabilities
}

// OutputSchema asks a model for a reply that is one JSON value matching
// Schema.
type OutputSchema struct {
	// Name names the schema for providers that take a name.
	Name string
	// Schema is the JSON Schema, as a JSON object.
	Schema []byte
	// Strict asks the provider to enforce the schema while generating,
	// where it can.
	Strict bool
}

// ToolChoiceMode says how a model picks tools.
type ToolChoiceMode uint8

// The modes of a [ToolChoice].
const (
	// ToolChoiceAuto lets the model decide.
	ToolChoiceAuto ToolChoiceMode = iota + 1
	// ToolChoiceNone forbids tool calls.
	ToolChoiceNone
	// ToolChoiceRequired makes the model call at least one tool.
	ToolChoiceRequired
	// ToolChoiceTool makes the model call the tool [ToolChoice.Name].
	ToolChoiceTool
)

// String returns the mode's lower-case name.
func (m ToolChoiceMode) String() string {
	switch m {
	case ToolChoiceAuto:
		return "auto"
	case ToolChoiceNone:
		return "none"
	case ToolChoiceRequired:
		return "required"
	case ToolChoiceTool:
		return "tool"
	}
	return "unspecified"
}

// ToolChoice says which tools a model may or must call.
type ToolChoice struct {
	Mode ToolChoiceMode
	// Name is the tool to call with [ToolChoiceTool].
	Name string
}

// Effort is a coarse amount of reasoning.
type Effort uint8

// The efforts of a [Reasoning].
const (
	// EffortUnspecified leaves the effort to the budget, or the provider.
	EffortUnspecified Effort = iota
	// EffortLow asks for little reasoning.
	EffortLow
	// EffortMedium asks for a moderate amount.
	EffortMedium
	// EffortHigh asks for much reasoning.
	EffortHigh
)

// String returns the effort's lower-case name, as OpenAI's
// reasoning_effort and the configuration write it; "" when unspecified.
func (e Effort) String() string {
	switch e {
	case EffortLow:
		return "low"
	case EffortMedium:
		return "medium"
	case EffortHigh:
		return "high"
	}
	return ""
}

// The reasoning budgets an effort stands for at providers that take a
// budget, and the bounds of a budget.
const (
	BudgetLow       = 1024
	BudgetMedium    = 4096
	BudgetHigh      = 16384
	MinBudgetTokens = 1024
	MaxBudgetTokens = 1_000_000
)

// Reasoning asks for an amount of reasoning. Either field may be zero;
// [Reasoning.Budget] and [Reasoning.Level] derive the one a provider
// takes from the other.
type Reasoning struct {
	Effort Effort
	// BudgetTokens is the most tokens the model may spend reasoning; zero
	// means the effort's budget.
	BudgetTokens int
}

// Budget returns the token budget r asks for: BudgetTokens when set, else
// the effort's budget; zero when neither is set.
func (r Reasoning) Budget() int {
	if r.BudgetTokens > 0 {
		return r.BudgetTokens
	}
	switch r.Effort {
	case EffortLow:
		return BudgetLow
	case EffortMedium:
		return BudgetMedium
	case EffortHigh:
		return BudgetHigh
	}
	return 0
}

// Level returns the effort r asks for: Effort when set, else the effort
// whose budget covers BudgetTokens (up to BudgetMedium: low; up to
// BudgetHigh: medium; beyond: high); EffortUnspecified when neither is set.
func (r Reasoning) Level() Effort {
	switch {
	case r.Effort != EffortUnspecified:
		return r.Effort
	case r.BudgetTokens <= 0:
		return EffortUnspecified
	case r.BudgetTokens <= BudgetMedium:
		return EffortLow
	case r.BudgetTokens <= BudgetHigh:
		return EffortMedium
	}
	return EffortHigh
}

// ChunkKind says what a [Chunk] carries.
type ChunkKind uint8

// The kinds of [Chunk].
const (
	// ChunkText carries a fragment of reply text in Text.
	ChunkText ChunkKind = iota + 1
	// ChunkThinking carries a fragment of reasoning in Text and/or the
	// block's provider signature in Signature. Index identifies the block.
	ChunkThinking
	// ChunkToolCallStart opens tool call number Index with CallID and Name.
	ChunkToolCallStart
	// ChunkToolCallArgs carries a fragment of tool call Index's JSON
	// arguments in Text.
	ChunkToolCallArgs
	// ChunkToolCallEnd closes tool call Index: its arguments are complete.
	ChunkToolCallEnd
	// ChunkUsage carries the call's cumulative usage so far in Usage; a later
	// usage chunk replaces an earlier one.
	ChunkUsage
	// ChunkStop ends the reply with Stop, and names in Model the model that
	// served it and in ResponseID the reply's id, when the provider said.
	ChunkStop
)

// Chunk is one piece of a streamed model reply. Kind says which fields are set.
type Chunk struct {
	Kind      ChunkKind
	Index     int
	Text      string
	Signature string
	CallID    string
	Name      string
	Usage     Usage
	Stop      StopReason
	// Model is set on a ChunkStop: the id of the model that served the
	// reply as the provider reported it (often a dated version of the id
	// asked for); empty when the provider did not say.
	Model string
	// ResponseID is set on a ChunkStop: the provider's id of the reply
	// (Anthropic's message id, OpenAI's completion id, Gemini's
	// responseId); empty when the provider did not say.
	ResponseID string
}

// StopReason says why a model ended its reply.
type StopReason uint8

// The reasons a reply ends.
const (
	// StopUnspecified means the provider did not say.
	StopUnspecified StopReason = iota
	// StopEndTurn means the model finished its answer.
	StopEndTurn
	// StopToolUse means the model wants its tool calls run.
	StopToolUse
	// StopMaxTokens means the reply hit the output token limit.
	StopMaxTokens
	// StopSequence means a stop sequence was generated.
	StopSequence
	// StopRefusal means the model or the provider's filter declined to answer.
	StopRefusal
	// StopPauseTurn means the provider paused a long turn; re-sending the
	// conversation continues it.
	StopPauseTurn
)

// String returns the reason's snake_case name.
func (s StopReason) String() string {
	switch s {
	case StopEndTurn:
		return "end_turn"
	case StopToolUse:
		return "tool_use"
	case StopMaxTokens:
		return "max_tokens"
	case StopSequence:
		return "stop_sequence"
	case StopRefusal:
		return "refusal"
	case StopPauseTurn:
		return "pause_turn"
	}
	return "unspecified"
}
