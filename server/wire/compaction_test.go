package wire

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
// out; one that fits is sent whole; both read back as they were sent.
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
			resp, err := Response(runtime.Event{Seq: 4, Time: time.Now(), TurnID: "t", Payload: ev})
			if err != nil {
				t.Fatal(err)
			}
			if err := Fit(resp, maxBytes); err != nil {
				t.Fatalf("Fit: %v", err)
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
			back, err := RuntimeEvent(resp.GetEvent())
			if err != nil {
				t.Fatal(err)
			}
			rc, ok := back.Payload.(*runtime.Compaction)
			if !ok || rc.ReplacementOmitted != tc.omitted || rc.ReplacedFrom != 1 || rc.ReplacedCount != 3 || !rc.BeforeCall || rc.EstimatedTokens != 900 {
				t.Fatalf("read back as %+v", back.Payload)
			}
			want := repl
			if tc.omitted {
				want = nil
			}
			if len(rc.Replacement) != len(want) {
				t.Fatalf("replacement of %d messages read back, want %d", len(rc.Replacement), len(want))
			}
			for i := range rc.Replacement {
				if rc.Replacement[i].Text() != want[i].Text() || len(rc.Replacement[i].Parts) != len(want[i].Parts) {
					t.Errorf("replacement[%d] = %+v", i, rc.Replacement[i])
				}
			}
		})
	}
}
