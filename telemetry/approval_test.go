package telemetry_test

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/telemetry"
)

// TestApprovalAndSteering runs a turn whose two calls wait for approval:
// one is denied by a key, and a steering message comes while the turn
// waits for the other, which is then skipped. The decision is an event of
// the turn's span and counted by outcome, the steering message too (its
// size, not its text), and the turn's line has the counts.
func TestApprovalAndSteering(t *testing.T) {
	p := newPipeline(t)
	var buf bytes.Buffer
	log := telemetry.NewTurnLog(slog.New(slog.NewJSONHandler(&buf, nil)))
	calls := append(fake.Call("c1", "deploy", `{}`), fake.Call("c2", "deploy", `{}`)...)
	model := fake.NewProvider(fake.Reply{Chunks: calls}, fake.Reply{Chunks: fake.Text("ok")})
	deploy := fake.NewTool("deploy", func(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error) {
		return llm.ToolOutput{Content: "deployed"}, nil
	})
	r, err := runtime.New([]*runtime.Model{{Alias: "a", ProviderName: "oai", Provider: model, ID: "a-id", Retry: fastRetry()}}, "a",
		[]llm.Tool{deploy}, runtime.WithObserver(runtime.Observers(observer(t, p, telemetry.ObserverOptions{}), log)),
		runtime.WithToolRules(runtime.ToolRules{RequireApproval: []string{"deploy"}}))
	if err != nil {
		t.Fatal(err)
	}
	req := userTurn("a secret question")
	req.Controls = runtime.NewControls()
	asked := 0
	sink := runtime.SinkFunc(func(_ context.Context, ev runtime.Event) error {
		if _, ok := ev.Payload.(*runtime.ToolApprovalRequested); ok {
			asked++
			if asked == 2 {
				// Decided from elsewhere, as the server does.
				go func() {
					if _, _, err := req.Controls.Decide("c1", runtime.Decision{Reason: "no", DecidedBy: "alice"}); err != nil {
						t.Error(err)
					}
					if _, err := req.Controls.Steer(llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("secret plan")}}); err != nil {
						t.Error(err)
					}
				}()
			}
		}
		return nil
	})
	res, err := r.Run(t.Context(), req, sink)
	if err != nil {
		t.Fatal(err)
	}
	if c := res.Counters; c.ApprovalsRequested != 2 || c.ApprovalsDenied != 1 || c.Steered != 1 {
		t.Errorf("counters = %+v", c)
	}
	if n := len(deploy.Calls()); n != 0 {
		t.Errorf("deploy ran %d times", n)
	}
	got := tree(p.spans.Ended(), "turnstile.approval.outcome", "turnstile.approval.decided_by", "turnstile.steer.bytes", "gen_ai.tool.call.id")
	for _, want := range []string{
		"@turnstile.approval gen_ai.tool.name=deploy gen_ai.tool.call.id=c1 turnstile.approval.outcome=denied turnstile.approval.waited=",
		" turnstile.approval.decided_by=alice\n",
		"@turnstile.steer turnstile.steer.bytes=11\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("span tree:\n%s\nwant a line %s", got, want)
		}
	}
	m := p.metrics(t)
	if g, w := points(t, m["turnstile.approvals"]), []string{"gen_ai.tool.name=deploy,turnstile.approval.outcome=denied 1"}; !slices.Equal(g, w) {
		t.Errorf("turnstile.approvals = %v, want %v", g, w)
	}
	if g, w := points(t, m["turnstile.steered"]), []string{" 1"}; !slices.Equal(g, w) {
		t.Errorf("turnstile.steered = %v, want %v", g, w)
	}
	if _, ok := m["turnstile.approval.wait"]; !ok {
		t.Error("no turnstile.approval.wait")
	}
	lines := logLines(t, &buf)
	if len(lines) != 1 {
		t.Fatalf("%d lines", len(lines))
	}
	if l := lines[0]; l["approvals_requested"] != 2.0 || l["approvals_denied"] != 1.0 || l["steered"] != 1.0 {
		t.Errorf("line = %v", l)
	}
	if strings.Contains(buf.String(), "secret") {
		t.Errorf("the line holds conversation text: %s", buf.String())
	}
}
