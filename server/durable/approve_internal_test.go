package durable

import (
	"testing"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// TestResumeFromApprovalsAndSteering: what resumeFrom rebuilds of the
// approvals and steering messages a log holds: the decisions stored, the
// requests made (counted once, however often a takeover emitted them),
// and the steering messages not yet committed, in order.
func TestResumeFromApprovalsAndSteering(t *testing.T) {
	type ev = *turnstilev1.AgentEvent
	textMsg := func(role turnstilev1.Role, s string) *turnstilev1.Message {
		return &turnstilev1.Message{Role: role, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: s}}}}
	}
	committed := func(m *turnstilev1.Message) ev {
		return &turnstilev1.AgentEvent{Payload: &turnstilev1.AgentEvent_MessageCompleted{MessageCompleted: &turnstilev1.MessageCompleted{Message: m}}}
	}
	calls := &turnstilev1.Message{Role: turnstilev1.Role_ROLE_ASSISTANT, Parts: []*turnstilev1.Part{
		{Kind: &turnstilev1.Part_ToolCall{ToolCall: &turnstilev1.ToolCall{Id: "c1", Name: "deploy", Arguments: "{}"}}},
		{Kind: &turnstilev1.Part_ToolCall{ToolCall: &turnstilev1.ToolCall{Id: "c2", Name: "deploy", Arguments: "{}"}}},
	}}
	requested := func(id string) ev {
		return &turnstilev1.AgentEvent{Payload: &turnstilev1.AgentEvent_ToolApprovalRequested{ToolApprovalRequested: &turnstilev1.ToolApprovalRequested{CallId: id, Name: "deploy"}}}
	}
	denied := &turnstilev1.AgentEvent{Payload: &turnstilev1.AgentEvent_ToolApprovalDecided{ToolApprovalDecided: &turnstilev1.ToolApprovalDecided{
		CallId: "c1", Name: "deploy", Reason: "no", DecidedBy: "alice",
	}}}
	steered := func(s string) ev {
		return &turnstilev1.AgentEvent{Payload: &turnstilev1.AgentEvent_Steered{Steered: &turnstilev1.Steered{Message: textMsg(turnstilev1.Role_ROLE_USER, s)}}}
	}
	evs := []ev{
		{Payload: &turnstilev1.AgentEvent_TurnStarted{TurnStarted: &turnstilev1.TurnStarted{Model: "sim"}}},
		steered("first"),
		committed(textMsg(turnstilev1.Role_ROLE_USER, "first")),
		committed(calls),
		requested("c1"), requested("c2"), denied, steered("second"),
		requested("c2"), // emitted again by a replica that took the turn over
	}
	for i, e := range evs {
		e.Seq = uint64(i + 1)
	}
	rs, err := resumeFrom(evs)
	if err != nil {
		t.Fatal(err)
	}
	c := rs.Counters
	if c.ApprovalsRequested != 2 || c.ApprovalsDenied != 1 || c.Steered != 1 {
		t.Errorf("counters %+v, want 2 requested, 1 denied, 1 steered", c)
	}
	d, ok := rs.Decided["c1"]
	if !ok || d.Approved || d.Reason != "no" || d.DecidedBy != "alice" || d.Seq != 7 || len(rs.Decided) != 1 {
		t.Errorf("decided %+v", rs.Decided)
	}
	if !rs.Requested["c1"] || !rs.Requested["c2"] {
		t.Errorf("requested %v", rs.Requested)
	}
	if len(rs.Steering) != 1 || rs.Steering[0].Text() != "second" {
		t.Errorf("steering %v, want [second]", rs.Steering)
	}
}
