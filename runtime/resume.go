package runtime

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/turnstile-dev/turnstile/llm"
)

// Resume is what a turn's log holds of a turn whose runner went away
// before its last event (its process died): set as [TurnRequest.Resume],
// another runner continues the turn from there instead of starting it.
// [ResumeFrom] rebuilds it from the turn's events.
//
// The resumed turn emits no TurnStarted and numbers its events from
// NextSeq. It commits nothing twice: the conversation is the request's
// messages plus Committed. Then it finishes what was interrupted, in this
// order: when the interrupted model call had streamed output (from
// DiscardFromSeq), a Retry event with DiscardPartial tells consumers to
// drop it and the step is made again, unless the model continues cut
// streams and the output was text (Cut), which the Retry event keeps and
// the step continues; when the last committed message is
// a reply whose tool calls have no committed results, those tools are
// dealt with (see ToolResults and ToolsStarted); when it is a reply that
// ended the turn, the turn ends as it would have; when it is what a
// cancel commits (its user note, or its cancelled tool results, see
// [Runner.Run]; or a cancelled tool result among ToolResults), the turn
// ends CANCELLED, its closing messages committed. Then the
// turn goes on as any other. Limits count from the restored Counters; a
// resumed step numbers its attempts from 1 again.
type Resume struct {
	// NextSeq is the seq of the first event the resumed turn emits: one
	// more than the last seq stored.
	NextSeq uint64
	// Model is the alias the turn was on; empty keeps the request's.
	Model string
	// Committed are the messages the turn committed, in order
	// (MessageCompleted events).
	Committed []llm.Message
	// Edits are the compactions the turn made (Compaction events), in
	// order, which the resumed turn's conversation keeps.
	Edits []ConversationEdit
	// LastStop is why the last committed reply ended, when the last
	// committed message is a reply.
	LastStop llm.StopReason
	// Usage and Counters are the turn's totals so far.
	Usage    llm.Usage
	Counters Counters
	// DiscardFromSeq, when not 0, is the seq of the first output event of
	// the model call that was interrupted: that output is never committed
	// as it is.
	DiscardFromSeq uint64
	// Cut is the text the interrupted model call had streamed (from
	// DiscardFromSeq), when it streamed text only. A model whose
	// on_stream_cut is [StreamCutContinue] continues it, as it continues
	// a stream cut short in one process: the Retry event keeps it
	// (DiscardPartial false), the next call continues from it, and the
	// committed reply is Cut followed by the continuation. Otherwise the
	// output is discarded and the call made again.
	Cut []llm.Part
	// Abort, when set, ends the resumed turn at once with it (a TurnError)
	// instead of continuing it: the turn has been taken over too many
	// times.
	Abort *llm.Error
	// ToolResults holds, by call id, the results already stored
	// (ToolFinished events) of the last committed reply's tool calls:
	// they are used as they are, and those calls do not run again.
	ToolResults map[string]llm.ToolResult
	// ToolsStarted holds the ids of the last committed reply's tool calls
	// that were started (ToolStarted events, the intent) without a stored
	// result. A read-only or idempotent tool runs again. Any other may have
	// had its effect or not, and must never run twice: the turn ends with
	// TOOLS_UNSAFE, not retryable, naming the tool. Telling the model the
	// outcome is unknown would keep the turn going, but a model that tries
	// again would run it a second time; ending the turn leaves that
	// decision to the client, as any failure during such a tool does.
	ToolsStarted map[string]bool
	// Decided holds, by call id, the approval decisions stored
	// (ToolApprovalDecided events) of the last committed reply's tool
	// calls: they stand. A call whose approval was requested and not
	// decided has its request emitted again.
	Decided map[string]Decided
	// Requested holds the ids of the calls whose approval was requested
	// (ToolApprovalRequested events): they are counted already.
	Requested map[string]bool
	// Steering holds, in order, the steering messages stored (Steered
	// events) and not yet committed: they are queued again.
	Steering []llm.Message
	// SteerIDs holds, in order, the request ids of the steered events
	// stored that have one: a message sent again with one of them is
	// not taken twice ([Controls.SteerOnce]).
	SteerIDs []SteerID
	// SteerBytes is the text of every steering message stored (Steered
	// events), committed or not: it counts against
	// [Limits.MaxSteerBytes].
	SteerBytes int
}

// SteerID is the request id of a stored Steered event, and its seq.
type SteerID struct {
	ID  string
	Seq uint64
}

