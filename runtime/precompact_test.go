package runtime_test

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

func text(role llm.Role, s string) llm.Message {
	return llm.Message{Role: role, Parts: []llm.Part{llm.TextPart(s)}}
}

func callMsg(id string) llm.Message {
	return llm.Message{Role: llm.RoleAssistant, Parts: []llm.Part{{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: id, Name: "read", Arguments: "{}"}}}}
}

func resultMsg(id, content string) llm.Message {
	return llm.Message{Role: llm.RoleTool, Parts: []llm.Part{{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: id, Name: "read", Content: content}}}}
}

// history is a conversation of five exchanges, 400 bytes each, then a
// question: about 520 tokens by bytes.
func history() []llm.Message {
	var msgs []llm.Message
	for i := range 5 {
		q := string(rune('a'+i)) + strings.Repeat("q", 199)
		msgs = append(msgs, text(llm.RoleUser, q), text(llm.RoleAssistant, strings.Repeat("r", 200)))
	}
	return append(msgs, text(llm.RoleUser, "and now?"))
}

func compactions(evs []runtime.Event) []*runtime.Compaction {
	var out []*runtime.Compaction
	for _, ev := range evs {
		if c, ok := ev.Payload.(*runtime.Compaction); ok {
			out = append(out, c)
		}
	}
	return out
}

// apply applies c to conv as a client does.
func apply(conv []llm.Message, c *runtime.Compaction) []llm.Message {
	out := append([]llm.Message(nil), conv[:c.ReplacedFrom]...)
	out = append(out, c.Replacement...)
	return append(out, conv[c.ReplacedFrom+c.ReplacedCount:]...)
}

func TestCompactBeforeTheCall(t *testing.T) {
	cases := []struct {
		name      string
		window    int
		at        float64
		compacted bool
	}{
		{name: "over the share of the window", window: 600, at: 0.8, compacted: true},
		{name: "under it", window: 600, at: 0.9},
		{name: "at one, over the window", window: 500, at: 1, compacted: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := fake.NewProvider(fake.Reply{Chunks: fake.Text("done")})
			m := model("a", p)
			m.ContextWindow, m.Compaction = tc.window, &runtime.CompactionConfig{At: &tc.at}
			r := newRunner(t, []*runtime.Model{m}, nil)
			msgs := history()
			evs, _, terr := run(t, t.Context(), r, &runtime.TurnRequest{Messages: msgs})
			if terr != nil {
				t.Fatal(terr)
			}
			want := "start | call a#1 | text | finished | usage | commit assistant | completed end_turn"
			if tc.compacted {
				want = "start | compaction | call a#1 | text | finished | usage | commit assistant | completed end_turn"
			}
			if got := describeAll(evs); got != want {
				t.Fatalf("events:\n got %s\nwant %s", got, want)
			}
			sent := p.Requests()[0].Messages
			if !tc.compacted {
				if !reflect.DeepEqual(sent, msgs) {
					t.Errorf("the request was changed: %d messages", len(sent))
				}
				return
			}
			c := compactions(evs)[0]
			if !c.BeforeCall || c.Strategy != "keep_ends" || c.EstimatedTokens != runtime.ConversationSize(msgs)/4 {
				t.Errorf("compaction %+v", c)
			}
			if !reflect.DeepEqual(apply(msgs, c), sent) {
				t.Errorf("the replacement applied to the client's conversation is not what was sent:\n%v", sent)
			}
			if c.MessagesAfter != len(sent) || c.BytesAfter != runtime.ConversationSize(sent) || len(sent) >= len(msgs) {
				t.Errorf("compaction %+v, %d messages sent", c, len(sent))
			}
			if sent[0].Text() != msgs[0].Text() || sent[len(sent)-1].Text() != "and now?" {
				t.Errorf("the ends were not kept: %v", sent)
			}
		})
	}
}

