package runtime

import (
	"context"
	"strings"

	"github.com/turnstile-dev/turnstile/llm"
)

// The messages a cancelled turn commits to close its conversation (see
// [Runner.Run]).
const (
	// InterruptedNote is the text of the user message a cancelled turn
	// commits last, so that the next model call knows the user stopped
	// the turn.
	InterruptedNote = "[Request interrupted by user]"
	// InterruptedToolUseNote is the note instead when the cancel left
	// tool calls of the last reply unanswered.
	InterruptedToolUseNote = "[Request interrupted by user for tool use]"
	// CancelledToolResult is the result, an error, of each tool call of a
	// cancelled turn's last reply that did not finish: it never ran, or
	// it was stopped.
	CancelledToolResult = "Cancelled by the user: the tool call did not finish (it may not have run, or run in part)."
)

// cancelled reports whether the turn's caller cancelled it (its context
// ended with a cause of class [llm.KindCancelled]), as opposed to a
// deadline, a shutdown or a failed sink.
func (t *turn) cancelled() bool {
	return t.parent.Err() != nil && llm.AsError(context.Cause(t.parent)).Kind == llm.KindCancelled &&
		t.out.sinkErr() == nil
}

// closeCancelled commits what a cancelled turn had, and closes its
// conversation so that it is valid and true for the next turn, as agent
// loops do when their user interrupts them:
//
//   - the reply the turn was writing, as far as it got (the text, and
//     the tool calls whose arguments were complete), unless it holds no
//     text nor tool call;
//   - when the last committed reply has tool calls without results, one
//     result for each: the one a tool had finished with, else
//     [CancelledToolResult] (an error; a tool that was running gets its
//     ToolFinished with it);
//   - a user message saying the user interrupted the turn
//     ([InterruptedToolUseNote] after tool results, else
//     [InterruptedNote]).
//
// Each is a MessageCompleted event, before the terminal error.
func (t *turn) closeCancelled(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	if reply := worthKeeping(mergeParts(t.reply, t.interrupted)); reply != nil {
		t.commit(ctx, llm.Message{Role: llm.RoleAssistant, Parts: reply})
	}
	t.reply, t.interrupted = nil, nil
	note := InterruptedNote
	if calls := t.unanswered(); len(calls) > 0 {
		results := t.tools.cancelled(ctx, calls)
		msg := llm.Message{Role: llm.RoleTool, Parts: make([]llm.Part, len(results))}
		for i := range results {
			msg.Parts[i] = llm.Part{Kind: llm.PartToolResult, ToolResult: &results[i]}
		}
		t.commit(ctx, msg)
		note = InterruptedToolUseNote
	}
	t.commit(ctx, llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(note)}})
}

// unanswered returns the tool calls of the last message the turn
// committed when it is a reply whose calls have no results yet.
func (t *turn) unanswered() []llm.ToolCall {
	if len(t.added) == 0 {
		return nil
	}
	last := t.added[len(t.added)-1]
	if last.Role != llm.RoleAssistant {
		return nil
	}
	return last.ToolCalls()
}

// worthKeeping returns the parts of an interrupted reply when they hold
// text that is not blank or a tool call, nil otherwise: a reply of
// reasoning alone (whose last block has no signature yet) or of blanks is
// nothing a provider takes back.
func worthKeeping(parts []llm.Part) []llm.Part {
	for _, p := range parts {
		if p.Kind == llm.PartToolCall || p.Kind == llm.PartText && strings.TrimSpace(p.Text) != "" {
			return parts
		}
	}
	return nil
}
