package runtime_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// TestMaxDurationEndsTurn: a turn still running at turn.max_duration ends
// with DEADLINE_EXCEEDED, not retryable, and its model call is stopped.
func TestMaxDurationEndsTurn(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "slow"}}, Hang: true})
	r := newRunner(t, []*runtime.Model{model("m", p)}, nil, withLimits(func(l *runtime.Limits) { l.MaxDuration = 50 * time.Millisecond }))
	start := time.Now()
	evs, _, terr := run(t, t.Context(), r, userTurn("hi"))
	if terr == nil {
		t.Fatal("the turn completed")
	}
	if got, want := describeAll(evs), "start | call m#1 | text | error DEADLINE_EXCEEDED retryable=false"; got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	if !strings.Contains(terr.Message, "time limit (50ms)") {
		t.Errorf("message %q does not say the limit", terr.Message)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the turn took %s", d)
	}
}

// TestToolResultsAreCut: a result over max_tool_result_bytes reaches the
// model, the tool_finished event and the committed message cut, with a
// note of its size, and the results of one step share the budget.
func TestToolResultsAreCut(t *testing.T) {
	const max = 4096
	big := strings.Repeat("é", 5<<20/2) // 5 MB of two-byte runes
	p := fake.NewProvider(
		fake.Reply{Chunks: append(fake.Call("c1", "big", `{}`), fake.Call("c2", "big2", `{}`)...)},
		fake.Reply{Chunks: fake.Text("done")},
	)
	tool := func(name, out string) llm.Tool {
		return fake.NewTool(name, func(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error) {
			return llm.ToolOutput{Content: out}, nil
		})
	}
	r := newRunner(t, []*runtime.Model{model("m", p)}, []llm.Tool{tool("big", big), tool("big2", big)},
		withLimits(func(l *runtime.Limits) { l.MaxToolResultBytes = max }))
	evs, res, terr := run(t, t.Context(), r, userTurn("go"))
	if terr != nil {
		t.Fatal(terr)
	}
	for _, ev := range evs {
		if f, ok := ev.Payload.(*runtime.ToolFinished); ok {
			if len(f.Content) > max || !strings.Contains(f.Content, "of 5242880 bytes are shown]") {
				t.Errorf("tool_finished of %s: %d bytes ending %q", f.Name, len(f.Content), tail(f.Content))
			}
		}
	}
	toolMsg := res.Messages[1]
	total := 0
	for _, part := range toolMsg.Parts {
		c := part.ToolResult.Content
		total += len(c)
		if !strings.HasPrefix(c, "éé") || !strings.Contains(c, "bytes are shown]") || !utf8Valid(c) {
			t.Errorf("committed result of %s ends %q", part.ToolResult.Name, tail(c))
		}
	}
	if total > max {
		t.Errorf("the step's results hold %d bytes, more than %d", total, max)
	}
	sent := p.Requests()[1].Messages
	if got := sent[len(sent)-1].Parts[0].ToolResult.Content; got != toolMsg.Parts[0].ToolResult.Content {
		t.Error("the model got another result than the one committed")
	}
}

// TestSmallResultsKeepWhole: results within the budget are not touched,
// and in a step over budget the small result stays whole.
func TestSmallResultsKeepWhole(t *testing.T) {
	const max = 2048
	p := fake.NewProvider(
		fake.Reply{Chunks: append(fake.Call("c1", "small", `{}`), fake.Call("c2", "big", `{}`)...)},
		fake.Reply{Chunks: fake.Text("done")},
	)
	out := map[string]string{"small": strings.Repeat("s", 100), "big": strings.Repeat("b", 10000)}
	var tools []llm.Tool
	for name, content := range out {
		tools = append(tools, fake.NewTool(name, func(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error) {
			return llm.ToolOutput{Content: content}, nil
		}))
	}
	r := newRunner(t, []*runtime.Model{model("m", p)}, tools, withLimits(func(l *runtime.Limits) { l.MaxToolResultBytes = max }))
	_, res, terr := run(t, t.Context(), r, userTurn("go"))
	if terr != nil {
		t.Fatal(terr)
	}
	parts := res.Messages[1].Parts
	if parts[0].ToolResult.Content != out["small"] {
		t.Errorf("the small result was cut: %q", tail(parts[0].ToolResult.Content))
	}
	if n := len(parts[0].ToolResult.Content) + len(parts[1].ToolResult.Content); n > max || !strings.HasPrefix(parts[1].ToolResult.Content, "bbbb") {
		t.Errorf("results hold %d bytes; big one ends %q", n, tail(parts[1].ToolResult.Content))
	}
}

func TestLimitsProblems(t *testing.T) {
	l := runtime.DefaultLimits()
	l.MaxDuration, l.MaxToolResultBytes = -1, 10
	var fields []string
	for _, p := range l.Problems() {
		fields = append(fields, p.Field)
	}
	if got := strings.Join(fields, ","); got != "max_duration,max_tool_result_bytes" {
		t.Errorf("problems of %+v: %s", l, got)
	}
	if ps := runtime.DefaultLimits().Problems(); len(ps) != 0 {
		t.Errorf("the defaults have problems: %v", ps)
	}
}

// TestValidateReportsEveryProblem: an unknown model and a clashing tool
// name are both reported, and the model's name is not quoted whole.
func TestValidateReportsEveryProblem(t *testing.T) {
	r := newRunner(t, []*runtime.Model{model("a", fake.NewProvider(fake.Reply{}))}, []llm.Tool{fake.NewTool("lookup", nil)})
	err := r.Validate(&runtime.TurnRequest{Model: strings.Repeat("x", 1<<20), ClientTools: []llm.ToolSpec{{Name: "lookup"}}})
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) || len(joined.Unwrap()) != 2 {
		t.Fatalf("Validate = %v, want two problems", err)
	}
	if len(err.Error()) > 300 {
		t.Errorf("the error quotes %d bytes", len(err.Error()))
	}
}

func tail(s string) string {
	if len(s) > 80 {
		return s[len(s)-80:]
	}
	return s
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "") == s }