// TestCompactBeforeTheCallFromReportedTokens: the provider's report of
// the first call's prompt, not the bytes, decides the second call's.
func TestCompactBeforeTheCallFromReportedTokens(t *testing.T) {
	call := fake.Call("c1", "read", "{}")
	call[3].Usage = llm.Usage{InputTokens: 300, CacheReadTokens: 150, CacheWriteTokens: 50}
	p := fake.NewProvider(fake.Reply{Chunks: call}, fake.Reply{Chunks: fake.Text("done")})
	tool := fake.NewTool("read", func(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error) {
		return llm.ToolOutput{Content: "ok"}, nil
	})
	m := model("a", p)
	m.ContextWindow, m.Compaction = 600, &runtime.CompactionConfig{}
	r := newRunner(t, []*runtime.Model{m}, []llm.Tool{tool})
	// 130 tokens by bytes: far under 480 (0.8 of 600) until the provider
	// says the prompt was 500.
	msgs := []llm.Message{text(llm.RoleUser, strings.Repeat("a", 200)), text(llm.RoleAssistant, strings.Repeat("b", 100)),
		text(llm.RoleUser, strings.Repeat("c", 100)), text(llm.RoleAssistant, strings.Repeat("d", 100)), text(llm.RoleUser, "go")}
	evs, _, terr := run(t, t.Context(), r, &runtime.TurnRequest{Messages: msgs})
	if terr != nil {
		t.Fatal(terr)
	}
	want := "start | call a#1 | tooldelta | finished | usage | commit assistant | tool read | tooldone read | commit tool | compaction | call a#1 | text | finished | usage | commit assistant | completed end_turn"
	if got := describeAll(evs); got != want {
		t.Fatalf("events:\n got %s\nwant %s", got, want)
	}
	c := compactions(evs)[0]
	second := p.Requests()[1].Messages
	full := append(append([]llm.Message(nil), msgs...), second[len(second)-2:]...) // and the step's call and result
	if c.EstimatedTokens < 500 || c.ReplacedFrom != 1 || c.ReplacedCount != 3 || len(c.Replacement) != 1 {
		t.Errorf("compaction %+v", c)
	}
	if got := apply(full, c); !reflect.DeepEqual(got, p.Requests()[1].Messages) {
		t.Errorf("applied %v\nsent %v", got, p.Requests()[1].Messages)
	}
}

func TestSummarizeBeforeTheCall(t *testing.T) {
	cases := []struct {
		name    string
		summary fake.Reply
		// wantSummary is the text the next request carries in place of
		// the middle; empty when the summary failed.
		wantSummary string
		wantErr     string
		// events is the turn's events; a summary call that used tokens
		// is followed by the turn's running totals, as a model call is.
		events string
	}{
		{name: "the summary replaces the middle", summary: fake.Reply{Chunks: fake.Text("They compared five letters.")},
			wantSummary: "They compared five letters.",
			events:      "start | usage | compaction | call a#1 | text | finished | usage | commit assistant | completed end_turn"},
		{name: "a failed summary falls back to keep_ends", summary: fake.Reply{Err: providerErr(llm.KindServerError, 0)},
			wantErr: "the summary call to cheap failed: SERVER_ERROR: upstream says SERVER_ERROR",
			events:  "start | compaction | call a#1 | text | finished | usage | commit assistant | completed end_turn"},
		{name: "an empty summary falls back to keep_ends", summary: fake.Reply{Chunks: fake.Text(" ")},
			wantErr: "the summary call to cheap returned no text",
			events:  "start | usage | compaction | call a#1 | text | finished | usage | commit assistant | completed end_turn"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := fake.NewProvider(fake.Reply{Chunks: fake.Text("done")})
			cheap := fake.NewProvider(tc.summary)
			m := model("a", p)
			m.ContextWindow, m.Compaction = 600, &runtime.CompactionConfig{Strategy: runtime.CompactSummarize, Model: "cheap"}
			r := newRunner(t, []*runtime.Model{m, model("cheap", cheap)}, nil)
			msgs := history()
			evs, _, terr := run(t, t.Context(), r, &runtime.TurnRequest{Messages: msgs})
			if terr != nil {
				t.Fatal(terr)
			}
			if got := describeAll(evs); got != tc.events {
				t.Fatalf("events:\n got %s\nwant %s", got, tc.events)
			}
			// The summary's 10/5 tokens, then the model call's added.
			var totals []string
			for _, ev := range evs {
				if u, ok := ev.Payload.(*runtime.UsageUpdated); ok {
					totals = append(totals, fmt.Sprintf("%d/%d", u.Total.InputTokens, u.Total.OutputTokens))
				}
			}
			wantTotals := "10/5 20/10"
			if tc.summary.Err != nil {
				wantTotals = "10/5"
			}
			if got := strings.Join(totals, " "); got != wantTotals {
				t.Errorf("usage totals %s, want %s", got, wantTotals)
			}
			c := compactions(evs)[0]
			if cheap.Calls() != 1 {
				t.Fatalf("the summary model got %d calls", cheap.Calls())
			}
			sreq := cheap.Requests()[0]
			if sreq.Model != "cheap-id" || !strings.Contains(sreq.Messages[0].Text(), msgs[2].Text()) || strings.Contains(sreq.Messages[0].Text(), msgs[0].Text()) {
				t.Errorf("summary request %+v: it should hold the dropped middle only", sreq)
			}
			sent := p.Requests()[0].Messages
			if !reflect.DeepEqual(apply(msgs, c), sent) || len(c.Replacement) != 1 {
				t.Fatalf("replacement %+v does not give what was sent", c)
			}
			got := c.Replacement[0].Text()
			if tc.wantSummary != "" {
				if c.Strategy != "summarize" || c.SummaryError != "" || !strings.HasSuffix(got, "\n"+tc.wantSummary) {
					t.Errorf("strategy %q error %q, replacement %q", c.Strategy, c.SummaryError, got)
				}
				return
			}
			if c.Strategy != "keep_ends" || c.SummaryError != tc.wantErr || !strings.Contains(got, "omitted to fit the context window") {
				t.Errorf("strategy %q error %q, replacement %q", c.Strategy, c.SummaryError, got)
			}
		})
	}
}

