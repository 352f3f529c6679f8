package anthropic

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

// TestCacheBreakpoints holds the breakpoints to the shape of Anthropic's
// prompt caching docs ("cache_control": {"type": "ephemeral"} on the last
// tool, the system block and message content blocks), at most four.
func TestCacheBreakpoints(t *testing.T) {
	t.Parallel()
	user := func(s string) llm.Message { return llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(s)}} }
	call := llm.Message{Role: llm.RoleAssistant, Parts: []llm.Part{
		llm.TextPart("Checking."),
		{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "toolu_1", Name: "get_weather", Arguments: `{"city":"SF"}`}},
	}}
	result := llm.Message{Role: llm.RoleTool, Parts: []llm.Part{
		{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: "toolu_1", Name: "get_weather", Content: "18C"}},
	}}
	thinking := llm.Message{Role: llm.RoleAssistant, Parts: []llm.Part{
		llm.TextPart("It is 18C."),
		{Kind: llm.PartThinking, Text: "done", Signature: "sig"},
	}}
	tools := []llm.ToolSpec{{Name: "get_weather"}, {Name: "now"}}
	const eph = `"cache_control": {"type": "ephemeral"}`
	cases := []struct {
		name  string
		req   llm.Request
		want  string // the body's system, messages and tools
		marks int
	}{{
		name: "off sends no breakpoint",
		req:  llm.Request{System: "Be brief.", Messages: []llm.Message{user("Hi")}, Tools: tools},
		want: `{"system": [{"type": "text", "text": "Be brief."}],
			"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
			"tools": [{"name": "get_weather", "input_schema": {"type": "object"}}, {"name": "now", "input_schema": {"type": "object"}}]}`,
	}, {
		name: "first call: tools, system, the newest message",
		req:  llm.Request{CachePrompt: true, System: "Be brief.", Messages: []llm.Message{user("Hi")}, Tools: tools},
		want: `{"system": [{"type": "text", "text": "Be brief.", ` + eph + `}],
			"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi", ` + eph + `}]}],
			"tools": [{"name": "get_weather", "input_schema": {"type": "object"}}, {"name": "now", "input_schema": {"type": "object"}, ` + eph + `}]}`,
		marks: 3,
	}, {
		name: "next step: the previous call's end and the newest message",
		req:  llm.Request{CachePrompt: true, Messages: []llm.Message{user("Weather?"), call, result}},
		want: `{"messages": [
			{"role": "user", "content": [{"type": "text", "text": "Weather?", ` + eph + `}]},
			{"role": "assistant", "content": [{"type": "text", "text": "Checking."},
				{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "SF"}}]},
			{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": false,
				"content": [{"type": "text", "text": "18C"}], ` + eph + `}]}]}`,
		marks: 2,
	}, {
		name: "new turn: a thinking block is passed over",
		req:  llm.Request{CachePrompt: true, Messages: []llm.Message{user("Weather?"), call, result, thinking, user("And LA?")}},
		want: `{"messages": [
			{"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
			{"role": "assistant", "content": [{"type": "text", "text": "Checking."},
				{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "SF"}}]},
			{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": false,
				"content": [{"type": "text", "text": "18C"}], ` + eph + `}]},
			{"role": "assistant", "content": [{"type": "text", "text": "It is 18C."},
				{"type": "thinking", "thinking": "done", "signature": "sig"}]},
			{"role": "user", "content": [{"type": "text", "text": "And LA?", ` + eph + `}]}]}`,
		marks: 2,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			body := providertest.Fixture(t, "anthropic_ok.sse")
			f := providertest.NewServer(t, func(w http.ResponseWriter, _ *http.Request) { providertest.WriteSSE(w, body) })
			req := tc.req
			req.Model = "claude-sonnet-4-5"
			if _, err := providertest.Collect(t, t.Context(), provider(t, f), &req); err != nil {
				t.Fatalf("Stream: %v", err)
			}
			var sent map[string]json.RawMessage
			if err := json.Unmarshal(f.Bodies()[0], &sent); err != nil {
				t.Fatal(err)
			}
			got := map[string]json.RawMessage{}
			for _, k := range []string{"system", "messages", "tools"} {
				if v, ok := sent[k]; ok {
					got[k] = v
				}
			}
			b, _ := json.Marshal(got)
			providertest.EqualJSON(t, b, tc.want)
			if n := countMarks(sent); n != tc.marks || n > 4 {
				t.Errorf("%d breakpoints, want %d (at most 4)", n, tc.marks)
			}
		})
	}
}

// countMarks counts the cache_control objects anywhere in v.
func countMarks(v any) int {
	n := 0
	switch v := v.(type) {
	case map[string]json.RawMessage:
		for k, raw := range v {
			if k == "cache_control" {
				n++
				continue
			}
			var x any
			_ = json.Unmarshal(raw, &x)
			n += countMarks(x)
		}
	case map[string]any:
		for k, x := range v {
			if k == "cache_control" {
				n++
				continue
			}
			n += countMarks(x)
		}
	case []any:
		for _, x := range v {
			n += countMarks(x)
		}
	}
	return n
}
