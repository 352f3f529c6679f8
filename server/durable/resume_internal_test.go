package durable

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/wire"
)

// TestCompactionEditFromTheLog: a stored compaction whose replacement fit
// its event reads back as the same edit of the turn resumed; one whose
// replacement was left out (larger than max_event_bytes) as the edit that
// ends the replay.
func TestCompactionEditFromTheLog(t *testing.T) {
	const maxBytes = 4 << 10
	for _, tc := range []struct {
		name    string
		content string
		omitted bool
	}{
		{name: "fits", content: "short"},
		{name: "too large", content: strings.Repeat("x", maxBytes), omitted: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repl := []llm.Message{
				{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("[2 earlier messages were omitted]")}},
				{Role: llm.RoleTool, Parts: []llm.Part{{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: "c1", Name: "read", Content: tc.content}}}},
			}
			ev := &runtime.Compaction{Strategy: "keep_ends", BeforeCall: true, ReplacedFrom: 1, ReplacedCount: 3, Replacement: repl, EstimatedTokens: 900}
			resp, err := wire.Response(runtime.Event{Seq: 4, Time: time.Now(), TurnID: "t", Payload: ev})
			if err != nil {
				t.Fatal(err)
			}
			if err := wire.Fit(resp, maxBytes); err != nil {
				t.Fatalf("Fit: %v", err)
			}
			back, err := wire.RuntimeEvent(resp.GetEvent())
			if err != nil {
				t.Fatal(err)
			}
			back.Seq = 1
			rs, err := runtime.ResumeFrom([]runtime.Event{back})
			if err != nil || len(rs.Edits) != 1 {
				t.Fatalf("ResumeFrom = %+v, %v", rs, err)
			}
			e := rs.Edits[0]
			want := runtime.ConversationEdit{Committed: 0, From: 1, Count: 3, Replacement: repl}
			if tc.omitted {
				want = runtime.ConversationEdit{Committed: 0, From: -1, Count: 3}
			}
			if e.From != want.From || e.Count != want.Count || e.Committed != want.Committed || len(e.Replacement) != len(want.Replacement) {
				t.Errorf("edit %+v, want %+v", e, want)
			}
			for i := range e.Replacement {
				if e.Replacement[i].Text() != want.Replacement[i].Text() || len(e.Replacement[i].Parts) != len(want.Replacement[i].Parts) {
					t.Errorf("replacement[%d] = %+v", i, e.Replacement[i])
				}
			}
		})
	}
}

// TestResumeThroughTheWire: what a takeover hands the runtime (a run's
// log, each event read back by runtimeEvents) rebuilds the turn as its
// own events do, at every point the log could end: a turn that calls a
// tool, and one cancelled while its tool runs, whose log ends with what
// closes its conversation.
func TestResumeThroughTheWire(t *testing.T) {
	tests := []struct {
		name   string
		cancel bool
	}{{"a tool's turn", false}, {"a cancelled turn", true}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			started := make(chan struct{})
			tool := fake.NewTool("block", func(ctx context.Context, _ llm.ToolCall, progress func(llm.ToolProgress)) (llm.ToolOutput, error) {
				progress(llm.ToolProgress{Message: "working", Progress: 1, Total: 2})
				if !tt.cancel {
					return llm.ToolOutput{Content: "done"}, nil
				}
				close(started)
				<-ctx.Done()
				return llm.ToolOutput{}, ctx.Err()
			})
			p := fake.NewProvider(fake.Reply{Chunks: append([]llm.Chunk{{Kind: llm.ChunkText, Text: "Let me see. "}}, fake.Call("c1", "block", `{}`)...)},
				fake.Reply{Chunks: fake.Text("It is done.")})
			r, err := runtime.New([]*runtime.Model{{Alias: "sim", ProviderName: "fake", Provider: p, ID: "fake-1", Retry: policy.DefaultRetry(),
				// Priced: the wire carries a cost that is (an unknown one is none).
				Price: &llm.Price{Currency: "USD", Input: 3_000_000_000, Output: 15_000_000_000}}}, "sim", []llm.Tool{tool})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancelCause(t.Context())
			defer cancel(nil)
			if tt.cancel {
				go func() {
					<-started
					cancel(&llm.Error{Kind: llm.KindCancelled, Message: "the turn was cancelled by CancelTurn"})
				}()
			}
			var own []runtime.Event
			var log []*turnstilev1.AgentEvent
			req := &runtime.TurnRequest{TurnID: "t1", Messages: []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("go")}}}}
			_, _ = r.Run(ctx, req, runtime.SinkFunc(func(_ context.Context, ev runtime.Event) error {
				out, err := wire.AgentEvent(ev)
				own, log = append(own, ev), append(log, out)
				return err
			}))
			if len(log) < 10 {
				t.Fatalf("the turn emitted %d events", len(log))
			}
			for n := range len(log) + 1 {
				want, err := runtime.ResumeFrom(own[:n])
				if err != nil {
					t.Fatalf("ResumeFrom(%d of its own events): %v", n, err)
				}
				back, err := runtimeEvents(log[:n])
				if err != nil {
					t.Fatalf("runtimeEvents(%d stored events): %v", n, err)
				}
				got, err := runtime.ResumeFrom(back)
				if err != nil {
					t.Fatalf("ResumeFrom(%d stored events): %v", n, err)
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("after %d events, from the log (-own events +stored):\n%s", n, diff)
				}
			}
		})
	}
}
