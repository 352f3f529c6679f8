package durable

import (
	"strings"
	"testing"
	"time"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/wire"
)

// TestResumeFromCut: what resumeFrom keeps of the output of the model call
// a dead owner left: the text streamed since the last commit (through
// retries that kept it), which a model with on_stream_cut: continue goes
// on from; nothing when reasoning or a tool call was streamed, or the
// output was discarded or committed.
func TestResumeFromCut(t *testing.T) {
	type ev = *turnstilev1.AgentEvent
	text := func(s string) ev {
		return &turnstilev1.AgentEvent{Payload: &turnstilev1.AgentEvent_TextDelta{TextDelta: &turnstilev1.TextDelta{Text: s}}}
	}
	thinking := &turnstilev1.AgentEvent{Payload: &turnstilev1.AgentEvent_ThinkingDelta{ThinkingDelta: &turnstilev1.ThinkingDelta{Text: "hmm"}}}
	call := func() ev {
		return &turnstilev1.AgentEvent{Payload: &turnstilev1.AgentEvent_LlmCallStarted{LlmCallStarted: &turnstilev1.LlmCallStarted{Model: "sim"}}}
	}
	retry := func(discard bool) ev {
		return &turnstilev1.AgentEvent{Payload: &turnstilev1.AgentEvent_Retry{Retry: &turnstilev1.Retry{DiscardPartial: discard}}}
	}
	tests := []struct {
		name        string
		events      []ev
		wantCut     string
		wantDiscard uint64
	}{
		{"text", []ev{call(), text("Hel"), text("lo ")}, "Hello ", 2},
		{"text kept through a retry", []ev{call(), text("Hel"), retry(false), call(), text("lo ")}, "Hello ", 2},
		{"text discarded by a retry", []ev{call(), text("Hel"), retry(true), call(), text("Hi ")}, "Hi ", 5},
		{"reasoning first", []ev{call(), thinking, text("Hello")}, "", 2},
		{"no output", []ev{call()}, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var evs []*turnstilev1.AgentEvent
			for i, e := range tt.events {
				e.Seq = uint64(i + 1)
				evs = append(evs, e)
			}
			rs, err := resumeFrom(evs)
			if err != nil {
				t.Fatal(err)
			}
			var cut string
			for _, p := range rs.Cut {
				cut += p.Text
			}
			if cut != tt.wantCut || rs.DiscardFromSeq != tt.wantDiscard {
				t.Errorf("cut %q from seq %d, want %q from %d", cut, rs.DiscardFromSeq, tt.wantCut, tt.wantDiscard)
			}
		})
	}
}

// TestResumeFromSteering: a run taken over counts the text of every
// steering message its log holds, committed or not, against
// turn.max_steer_bytes.
func TestResumeFromSteering(t *testing.T) {
	steered := func(texts ...string) *turnstilev1.AgentEvent {
		m := &turnstilev1.Message{Role: turnstilev1.Role_ROLE_USER}
		for _, s := range texts {
			m.Parts = append(m.Parts, &turnstilev1.Part{Kind: &turnstilev1.Part_Text{Text: s}})
		}
		return &turnstilev1.AgentEvent{Payload: &turnstilev1.AgentEvent_Steered{Steered: &turnstilev1.Steered{Message: m}}}
	}
	completed := &turnstilev1.AgentEvent{Payload: &turnstilev1.AgentEvent_MessageCompleted{MessageCompleted: &turnstilev1.MessageCompleted{
		Message: &turnstilev1.Message{Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "use staging"}}}},
	}}}
	evs := []*turnstilev1.AgentEvent{steered("use staging"), completed, steered("and ", "hurry")}
	for i, e := range evs {
		e.Seq = uint64(i + 1)
	}
	rs, err := resumeFrom(evs)
	if err != nil {
		t.Fatal(err)
	}
	if rs.SteerBytes != len("use staging")+len("and hurry") || len(rs.Steering) != 1 {
		t.Errorf("steer bytes %d, %d queued; want %d, 1", rs.SteerBytes, len(rs.Steering), len("use staging")+len("and hurry"))
	}
}

// TestCompactionEditFromTheLog: a stored compaction whose replacement fit
// its event reads back as the same edit; one whose replacement was left
// out (larger than max_event_bytes) as the edit that ends the replay.
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
			e := editOf(back.Payload.(*runtime.Compaction), 2)
			want := runtime.ConversationEdit{Committed: 2, From: 1, Count: 3, Replacement: repl}
			if tc.omitted {
				want = runtime.ConversationEdit{Committed: 2, From: -1, Count: 3}
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
