package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/turnstile-dev/turnstile/config"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
)

// TestToolRulesFromTheConfig runs the test MCP server's tools under
// require_approval and ends_turn as `turnstile serve` wires them: a call
// of a listed tool waits and, denied, never runs; a tool that ends the
// turn ends it without another model call.
func TestToolRulesFromTheConfig(t *testing.T) {
	appendFile := filepath.Join(t.TempDir(), "appended")
	w := serveYAML(t, mcpConfig(t, appendFile, "    require_approval: [\"*\"]\n    ends_turn: [lookup]\n"))

	req := &turnstilev1.RunTurnRequest{TurnId: "t1", Messages: wiretest.UserText(`[sim tool=append args={"line":"x"}] go`)}
	evs, st := wiretest.Collect(t, t.Context(), w.client, req, func(ev *turnstilev1.AgentEvent) {
		if r := ev.GetToolApprovalRequested(); r != nil {
			if r.GetName() != "append" || r.GetArguments() != `{"line":"x"}` {
				t.Errorf("tool_approval_requested = %v", r)
			}
			resp, err := w.client.ApproveToolCall(t.Context(), &turnstilev1.ApproveToolCallRequest{TurnId: "t1", CallId: r.GetCallId(), Reason: "not now"})
			if err != nil || !resp.GetApplied() {
				t.Errorf("ApproveToolCall = %v, %v", resp, err)
			}
		}
	})
	want := "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolApprovalRequested ToolApprovalDecided ToolFinished " +
		"MessageCompleted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
	if got := wiretest.Names(evs); st.Code() != codes.OK || got != want {
		t.Errorf("denied turn: %v\n got %s\nwant %s", st, got, want)
	}
	if f := toolFinished(evs); len(f) != 1 || f[0].GetContent() != "denied by the user: not now" || !f[0].GetIsError() {
		t.Errorf("tool finished = %v", f)
	}
	if b, err := os.ReadFile(appendFile); err == nil && len(b) > 0 {
		t.Errorf("append ran although denied: %q", b)
	}

	req = &turnstilev1.RunTurnRequest{TurnId: "t2", Messages: wiretest.UserText(`[sim tool=lookup args={"key":"k1"}] go`)}
	evs, st = wiretest.Collect(t, t.Context(), w.client, req, func(ev *turnstilev1.AgentEvent) {
		if r := ev.GetToolApprovalRequested(); r != nil {
			if _, err := w.client.ApproveToolCall(t.Context(), &turnstilev1.ApproveToolCallRequest{TurnId: "t2", CallId: r.GetCallId(), Approved: true}); err != nil {
				t.Error(err)
			}
		}
	})
	want = "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolApprovalRequested ToolApprovalDecided ToolStarted ToolFinished " +
		"MessageCompleted TurnCompleted"
	if got := wiretest.Names(evs); st.Code() != codes.OK || got != want {
		t.Errorf("lookup turn: %v\n got %s\nwant %s", st, got, want)
	}
	if r := evs[len(evs)-1].GetTurnCompleted().GetEndReason(); r != turnstilev1.EndReason_END_REASON_TOOL_ENDED_TURN {
		t.Errorf("end reason %v", r)
	}
}

// TestToolRulesNameUnknownTool refuses to start with a rule naming a tool
// the server does not offer, naming the key.
func TestToolRulesNameUnknownTool(t *testing.T) {
	cfg, err := config.Parse("config.yaml", []byte(mcpConfig(t, filepath.Join(t.TempDir(), "a"), "    ends_turn: [lookup, nope]\n")))
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = buildRunner(t.Context(), cfg, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), `mcp_servers.test.ends_turn[1]: the server offers no tool "nope"`) {
		t.Errorf("buildRunner: %v", err)
	}
}
