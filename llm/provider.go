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