// pairsIntact reports whether every tool result in msgs follows its call
// and every call before the last message is answered.
func pairsIntact(msgs []llm.Message) bool {
	calls := map[string]bool{}
	for _, m := range msgs {
		for _, p := range m.Parts {
			switch {
			case p.ToolCall != nil:
				calls[p.ToolCall.ID] = false
			case p.ToolResult != nil:
				answered, ok := calls[p.ToolResult.CallID]
				if !ok || answered {
					return false
				}
				calls[p.ToolResult.CallID] = true
			}
		}
	}
	for _, answered := range calls {
		if !answered {
			return false
		}
	}
	return true
}

func TestCompactionNeverSplitsToolPairs(t *testing.T) {
	big := strings.Repeat("z", 3000)
	u := func(s string) llm.Message { return text(llm.RoleUser, s+strings.Repeat(".", 300)) }
	a := func(s string) llm.Message { return text(llm.RoleAssistant, s+strings.Repeat(".", 300)) }
	shapes := []struct {
		name string
		msgs []llm.Message
	}{
		{"tool pairs in the middle", []llm.Message{u("1"), callMsg("c1"), resultMsg("c1", big), a("2"), u("3"), callMsg("c2"), resultMsg("c2", "ok"), a("4"), u("5")}},
		{"a tool pair right after the first message", []llm.Message{u("1"), callMsg("c1"), resultMsg("c1", "ok"), callMsg("c2"), resultMsg("c2", "ok"), a("2"), u("3")}},
		{"the newest exchange is tool calls", []llm.Message{u("1"), a("2"), u("3"), a("4"), u("5"), callMsg("c1"), resultMsg("c1", big), callMsg("c2"), resultMsg("c2", big)}},
		{"results carried by user messages", []llm.Message{u("1"), callMsg("c1"),
			{Role: llm.RoleUser, Parts: []llm.Part{{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: "c1", Content: big}}, llm.TextPart("more")}},
			a("2"), u("3"), callMsg("c2"), resultMsg("c2", "ok"), a("4"), u("5")}},
		{"several calls in one message", []llm.Message{u("1"), {Role: llm.RoleAssistant, Parts: []llm.Part{
			{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "c1", Name: "read", Arguments: "{}"}},
			{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "c2", Name: "read", Arguments: "{}"}}}},
			resultMsg("c1", big), resultMsg("c2", big), a("2"), u("3"), a("4"), u("5")}},
	}
	cheap := fake.NewProvider(fake.Reply{Chunks: fake.Text("a summary")})
	compactors := []runtime.Compactor{
		runtime.KeepEnds{},
		runtime.KeepEnds{Target: 0.1, MaxToolResult: 100},
		&runtime.Summarize{Model: model("cheap", cheap), Alias: "cheap", KeepEnds: runtime.KeepEnds{Target: 0.1}},
	}
	for _, sh := range shapes {
		for _, c := range compactors {
			t.Run(sh.name+"/"+c.Name(), func(t *testing.T) {
				if !pairsIntact(sh.msgs) {
					t.Fatal("the shape itself splits a pair")
				}
				out, err := c.Compact(t.Context(), "", sh.msgs)
				if err != nil {
					t.Fatal(err)
				}
				if runtime.ConversationSize(out) >= runtime.ConversationSize(sh.msgs) {
					t.Errorf("nothing was removed")
				}
				if !pairsIntact(out) {
					t.Errorf("a tool pair was split: %v", out)
				}
				if out[0].Role != llm.RoleUser || out[len(out)-1].Text() != sh.msgs[len(sh.msgs)-1].Text() {
					t.Errorf("the ends were not kept")
				}
			})
		}
	}
}

