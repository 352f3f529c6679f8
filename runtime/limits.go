package runtime

import (
	"fmt"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// Limits bound every turn of a [Runner]. Every field means what it says:
// MaxContinuations 0 never continues a truncated reply. [DefaultLimits]
// gives the built-in values. The yaml names are the configuration file's
// keys (its turn block).
type Limits struct {
	// MaxModelCalls bounds the model calls of a turn, retries included; a
	// request may lower or raise it for itself. At least 1.
	MaxModelCalls int `yaml:"max_model_calls"`
	// MaxContinuations bounds how often a reply cut short by the output
	// token limit is continued; 0 never continues.
	MaxContinuations int `yaml:"max_continuations"`
	// ToolConcurrency bounds the tool calls of one message running at
	// once. At least 1.
	ToolConcurrency int `yaml:"tool_concurrency"`
	// ToolTimeout bounds one tool call; a tool may set its own bound by
	// implementing interface{ Timeout() time.Duration }. Positive.
	ToolTimeout time.Duration `yaml:"tool_timeout"`
	// ToolFailures is how many consecutive failures disable a tool for
	// the rest of a turn. At least 1.
	ToolFailures int `yaml:"tool_failures"`
	// MaxDuration bounds a turn from its start: a turn still running then
	// ends with a DEADLINE_EXCEEDED error. 0 is no limit.
	MaxDuration time.Duration `yaml:"max_duration"`
	// MaxToolResultBytes bounds what the model and the client get of the
	// tool results of one step: each result, and the results of one step
	// together. A result cut to fit keeps its beginning and ends with a
	// note saying how many bytes it had; the rest is dropped (the runner
	// logs the cut, not the content). At least 1024.
	MaxToolResultBytes int `yaml:"max_tool_result_bytes"`
	// ApprovalTimeout bounds how long a tool call that requires approval
	// waits for a decision; a call nobody decided by then is denied, and
	// its result says so. Positive.
	ApprovalTimeout time.Duration `yaml:"approval_timeout"`
	// MaxSteerMessages bounds the steering messages (SteerTurn) queued
	// for a turn and not yet committed; one more is refused with
	// RESOURCE_EXHAUSTED. It also bounds the request ids a turn
	// remembers: those of its last steered events. At least 1.
	MaxSteerMessages int `yaml:"max_steer_messages"`
	// MaxSteerBytes bounds the text of the steering messages (SteerTurn)
	// one turn takes, all of them together over the turn's life, resumed
	// runs included: each is sent to the model again on every later call,
	// so what they add to the conversation is bounded like a request. A
	// message that would pass it is refused with RESOURCE_EXHAUSTED. 0
	// takes no steering message.
	MaxSteerBytes int `yaml:"max_steer_bytes"`
}

// DefaultLimits returns the built-in limits: 16 model calls, 3
// continuations, 4 tool calls at once, 60s per tool call, a tool disabled
// after 3 consecutive failures, 10 minutes per turn, 1 MiB of tool
// results per step, 10 minutes of waiting for an approval, 16 queued
// steering messages and 1 MiB of steering text per turn.
func DefaultLimits() Limits {
	return Limits{
		MaxModelCalls: 16, MaxContinuations: 3, ToolConcurrency: 4, ToolTimeout: 60 * time.Second, ToolFailures: 3,
		MaxDuration: 10 * time.Minute, MaxToolResultBytes: 1 << 20,
		ApprovalTimeout: 10 * time.Minute, MaxSteerMessages: 16, MaxSteerBytes: 1 << 20,
	}
}

// minToolResultBytes is the least MaxToolResultBytes: room for a useful
// beginning and the note of a cut.
const minToolResultBytes = 1024

// Problems lists every limit that is out of range, in field order; none
// when l is valid.
func (l Limits) Problems() []llm.Problem {
	var out []llm.Problem
	bad := func(field, format string, args ...any) {
		out = append(out, llm.Problem{Field: field, Message: fmt.Sprintf(format, args...)})
	}
	if l.MaxModelCalls < 1 {
		bad("max_model_calls", "must be at least 1")
	}
	if l.MaxContinuations < 0 {
		bad("max_continuations", "must not be negative (0 means never)")
	}
	if l.ToolConcurrency < 1 {
		bad("tool_concurrency", "must be at least 1")
	}
	if l.ToolTimeout <= 0 {
		bad("tool_timeout", "must be positive")
	}
	if l.ToolFailures < 1 {
		bad("tool_failures", "must be at least 1")
	}
	if l.MaxDuration < 0 {
		bad("max_duration", "must not be negative (0 means no limit)")
	}
	if l.MaxToolResultBytes < minToolResultBytes {
		bad("max_tool_result_bytes", "must be at least %d", minToolResultBytes)
	}
	if l.ApprovalTimeout <= 0 {
		bad("approval_timeout", "must be positive")
	}
	if l.MaxSteerMessages < 1 {
		bad("max_steer_messages", "must be at least 1")
	}
	if l.MaxSteerBytes < 0 {
		bad("max_steer_bytes", "must not be negative (0 takes no steering message)")
	}
	return out
}