// resume finishes what the previous runner of a resumed turn was doing.
// done reports that the turn ended, with res or err.
func (t *turn) resume(ctx context.Context, rs *Resume) (res *TurnCompleted, done bool, err error) {
	if rs.Abort != nil {
		return nil, true, t.fail(ctx, rs.Abort)
	}
	if rs.DiscardFromSeq > 0 {
		m := t.chain.current()
		t.counters.Retries++
		retry := &Retry{
			Attempt: 2, MaxAttempts: m.Retry.MaxRetries + 1, Model: m.Alias, Kind: llm.KindUnavailable,
			Message:        "the server running the turn went away during the model call; the call is made again",
			DiscardPartial: true, DiscardFromSeq: rs.DiscardFromSeq,
		}
		if continuesCut(m, rs) {
			// Kept: the first step continues it (see step's keptFrom).
			t.cut, t.cutFrom = slices.Clone(rs.Cut), rs.DiscardFromSeq
			retry.Message = "the server running the turn went away during the model call; the reply is continued from where it stopped"
			retry.DiscardPartial, retry.DiscardFromSeq = false, 0
		}
		t.out.emit(ctx, retry)
	}
	if len(rs.Committed) == 0 {
		return nil, false, nil
	}
	last := rs.Committed[len(rs.Committed)-1]
	switch {
	case isCancelNote(last):
		// A cancel commits this user message, its last: the previous
		// runner went away before the terminal event.
		return nil, true, t.fail(ctx, errCancelledBefore)
	case last.Role == llm.RoleUser:
		// A steering message: the next model call answers it.
		return nil, false, nil
	case last.Role == llm.RoleTool && cancelledResult(last.Parts):
		// The previous runner went away while closing a cancelled turn.
		t.commit(ctx, llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(InterruptedToolUseNote)}})
		return nil, true, t.fail(ctx, errCancelledBefore)
	case last.Role == llm.RoleAssistant && cancelledResult(storedResults(rs.ToolResults)):
		// It went away earlier in the closing: after the cancelled result
		// of a running tool.
		t.closeCancelled(ctx)
		return nil, true, t.fail(ctx, errCancelledBefore)
	case last.Role == llm.RoleTool && t.tools.endedByTool(toolResults(last)) && t.ctl.finish():
		// A tool that ends the turn succeeded.
		res, err := t.complete(ctx, EndToolEndedTurn)
		return res, true, err
	case last.Role != llm.RoleAssistant:
		return nil, false, nil
	}
	return t.afterReply(ctx, last, rs.LastStop)
}

// ContinuesCut reports whether the turn req resumes continues the reply
// its previous runner was streaming when it went away, rather than
// dropping it and making the call again: req.Resume holds the text that
// call streamed ([Resume].Cut), and the model the turn goes on with
// continues cut streams (on_stream_cut: continue).
func (r *Runner) ContinuesCut(req *TurnRequest) bool {
	rs := req.Resume
	alias := cmp.Or(req.Model, r.defaultModel)
	if rs == nil || r.models[alias] == nil {
		return false
	}
	c := newChain(r, alias, req)
	c.resumeAt(rs.Model)
	return continuesCut(c.current(), rs)
}

// continuesCut reports whether a turn resumed from rs on m continues the
// reply its previous runner was streaming.
func continuesCut(m *Model, rs *Resume) bool {
	return rs.DiscardFromSeq > 0 && m.OnStreamCut == StreamCutContinue && continuable(rs.Cut)
}

// toolResults returns the tool results of m.
func toolResults(m llm.Message) []llm.ToolResult {
	var out []llm.ToolResult
	for _, p := range m.Parts {
		if p.ToolResult != nil {
			out = append(out, *p.ToolResult)
		}
	}
	return out
}

// storedResults returns results as tool result parts.
func storedResults(results map[string]llm.ToolResult) []llm.Part {
	parts := make([]llm.Part, 0, len(results))
	for _, r := range results {
		parts = append(parts, llm.Part{Kind: llm.PartToolResult, ToolResult: &r})
	}
	return parts
}

// errCancelledBefore ends a resumed turn whose log shows it was being
// cancelled when its runner went away.
var errCancelledBefore = &llm.Error{Kind: llm.KindCancelled, Message: "the turn was cancelled"}

// cancelledResult reports whether parts hold a tool result a cancel gave
// (see [turn.closeCancelled]).
func cancelledResult(parts []llm.Part) bool {
	for _, p := range parts {
		if r := p.ToolResult; r != nil && r.IsError && r.Content == CancelledToolResult {
			return true
		}
	}
	return false
}

// resumedResults returns what a resumed turn already knows of calls: the
// stored result of each call that has one (nil for the others), or the
// failure that ends the turn when a tool with side effects was started and
// its outcome is unknown. It applies once, to the first tools run.
func (tc *toolCalls) resumedResults(calls []llm.ToolCall) ([]*llm.ToolResult, error) {
	rs := tc.resumed
	tc.resumed = nil
	if rs == nil {
		return nil, nil
	}
	// Started before a steering message could come: not skipped for it.
	tc.restarted = rs.ToolsStarted
	known := make([]*llm.ToolResult, len(calls))
	var unknown []string
	for i, c := range calls {
		if r, ok := rs.ToolResults[c.ID]; ok {
			known[i] = &r
			continue
		}
		if !rs.ToolsStarted[c.ID] {
			continue
		}
		if tool, ok := tc.t.r.tools[c.Name]; ok {
			if spec := tool.Spec(); spec.ReadOnly || spec.Idempotent {
				continue // safe to run again
			}
		}
		unknown = append(unknown, c.Name)
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return nil, &llm.Error{Kind: llm.KindToolsUnsafe, Message: fmt.Sprintf(
			"the server running the turn went away while the tools %s were running; their outcome is unknown and they are not run again: check their effects before running the turn again",
			strings.Join(slices.Compact(unknown), ", "))}
	}
	return known, nil
}