// TestResumeKeepsCompactions: a turn taken over after a compaction goes on
// with the compacted conversation, the one its clients applied.
func TestResumeKeepsCompactions(t *testing.T) {
	msgs := history()[:5] // u a u a u
	note := text(llm.RoleUser, "[3 earlier messages were omitted to fit the context window]")
	committed := []llm.Message{callMsg("c1"), resultMsg("c1", "ok")}
	cases := []struct {
		name  string
		edits []runtime.ConversationEdit
		want  []llm.Message
	}{
		{name: "no compaction", want: append(append([]llm.Message(nil), msgs...), committed...)},
		{name: "a compaction before the first commit", edits: []runtime.ConversationEdit{{Committed: 0, From: 1, Count: 3, Replacement: []llm.Message{note}}},
			want: []llm.Message{msgs[0], note, msgs[4], committed[0], committed[1]}},
		{name: "a compaction after the step's commits", edits: []runtime.ConversationEdit{{Committed: 2, From: 1, Count: 5, Replacement: []llm.Message{note}}},
			want: []llm.Message{msgs[0], note, committed[1]}},
		{name: "an omitted replacement ends the replay", edits: []runtime.ConversationEdit{{Committed: 0, From: -1}, {Committed: 1, From: 1, Count: 3}},
			want: append(append([]llm.Message(nil), msgs...), committed...)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := fake.NewProvider(fake.Reply{Chunks: fake.Text("done")})
			r := newRunner(t, []*runtime.Model{model("a", p)}, nil)
			rs := &runtime.Resume{NextSeq: 10, Committed: committed, Edits: tc.edits, LastStop: llm.StopToolUse}
			rec := &recorder{}
			if _, err := r.Run(t.Context(), &runtime.TurnRequest{TurnID: "t1", Messages: msgs, Resume: rs}, rec); err != nil {
				t.Fatal(err)
			}
			if got := p.Requests()[0].Messages; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("sent %d messages:\n%v\nwant %d:\n%v", len(got), got, len(tc.want), tc.want)
			}
		})
	}
}

// TestSummarizeThatOnlyCutsToolResults: when cutting oversized tool
// results is enough, nothing is summarized and the event says keep_ends.
func TestSummarizeThatOnlyCutsToolResults(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: fake.Text("done")})
	cheap := fake.NewProvider(fake.Reply{Chunks: fake.Text("unused")})
	m := model("a", p)
	m.ContextWindow, m.Compaction = 1000, &runtime.CompactionConfig{Strategy: runtime.CompactSummarize, Model: "cheap"}
	r := newRunner(t, []*runtime.Model{m, model("cheap", cheap)}, nil)
	msgs := []llm.Message{text(llm.RoleUser, "read it"), callMsg("c1"), resultMsg("c1", strings.Repeat("z", 8000)), text(llm.RoleUser, "and?")}
	evs, _, terr := run(t, t.Context(), r, &runtime.TurnRequest{Messages: msgs})
	if terr != nil {
		t.Fatal(terr)
	}
	c := compactions(evs)
	if len(c) != 1 || c[0].Strategy != "keep_ends" || c[0].SummaryError != "" || c[0].ReplacedFrom != 2 || c[0].ReplacedCount != 1 || cheap.Calls() != 0 {
		t.Fatalf("compactions %+v, %d summary calls", c, cheap.Calls())
	}
	if got := c[0].Replacement[0].Parts[0].ToolResult.Content; !strings.HasSuffix(got, "[5952 bytes omitted to fit the context window]") {
		t.Errorf("the tool result is %q...", got[:40])
	}
}

