package durable

import (
	"context"
	"strings"
	"testing"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/wire"
)

// TestResumeFromACancelledLog: resumeFrom reads the log of a cancelled
// turn. Whole, it is over (nil). Cut anywhere after the interruption note
// (the owner died before storing the terminal event), the turn taken over
// ends CANCELLED without calling the model again; cut after the cancelled
// tool results, it commits the note first.
func TestResumeFromACancelledLog(t *testing.T) {
	started := make(chan struct{})
	block := fake.NewTool("block", func(ctx context.Context, _ llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
		close(started)
		<-ctx.Done()
		return llm.ToolOutput{}, ctx.Err()
	})
	p := fake.NewProvider(fake.Reply{Chunks: fake.Call("c1", "block", `{}`)})
	r, err := runtime.New([]*runtime.Model{{Alias: "sim", ProviderName: "fake", Provider: p, ID: "fake-1", Retry: policy.DefaultRetry()}}, "sim", []llm.Tool{block})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(t.Context())
	go func() {
		<-started
		cancel(&llm.Error{Kind: llm.KindCancelled, Message: "the turn was cancelled by CancelTurn"})
	}()
	var log []*turnstilev1.AgentEvent
	req := &runtime.TurnRequest{TurnID: "t1", Messages: []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("go")}}}}
	_, _ = r.Run(ctx, req, runtime.SinkFunc(func(_ context.Context, ev runtime.Event) error {
		out, err := wire.AgentEvent(ev)
		log = append(log, out)
		return err
	}))
	if rs, err := resumeFrom(log); rs != nil || err != nil {
		t.Fatalf("resumeFrom the whole log = %+v, %v; want nil: the turn is over", rs, err)
	}
	tests := []struct {
		name string
		cut  int // events dropped from the end
		want string
	}{
		{"after the note", 1, "Error"},
		{"after the cancelled results", 2, "MessageCompleted Error"},
		{"after the running tool's cancelled result", 3, "MessageCompleted MessageCompleted Error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stored := log[:len(log)-tt.cut]
			rs, err := resumeFrom(stored)
			if err != nil || rs == nil {
				t.Fatalf("resumeFrom = %+v, %v", rs, err)
			}
			resumed := *req
			resumed.Resume = rs
			var names []string
			_, err = r.Run(t.Context(), &resumed, runtime.SinkFunc(func(_ context.Context, ev runtime.Event) error {
				out, err := wire.AgentEvent(ev)
				if err == nil {
					names = append(names, payloadName(out))
				}
				if ev.Seq != uint64(len(stored)+len(names)) {
					t.Errorf("event seq %d after %d stored", ev.Seq, len(stored))
				}
				return err
			}))
			if got := strings.Join(names, " "); got != tt.want || !isCancelled(err) {
				t.Errorf("resumed: %s (%v), want %s, CANCELLED", got, err, tt.want)
			}
			if p.Calls() != 1 {
				t.Errorf("the model was called %d times, want once", p.Calls())
			}
		})
	}
}

func isCancelled(err error) bool {
	te, ok := err.(*runtime.TurnError)
	return ok && te.Kind == llm.KindCancelled
}

func payloadName(ev *turnstilev1.AgentEvent) string {
	switch ev.GetPayload().(type) {
	case *turnstilev1.AgentEvent_MessageCompleted:
		return "MessageCompleted"
	case *turnstilev1.AgentEvent_Error:
		return "Error"
	}
	return "other"
}
