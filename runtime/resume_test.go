package runtime_test

import (
	"context"
	"testing"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// TestResume: a turn resumed from its log numbers its events on from the
// log's, commits nothing twice, drops an interrupted call's output, reuses
// stored tool results, runs again only the tools that are safe to run
// again, and ends a turn whose end was committed without calling the model.
func TestResume(t *testing.T) {
	reply := llm.Message{Role: llm.RoleAssistant, Parts: []llm.Part{llm.TextPart("done")}}
	callMsg := func(name string) llm.Message {
		return llm.Message{Role: llm.RoleAssistant, Parts: []llm.Part{{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "c1", Name: name, Arguments: `{}`}}}}
	}
	stored := llm.ToolResult{CallID: "c1", Name: "deploy", Content: "deployed v2"}
	tests := []struct {
		name      string
		resume    runtime.Resume
		want      string
		toolCalls int
		llmCalls  int
		messages  int // messages the turn reports added
	}{{
		name:     "mid-delta",
		resume:   runtime.Resume{NextSeq: 5, DiscardFromSeq: 3, Counters: runtime.Counters{ModelCalls: 1}},
		want:     "retry 2/3 UNAVAILABLE discard | call sim#1 | text | finished | usage | commit assistant | completed end_turn",
		llmCalls: 1, messages: 1,
	}, {
		name: "tool result stored",
		resume: runtime.Resume{NextSeq: 9, Committed: []llm.Message{callMsg("deploy")}, LastStop: llm.StopToolUse,
			ToolResults: map[string]llm.ToolResult{"c1": stored}, ToolsStarted: map[string]bool{}},
		want:     "commit tool | call sim#1 | text | finished | usage | commit assistant | completed end_turn",
		llmCalls: 1, messages: 3,
	}, {
		name: "intent without result, side effects",
		resume: runtime.Resume{NextSeq: 9, Committed: []llm.Message{callMsg("deploy")}, LastStop: llm.StopToolUse,
			ToolsStarted: map[string]bool{"c1": true}},
		want: "error TOOLS_UNSAFE retryable=false",
	}, {
		name: "intent without result, idempotent",
		resume: runtime.Resume{NextSeq: 9, Committed: []llm.Message{callMsg("lookup")}, LastStop: llm.StopToolUse,
			ToolsStarted: map[string]bool{"c1": true}},
		want:      "tool lookup | tooldone lookup | commit tool | call sim#1 | text | finished | usage | commit assistant | completed end_turn",
		toolCalls: 1, llmCalls: 1, messages: 3,
	}, {
		name:     "end committed",
		resume:   runtime.Resume{NextSeq: 7, Committed: []llm.Message{reply}, LastStop: llm.StopEndTurn},
		want:     "completed end_turn",
		messages: 1,
	}, {
		// The previous runner went away while closing a cancelled turn:
		// it ends cancelled, and does not call the model again.
		name: "cancel note committed",
		resume: runtime.Resume{NextSeq: 9, Committed: []llm.Message{reply,
			{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(runtime.InterruptedNote)}}}},
		want: "error CANCELLED retryable=false",
	}, {
		name: "cancelled tool results committed",
		resume: runtime.Resume{NextSeq: 9, Committed: []llm.Message{callMsg("deploy"), {Role: llm.RoleTool, Parts: []llm.Part{{
			Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: "c1", Name: "deploy", Content: runtime.CancelledToolResult, IsError: true}}}}}},
		want: "commit user | error CANCELLED retryable=false",
	}, {
		name: "cancelled tool result stored",
		resume: runtime.Resume{NextSeq: 9, Committed: []llm.Message{callMsg("deploy")}, LastStop: llm.StopToolUse,
			ToolResults:  map[string]llm.ToolResult{"c1": {CallID: "c1", Name: "deploy", Content: runtime.CancelledToolResult, IsError: true}},
			ToolsStarted: map[string]bool{}},
		want: "commit tool | commit user | error CANCELLED retryable=false",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := fake.NewProvider(fake.Reply{Chunks: fake.Text("done")})
			deploy := fake.NewTool("deploy", nil)
			lookup := fake.NewTool("lookup", nil)
			lookup.ToolSpec.Idempotent = true
			r := newRunner(t, []*runtime.Model{model("sim", p)}, []llm.Tool{deploy, lookup})
			req := userTurn("deploy it")
			rs := tt.resume
			req.Resume = &rs
			rec := &recorder{}
			res, err := r.Run(context.Background(), req, rec)
			for i, ev := range rec.events {
				if ev.Seq != tt.resume.NextSeq+uint64(i) {
					t.Fatalf("event %d has seq %d, want %d", i, ev.Seq, tt.resume.NextSeq+uint64(i))
				}
			}
			if got := describeAll(rec.events); got != tt.want {
				t.Errorf("events:\n got %s\nwant %s", got, tt.want)
			}
			if n := len(deploy.Calls()) + len(lookup.Calls()); n != tt.toolCalls {
				t.Errorf("tool calls = %d, want %d", n, tt.toolCalls)
			}
			if p.Calls() != tt.llmCalls {
				t.Errorf("model calls = %d, want %d", p.Calls(), tt.llmCalls)
			}
			if err != nil {
				return
			}
			if len(res.Messages) != tt.messages {
				t.Errorf("the turn added %d messages, want %d", len(res.Messages), tt.messages)
			}
			if tt.name == "tool result stored" {
				// The stored result reached the model.
				conv := p.Requests()[0].Messages
				if last := conv[len(conv)-1]; last.Role != llm.RoleTool || last.Parts[0].ToolResult.Content != "deployed v2" {
					t.Errorf("the model saw %+v, want the stored result", last)
				}
				if res.Counters.ToolCalls != 0 {
					t.Errorf("tool calls counted again: %d", res.Counters.ToolCalls)
				}
			}
		})
	}
}