// TestSummaryCallIsBounded: the transcript sent to the summary model fits
// three quarters of its window (its middle cut), and the summary's length
// is capped (its max_output_tokens, else 1024 tokens).
func TestSummaryCallIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name           string
		window, maxOut int
		wantMax        int // the transcript's most bytes
		wantOut        int
	}{
		{name: "a known window", window: 100, maxOut: 64, wantMax: 300 + 64, wantOut: 64},
		{name: "an unknown window", wantMax: 256<<10 + 64, wantOut: 1024},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cheap := fake.NewProvider(fake.Reply{Chunks: fake.Text("short")})
			sm := model("cheap", cheap)
			sm.ContextWindow, sm.MaxOutputTokens = tc.window, tc.maxOut
			s := &runtime.Summarize{Model: sm, Alias: "cheap", KeepEnds: runtime.KeepEnds{Target: 0.01}}
			var msgs []llm.Message
			for i := range 40 {
				msgs = append(msgs, text(llm.RoleUser, sprintf("q%d %s", i, strings.Repeat("é", 5000))), text(llm.RoleAssistant, "ok"))
			}
			msgs = append(msgs, text(llm.RoleUser, "end"))
			if _, err := s.Compact(t.Context(), "", msgs); err != nil {
				t.Fatal(err)
			}
			req := cheap.Requests()[0]
			got := len(req.Messages[0].Text())
			if got > tc.wantMax || got < tc.wantMax/2 || req.MaxOutputTokens != tc.wantOut {
				t.Errorf("transcript of %d bytes (at most %d), max output %d (want %d)", got, tc.wantMax, req.MaxOutputTokens, tc.wantOut)
			}
			if !utf8.ValidString(req.Messages[0].Text()) {
				t.Error("the transcript is not UTF-8")
			}
			if !strings.Contains(req.Messages[0].Text(), "bytes omitted]") {
				t.Error("the transcript's middle was not marked as cut")
			}
		})
	}
}

// TestCutToolResultsStayUTF8: a tool result cut to fit is cut at a
// character's start, since the replacement goes to the client as a
// protobuf string.
func TestCutToolResultsStayUTF8(t *testing.T) {
	msgs := []llm.Message{text(llm.RoleUser, "read"), callMsg("c1"), resultMsg("c1", "a"+strings.Repeat("é", 3000)), text(llm.RoleUser, "and?")}
	out, err := runtime.KeepEnds{}.Compact(t.Context(), "", msgs)
	if err != nil {
		t.Fatal(err)
	}
	got := out[2].Parts[0].ToolResult.Content
	if !utf8.ValidString(got) || !strings.HasSuffix(got, "[3954 bytes omitted to fit the context window]") {
		t.Errorf("cut result ends %q (%d bytes)", got[len(got)-60:], len(got))
	}
}

// TestPromptCacheKey: with prompt_cache auto (the default) every call of a
// conversation carries the same key, a digest that holds none of its
// text, another conversation another key, and off sends neither key nor
// marks.
func TestPromptCacheKey(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: fake.Call("c1", "read", "{}")}, fake.Reply{Chunks: fake.Text("done")})
	tool := fake.NewTool("read", func(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error) {
		return llm.ToolOutput{Content: "ok"}, nil
	})
	off := fake.NewProvider(fake.Reply{Chunks: fake.Text("done")})
	mOff := model("off", off)
	mOff.PromptCache = runtime.PromptCacheOff
	r := newRunner(t, []*runtime.Model{model("a", p), mOff}, []llm.Tool{tool})
	for _, q := range []string{"a secret question", "another question"} {
		if _, _, terr := run(t, t.Context(), r, &runtime.TurnRequest{System: "be brief", Messages: []llm.Message{text(llm.RoleUser, q)}}); terr != nil {
			t.Fatal(terr)
		}
	}
	reqs := p.Requests() // two calls of the first turn, then the second's
	k := reqs[0].PromptCacheKey
	if !reqs[0].CachePrompt || !strings.HasPrefix(k, "ts-") || len(k) != 27 || reqs[1].PromptCacheKey != k || strings.Contains(k, "secret") {
		t.Errorf("first turn's keys %q, %q", k, reqs[1].PromptCacheKey)
	}
	if reqs[2].PromptCacheKey == k || reqs[2].PromptCacheKey == "" {
		t.Errorf("another conversation's key %q", reqs[2].PromptCacheKey)
	}
	if _, _, terr := run(t, t.Context(), r, &runtime.TurnRequest{Model: "off", Messages: []llm.Message{text(llm.RoleUser, "hi")}}); terr != nil {
		t.Fatal(terr)
	}
	if req := off.Requests()[0]; req.CachePrompt || req.PromptCacheKey != "" {
		t.Errorf("prompt_cache off sent %v %q", req.CachePrompt, req.PromptCacheKey)
	}
}
