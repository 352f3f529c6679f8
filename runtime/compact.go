package runtime

import (
	"context"
	"fmt"
	"unicode/utf8"

	"github.com/turnstile-dev/turnstile/llm"
)

// Compactor shortens a conversation that no longer fits a model's context
// window. Compact must not change the messages it is given; it returns a
// shorter conversation that still alternates validly (every tool result
// follows its tool call).
type Compactor interface {
	// Name identifies the strategy in Compaction events.
	Name() string
	// Compact returns a shorter version of msgs.
	Compact(ctx context.Context, system string, msgs []llm.Message) ([]llm.Message, error)
}

// KeepEnds is the default [Compactor]. It keeps the first user message and
// the newest messages, drops the middle, and shortens oversized tool
// results, so that the conversation shrinks to about Target of its size.
type KeepEnds struct {
	// Target is the fraction of the conversation's size to aim for
	// (default 0.5).
	Target float64
	// MaxToolResult is the most bytes a tool result keeps (default 2048).
	MaxToolResult int
}

// Name returns "keep_ends".
func (KeepEnds) Name() string { return "keep_ends" }

// Compact implements [Compactor].
func (k KeepEnds) Compact(_ context.Context, _ string, msgs []llm.Message) ([]llm.Message, error) {
	out, first, start := k.plan(msgs)
	if start < 0 {
		return out, nil
	}
	dropped := start - first - 1
	note := llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(fmt.Sprintf("[%d earlier messages were omitted to fit the context window]", dropped))}}
	return splice(out, first, start, note), nil
}

// splice returns out's messages up to first, then m, then those from
// start on.
func splice(out []llm.Message, first, start int, m llm.Message) []llm.Message {
	res := make([]llm.Message, 0, first+2+len(out)-start)
	res = append(res, out[:first+1]...)
	res = append(res, m)
	return append(res, out[start:]...)
}

// plan returns msgs with oversized tool results shortened, and, when that
// is not enough, the middle to drop: out[first+1:start], after the first
// user message and before a user message that is not a tool result, so no
// tool result loses its call. start is -1 when nothing is to be dropped.
func (k KeepEnds) plan(msgs []llm.Message) (out []llm.Message, first, start int) {
	target, maxResult := k.Target, k.MaxToolResult
	if target <= 0 || target >= 1 {
		target = 0.5
	}
	if maxResult <= 0 {
		maxResult = 2048
	}
	goal := int(float64(ConversationSize(msgs)) * target)

	// First shorten oversized tool results, which are the usual culprits.
	out = make([]llm.Message, len(msgs))
	for i, m := range msgs {
		out[i] = m
		copied := false
		for j, p := range m.Parts {
			if p.Kind != llm.PartToolResult || p.ToolResult == nil || len(p.ToolResult.Content) <= maxResult {
				continue
			}
			if !copied {
				out[i].Parts, copied = append([]llm.Part(nil), m.Parts...), true
			}
			r := *p.ToolResult
			// Cut at the start of a character: the result goes back to
			// the client (a Compaction's replacement) as UTF-8.
			keep := maxResult
			for keep > 0 && !utf8.RuneStart(r.Content[keep]) {
				keep--
			}
			r.Content = r.Content[:keep] + fmt.Sprintf("\n[%d bytes omitted to fit the context window]", len(r.Content)-keep)
			out[i].Parts[j].ToolResult = &r
		}
	}
	if ConversationSize(out) <= goal {
		return out, -1, -1
	}

	// Then keep the first user message and the newest messages, starting
	// the kept tail at a user message that is not a tool result, so no tool
	// result loses its call.
	first = -1
	for i, m := range out {
		if m.Role == llm.RoleUser {
			first = i
			break
		}
	}
	if first < 0 {
		return out, -1, -1
	}
	head := out[:first+1]
	budget := goal - ConversationSize(head)
	start = -1
	for i := len(out) - 1; i > first; i-- {
		if out[i].Role != llm.RoleUser || hasToolResult(out[i]) {
			continue
		}
		// The newest clean cut is always taken; older ones while they fit.
		if start >= 0 && ConversationSize(out[i:]) > budget {
			break
		}
		start = i
	}
	if start < 0 || start-first-1 <= 0 {
		return out, first, -1
	}
	return out, first, start
}

func hasToolResult(m llm.Message) bool {
	for _, p := range m.Parts {
		if p.Kind == llm.PartToolResult {
			return true
		}
	}
	return false
}

// ConversationSize returns the bytes of text in msgs: text, thinking, tool
// call arguments and tool results.
func ConversationSize(msgs []llm.Message) int {
	n := 0
	for _, m := range msgs {
		for _, p := range m.Parts {
			n += len(p.Text) + len(p.Signature)
			if p.ToolCall != nil {
				n += len(p.ToolCall.Name) + len(p.ToolCall.Arguments)
			}
			if p.ToolResult != nil {
				n += len(p.ToolResult.Content)
			}
		}
	}
	return n
}
