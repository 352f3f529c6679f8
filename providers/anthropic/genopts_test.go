package anthropic

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

// TestGenerationOptionsRequest compares the body each generation option
// produces with the shapes of the Messages API reference (output_config
// format json_schema, tool_choice, thinking, metadata.user_id).
func TestGenerationOptionsRequest(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "anthropic_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	p := provider(t, f)
	const schema = `{"type":"object","properties":{"name":{"type":"string"}},"required":["name"],"additionalProperties":false}`
	const base = `"model":"claude-sonnet-4-5","stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]`
	const tools = `"tools":[{"name":"get_weather","input_schema":{"type":"object"}}]`
	temp := 0.3
	withTools := func(r llm.Request) *llm.Request {
		r.Model, r.Messages = simpleRequest.Model, simpleRequest.Messages
		r.Tools = []llm.ToolSpec{{Name: "get_weather"}}
		return &r
	}
	plain := func(r llm.Request) *llm.Request {
		r.Model, r.Messages = simpleRequest.Model, simpleRequest.Messages
		return &r
	}
	cases := []struct {
		name string
		req  *llm.Request
		want string
	}{
		{"output schema", plain(llm.Request{OutputSchema: &llm.OutputSchema{Name: "person", Strict: true, Schema: json.RawMessage(schema)}}),
			`{` + base + `,"max_tokens":4096,"output_config":{"format":{"type":"json_schema","schema":` + schema + `}}}`},
		{"tool choice auto", withTools(llm.Request{ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceAuto}}),
			`{` + base + `,"max_tokens":4096,` + tools + `,"tool_choice":{"type":"auto"}}`},
		{"tool choice none", withTools(llm.Request{ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceNone}}),
			`{` + base + `,"max_tokens":4096,` + tools + `,"tool_choice":{"type":"none"}}`},
		{"tool choice required is any", withTools(llm.Request{ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceRequired}}),
			`{` + base + `,"max_tokens":4096,` + tools + `,"tool_choice":{"type":"any"}}`},
		{"tool choice of one tool", withTools(llm.Request{ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceTool, Name: "get_weather"}}),
			`{` + base + `,"max_tokens":4096,` + tools + `,"tool_choice":{"type":"tool","name":"get_weather"}}`},
		{"thinking budget, temperature dropped", plain(llm.Request{MaxOutputTokens: 8000, Temperature: &temp, Reasoning: &llm.Reasoning{BudgetTokens: 2048}}),
			`{` + base + `,"max_tokens":8000,"thinking":{"type":"enabled","budget_tokens":2048}}`},
		{"thinking effort above max_tokens raises it", plain(llm.Request{MaxOutputTokens: 1000, Reasoning: &llm.Reasoning{Effort: llm.EffortHigh}}),
			`{` + base + `,"max_tokens":17384,"thinking":{"type":"enabled","budget_tokens":16384}}`},
		{"a forced tool goes without thinking", withTools(llm.Request{Temperature: &temp, Reasoning: &llm.Reasoning{Effort: llm.EffortLow}, ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceRequired}}),
			`{` + base + `,"max_tokens":4096,"temperature":0.3,` + tools + `,"tool_choice":{"type":"any"}}`},
		{"end user", plain(llm.Request{EndUser: "user-7f3a"}),
			`{` + base + `,"max_tokens":4096,"metadata":{"user_id":"user-7f3a"}}`},
		{"thinking with a signed thinking block going back", &llm.Request{Model: "claude-sonnet-4-5", Reasoning: &llm.Reasoning{Effort: llm.EffortLow},
			Tools: []llm.ToolSpec{{Name: "get_weather"}},
			Messages: []llm.Message{
				{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("hi")}},
				{Role: llm.RoleAssistant, Parts: []llm.Part{
					{Kind: llm.PartThinking, Text: "Look it up.", Signature: "EqQBCgIYAhIM"},
					{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "toolu_1", Name: "get_weather", Arguments: `{}`}},
				}},
				{Role: llm.RoleTool, Parts: []llm.Part{{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: "toolu_1", Name: "get_weather", Content: "18C"}}}},
			}},
			`{"model":"claude-sonnet-4-5","stream":true,"max_tokens":4096,"thinking":{"type":"enabled","budget_tokens":1024},` + tools + `,"messages":[
				{"role":"user","content":[{"type":"text","text":"hi"}]},
				{"role":"assistant","content":[{"type":"thinking","thinking":"Look it up.","signature":"EqQBCgIYAhIM"},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}]},
				{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","is_error":false,"content":[{"type":"text","text":"18C"}]}]}]}`},
	}
	for i, tc := range cases {
		if _, err := providertest.Collect(t, t.Context(), p, tc.req); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		t.Run(tc.name, func(t *testing.T) { providertest.EqualJSON(t, f.Bodies()[i], tc.want) })
	}
}

