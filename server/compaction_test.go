package server

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// TestCompactionReplacementFitsTheEvent: a replacement larger than
// max_event_bytes is left out (replacement_omitted), and the event goes
// out; one that fits is sent whole and reads back as the same edit.
func TestCompactionReplacementFitsTheEvent(t *testing.T) {
	const maxBytes = 4 << 10
	cases := []struct {
		name    string
		content string
		omitted bool
	}{
		{name: "fits", content: "short"},
		{name: "too large", content: strings.Repeat("x", maxBytes), omitted: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			repl := []llm.Message{
				{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("[2 earlier messages were omitted]")}},
				{Role: llm.RoleTool, Parts: []llm.Part{{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: "c1", Name: "read", Content: tc.content}}}},
			}
			ev := &runtime.Compaction{Strategy: "keep_ends", BeforeCall: true, ReplacedFrom: 1, ReplacedCount: 3, Replacement: repl, EstimatedTokens: 900}
			resp, err := toResponse(runtime.Event{Seq: 4, Time: time.Now(), TurnID: "t", Payload: ev})
			if err != nil {
				t.Fatal(err)
			}
			if err := fitEvent(resp, maxBytes); err != nil {
				t.Fatalf("fitEvent: %v", err)
			}
			c := resp.GetEvent().GetCompaction()
			if size := proto.Size(resp); size > maxBytes {
				t.Errorf("event of %d bytes", size)
			}
			if c.GetReplacementOmitted() != tc.omitted || (len(c.GetReplacement()) == 0) != tc.omitted {
				t.Fatalf("omitted %v with %d messages", c.GetReplacementOmitted(), len(c.GetReplacement()))
			}
			if c.GetTrigger() != turnstilev1.CompactionTrigger_COMPACTION_TRIGGER_NEAR_WINDOW || c.GetReplacedFrom() != 1 || c.GetReplacedCount() != 3 || c.GetEstimatedTokens() != 900 {
				t.Errorf("compaction %v", c)
			}
			e, err := toEdit(c, 2)
			if err != nil {
				t.Fatal(err)
			}
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
