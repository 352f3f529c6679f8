package client_test

import (
	"context"
	"iter"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
)

func textMsg(role turnstilev1.Role, s string) *turnstilev1.Message {
	return &turnstilev1.Message{Role: role, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: s}}}}
}

// longHistory is five exchanges of 400 bytes and a question: about 520
// tokens by bytes.
func longHistory(question string) []*turnstilev1.Message {
	var msgs []*turnstilev1.Message
	for i := range 5 {
		msgs = append(msgs, textMsg(turnstilev1.Role_ROLE_USER, string(rune('a'+i))+strings.Repeat("q", 199)),
			textMsg(turnstilev1.Role_ROLE_ASSISTANT, strings.Repeat("r", 200)))
	}
	return append(msgs, textMsg(turnstilev1.Role_ROLE_USER, question))
}

// TestCompactedConversationGoesBack: the server compacts a conversation
// that nears the model's window before the call; the client's step retry
// re-sends the compacted conversation (and the tool's result, so the tool
// does not run again), Result.Conversation holds it, and the next turn
// sent from it is not compacted again.
func TestCompactedConversationGoesBack(t *testing.T) {
	tool := &counter{}
	var (
		mu   sync.Mutex
		sent [][]llm.Message
	)
	p := &scripted{fn: func(_ context.Context, call int, req *llm.Request) iter.Seq2[llm.Chunk, error] {
		mu.Lock()
		sent = append(sent, req.Messages)
		mu.Unlock()
		switch call {
		case 1:
			return callTool("call_1", "counter", `{}`)
		case 2:
			return fail(serverError())
		}
		return reply("done")
	}}
	r, err := runtime.New([]*runtime.Model{{
		Alias: "test", ProviderName: "scripted", Provider: p, ID: "scripted-1",
		Retry:         policy.Retry{MaxRetries: 0, Multiplier: 1},
		ContextWindow: 600, Compaction: &runtime.CompactionConfig{},
	}}, "test", []llm.Tool{tool})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serve(t, &replica{Runner: r, ended: make(chan error, 8)})
	c := newClient(t, addr)

	req := &turnstilev1.RunTurnRequest{Messages: longHistory("count once")}
	turn := c.RunTurn(t.Context(), req)
	evs, err := collect(t, turn)
	if err != nil {
		t.Fatalf("turn failed: %v", err)
	}
	var comps []*turnstilev1.Compaction
	for _, ev := range evs {
		if cp := ev.Agent.GetCompaction(); cp != nil {
			comps = append(comps, cp)
		}
	}
	if len(comps) != 1 {
		t.Fatalf("%d compaction events, want 1", len(comps))
	}
	cp := comps[0]
	if cp.GetTrigger() != turnstilev1.CompactionTrigger_COMPACTION_TRIGGER_NEAR_WINDOW || cp.GetReplacedFrom() != 1 || cp.GetReplacedCount() == 0 || len(cp.GetReplacement()) != 1 {
		t.Fatalf("compaction %v", cp)
	}
	compacted, ok := client.ApplyCompaction(req.GetMessages(), cp)
	if !ok || len(compacted) >= len(req.GetMessages()) {
		t.Fatalf("ApplyCompaction: %v, %d messages", ok, len(compacted))
	}
	if n := tool.runs.Load(); n != 1 {
		t.Errorf("the tool ran %d times", n)
	}
	retries := stepRetries(evs)
	if len(retries) != 1 || len(retries[0].Conversation) != len(compacted)+2 {
		t.Fatalf("step retries %d; want one whose conversation is the compacted one and the step's call and result", len(retries))
	}
	// What the model got: the compacted conversation on the first call,
	// and on the step retry's (call 3) too, with the call and its result.
	mu.Lock()
	calls := slices.Clone(sent)
	mu.Unlock()
	if len(calls) != 3 || len(calls[0]) != len(compacted) || len(calls[2]) != len(compacted)+2 || calls[2][len(calls[2])-1].Role != llm.RoleTool {
		t.Fatalf("the model got conversations of %v messages", lens(calls))
	}
	res := turn.Result()
	want := append(append([]*turnstilev1.Message(nil), compacted...), res.Messages...)
	if len(res.Conversation) != len(want) {
		t.Fatalf("result conversation of %d messages, want %d", len(res.Conversation), len(want))
	}
	for i := range want {
		if !proto.Equal(res.Conversation[i], want[i]) {
			t.Errorf("conversation[%d] = %v, want %v", i, res.Conversation[i], want[i])
		}
	}
	if len(req.GetMessages()) != 11 {
		t.Errorf("the caller's request was modified")
	}

	// The next turn, from the compacted conversation, is accepted as it
	// is and not compacted again.
	next := &turnstilev1.RunTurnRequest{Messages: append(res.Conversation, textMsg(turnstilev1.Role_ROLE_USER, "thanks"))}
	res2, err := c.RunTurn(t.Context(), next).Wait()
	if err != nil {
		t.Fatalf("next turn: %v", err)
	}
	if res2.Counters.GetCompactions() != 0 || len(res2.Conversation) != len(next.GetMessages())+1 {
		t.Errorf("next turn: %d compactions, conversation of %d", res2.Counters.GetCompactions(), len(res2.Conversation))
	}
}

func lens(calls [][]llm.Message) []int {
	var out []int
	for _, c := range calls {
		out = append(out, len(c))
	}
	return out
}

func TestApplyCompaction(t *testing.T) {
	conv := []*turnstilev1.Message{textMsg(1, "a"), textMsg(2, "b"), textMsg(1, "c"), textMsg(2, "d"), textMsg(1, "e")}
	note := textMsg(1, "[2 earlier messages were omitted]")
	cases := []struct {
		name string
		c    *turnstilev1.Compaction
		want []string
		ok   bool
	}{
		{"the middle", &turnstilev1.Compaction{ReplacedFrom: 1, ReplacedCount: 3, Replacement: []*turnstilev1.Message{note}}, []string{"a", note.GetParts()[0].GetText(), "e"}, true},
		{"one message rewritten", &turnstilev1.Compaction{ReplacedFrom: 2, ReplacedCount: 1, Replacement: []*turnstilev1.Message{textMsg(1, "C")}}, []string{"a", "b", "C", "d", "e"}, true},
		{"the whole", &turnstilev1.Compaction{ReplacedFrom: 0, ReplacedCount: 5, Replacement: []*turnstilev1.Message{note}}, []string{note.GetParts()[0].GetText()}, true},
		{"omitted", &turnstilev1.Compaction{ReplacedFrom: 1, ReplacedCount: 3, ReplacementOmitted: true}, []string{"a", "b", "c", "d", "e"}, false},
		{"out of range", &turnstilev1.Compaction{ReplacedFrom: 4, ReplacedCount: 2}, []string{"a", "b", "c", "d", "e"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := client.ApplyCompaction(conv, tc.c)
			var texts []string
			for _, m := range got {
				texts = append(texts, m.GetParts()[0].GetText())
			}
			if ok != tc.ok || strings.Join(texts, "|") != strings.Join(tc.want, "|") {
				t.Errorf("got %v %v, want %v %v", texts, ok, tc.want, tc.ok)
			}
			if len(conv) != 5 || conv[1].GetParts()[0].GetText() != "b" {
				t.Error("conv was modified")
			}
		})
	}
}