// TestGenerationOptionsByModel records the body each model family is sent
// for the same options, held to the Messages API's documented shapes for
// the model: adaptive thinking with output_config.effort where the model
// takes it (Claude 4.6 and later; Opus 4.7 takes nothing else), no
// temperature or top_p where the model takes none or while it thinks, an
// output schema converted to the subset the API takes, top_p.
func TestGenerationOptionsByModel(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "anthropic_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	p := provider(t, f)
	temp, topP := 0.3, 0.9
	on := func(model string, r llm.Request) *llm.Request {
		r.Model, r.Messages = model, simpleRequest.Messages
		return &r
	}
	msgs := `"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]`
	const loose = `{"type":"object","properties":{"name":{"type":"string","minLength":3},"tags":{"type":"array","items":{"type":"string"},"minItems":2}},"required":["name"]}`
	const converted = `{"type":"object","properties":{"name":{"type":"string","description":"{minLength: 3}"},"tags":{"type":"array","items":{"type":"string"},"description":"{minItems: 2}"}},"required":["name"],"additionalProperties":false}`
	cases := []struct {
		name string
		req  *llm.Request
		want string
	}{
		{"opus 4.7: adaptive thinking, no temperature", on("claude-opus-4-7", llm.Request{Temperature: &temp, Reasoning: &llm.Reasoning{BudgetTokens: 8000}}),
			`{"model":"claude-opus-4-7",` + msgs + `,"max_tokens":4096,"thinking":{"type":"adaptive","display":"summarized"},"output_config":{"effort":"medium"}}`},
		{"opus 4.7: no temperature or top_p without thinking either", on("claude-opus-4-7", llm.Request{Temperature: &temp, TopP: &topP}),
			`{"model":"claude-opus-4-7",` + msgs + `,"max_tokens":4096}`},
		{"opus 5: adaptive thinking at the effort asked", on("claude-opus-5", llm.Request{Reasoning: &llm.Reasoning{Effort: llm.EffortHigh}}),
			`{"model":"claude-opus-5",` + msgs + `,"max_tokens":4096,"thinking":{"type":"adaptive","display":"summarized"},"output_config":{"effort":"high"}}`},
		{"sonnet 4.6: adaptive thinking, temperature dropped with it", on("claude-sonnet-4-6", llm.Request{Temperature: &temp, Reasoning: &llm.Reasoning{Effort: llm.EffortLow}}),
			`{"model":"claude-sonnet-4-6",` + msgs + `,"max_tokens":4096,"thinking":{"type":"adaptive","display":"summarized"},"output_config":{"effort":"low"}}`},
		{"sonnet 4.6: temperature without thinking", on("claude-sonnet-4-6", llm.Request{Temperature: &temp}),
			`{"model":"claude-sonnet-4-6",` + msgs + `,"max_tokens":4096,"temperature":0.3}`},
		{"sonnet 4.5: budget thinking still", on("claude-sonnet-4-5", llm.Request{Reasoning: &llm.Reasoning{Effort: llm.EffortLow}}),
			`{"model":"claude-sonnet-4-5",` + msgs + `,"max_tokens":4096,"thinking":{"type":"enabled","budget_tokens":1024}}`},
		{"haiku 3.5 does not reason: no thinking sent", on("claude-3-5-haiku-20241022", llm.Request{Temperature: &temp, Reasoning: &llm.Reasoning{Effort: llm.EffortLow}}),
			`{"model":"claude-3-5-haiku-20241022",` + msgs + `,"max_tokens":4096,"temperature":0.3}`},
		{"top_p", on("claude-sonnet-4-5", llm.Request{TopP: &topP}),
			`{"model":"claude-sonnet-4-5",` + msgs + `,"max_tokens":4096,"top_p":0.9}`},
		{"a schema outside the subset is converted", on("claude-opus-4-7", llm.Request{OutputSchema: &llm.OutputSchema{Name: "person", Schema: json.RawMessage(loose)}}),
			`{"model":"claude-opus-4-7",` + msgs + `,"max_tokens":4096,"output_config":{"format":{"type":"json_schema","schema":` + converted + `}}}`},
		{"a schema and adaptive thinking share output_config", on("claude-opus-4-6", llm.Request{Reasoning: &llm.Reasoning{Effort: llm.EffortMedium},
			OutputSchema: &llm.OutputSchema{Schema: json.RawMessage(loose)}}),
			`{"model":"claude-opus-4-6",` + msgs + `,"max_tokens":4096,"thinking":{"type":"adaptive","display":"summarized"},"output_config":{"effort":"medium","format":{"type":"json_schema","schema":` + converted + `}}}`},
		{"the runtime's capabilities over the table's", &llm.Request{Model: "claude-opus-4-7-ft", Messages: simpleRequest.Messages,
			Temperature: &temp, Reasoning: &llm.Reasoning{Effort: llm.EffortLow},
			Capabilities: &llm.Capabilities{Thinking: llm.ThinkingBudget}},
			`{"model":"claude-opus-4-7-ft",` + msgs + `,"max_tokens":4096,"thinking":{"type":"enabled","budget_tokens":1024}}`},
	}
	for i, tc := range cases {
		if _, err := providertest.Collect(t, t.Context(), p, tc.req); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		t.Run(tc.name, func(t *testing.T) { providertest.EqualJSON(t, f.Bodies()[i], tc.want) })
	}
}
