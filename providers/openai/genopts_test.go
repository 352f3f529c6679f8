package openai

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

// TestGenerationOptionsRequest compares the body each generation option
// produces with the shapes of OpenAI's Chat Completions reference
// (response_format json_schema, tool_choice, reasoning_effort,
// safety_identifier).
func TestGenerationOptionsRequest(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "openai_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	p := provider(t, f)
	strictSchema := `{"type":"object","properties":{"name":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}}},"required":["name","tags"],"additionalProperties":false}`
	const base = `"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]`
	const tools = `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]`
	withTools := func(r llm.Request) *llm.Request {
		r.Model, r.Messages = simpleRequest.Model, simpleRequest.Messages
		r.Tools = []llm.ToolSpec{{Name: "get_weather"}}
		return &r
	}
	plain := func(r llm.Request) *llm.Request {
		r.Model, r.Messages = simpleRequest.Model, simpleRequest.Messages
		return &r
	}
	on := func(model string, r llm.Request) *llm.Request {
		r.Model, r.Messages = model, simpleRequest.Messages
		return &r
	}
	cases := []struct {
		name string
		req  *llm.Request
		want string
	}{
		{"strict schema", plain(llm.Request{OutputSchema: &llm.OutputSchema{Name: "person", Strict: true, Schema: json.RawMessage(strictSchema)}}),
			`{` + base + `,"response_format":{"type":"json_schema","json_schema":{"name":"person","strict":true,"schema":` + strictSchema + `}}}`},
		{"strict asked of a schema outside the strict subset", plain(llm.Request{OutputSchema: &llm.OutputSchema{Name: "person", Strict: true,
			Schema: json.RawMessage(`{"type":"object","properties":{"name":{"type":"string"}}}`)}}),
			`{` + base + `,"response_format":{"type":"json_schema","json_schema":{"name":"person","strict":false,"schema":{"type":"object","properties":{"name":{"type":"string"}}}}}}`},
		{"not strict", plain(llm.Request{OutputSchema: &llm.OutputSchema{Name: "n", Schema: json.RawMessage(`{"type":"integer"}`)}}),
			`{` + base + `,"response_format":{"type":"json_schema","json_schema":{"name":"n","strict":false,"schema":{"type":"integer"}}}}`},
		{"tool choice auto", withTools(llm.Request{ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceAuto}}),
			`{` + base + `,` + tools + `,"tool_choice":"auto"}`},
		{"tool choice none", withTools(llm.Request{ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceNone}}),
			`{` + base + `,` + tools + `,"tool_choice":"none"}`},
		{"tool choice required", withTools(llm.Request{ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceRequired}}),
			`{` + base + `,` + tools + `,"tool_choice":"required"}`},
		{"tool choice of one function", withTools(llm.Request{ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceTool, Name: "get_weather"}}),
			`{` + base + `,` + tools + `,"tool_choice":{"type":"function","function":{"name":"get_weather"}}}`},
		{"tool choice without tools is not sent", plain(llm.Request{ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceNone}}),
			`{` + base + `}`},
		{"reasoning effort", on("o4-mini", llm.Request{Reasoning: &llm.Reasoning{Effort: llm.EffortLow, BudgetTokens: 30000}}),
			`{` + strings.ReplaceAll(base, "gpt-4o", "o4-mini") + `,"reasoning_effort":"low"}`},
		{"reasoning budget as an effort", on("o4-mini", llm.Request{Reasoning: &llm.Reasoning{BudgetTokens: 30000}}),
			`{` + strings.ReplaceAll(base, "gpt-4o", "o4-mini") + `,"reasoning_effort":"high"}`},
		{"no reasoning_effort to a model that does not reason", plain(llm.Request{Reasoning: &llm.Reasoning{Effort: llm.EffortLow}}),
			`{` + base + `}`},
		{"end user", plain(llm.Request{EndUser: "user-7f3a"}),
			`{` + base + `,"safety_identifier":"user-7f3a"}`},
	}
	for i, tc := range cases {
		if _, err := providertest.Collect(t, t.Context(), p, tc.req); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		t.Run(tc.name, func(t *testing.T) { providertest.EqualJSON(t, f.Bodies()[i], tc.want) })
	}
}

// TestSamplingByModel records the body each model family is sent for
// temperature and top_p, with and without reasoning, held to Chat
// Completions' documented rules for the model: the o-series and GPT-5
// take neither (only their default), GPT-5.1 and later only without
// reasoning_effort, the GPT-4 family always; a compatible server's model
// gets them as asked.
func TestSamplingByModel(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "openai_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	p := provider(t, f)
	temp, topP := 0.5, 0.9
	sampled := llm.Request{Temperature: &temp, TopP: &topP}
	reasoned := llm.Request{Temperature: &temp, TopP: &topP, Reasoning: &llm.Reasoning{Effort: llm.EffortMedium}}
	head := func(model string) string {
		return `{"model":"` + model + `","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]`
	}
	cases := []struct {
		model string
		req   llm.Request
		want  string
	}{
		{"o3", sampled, head("o3") + `}`},
		{"o3", reasoned, head("o3") + `,"reasoning_effort":"medium"}`},
		{"gpt-5-mini", reasoned, head("gpt-5-mini") + `,"reasoning_effort":"medium"}`},
		{"gpt-5.2", sampled, head("gpt-5.2") + `,"temperature":0.5,"top_p":0.9}`},
		{"gpt-5.2", reasoned, head("gpt-5.2") + `,"reasoning_effort":"medium"}`},
		{"gpt-4.1", reasoned, head("gpt-4.1") + `,"temperature":0.5,"top_p":0.9}`},
		{"qwen3:8b", reasoned, head("qwen3:8b") + `,"temperature":0.5,"top_p":0.9,"reasoning_effort":"medium"}`},
	}
	for i, tc := range cases {
		req := tc.req
		req.Model, req.Messages = tc.model, simpleRequest.Messages
		if _, err := providertest.Collect(t, t.Context(), p, &req); err != nil {
			t.Fatalf("%s: %v", tc.model, err)
		}
		t.Run(fmt.Sprintf("%s/%d", tc.model, i), func(t *testing.T) { providertest.EqualJSON(t, f.Bodies()[i], tc.want) })
	}
}

func TestStrictable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		schema string
		want   bool
	}{
		{`{"type":"object","properties":{},"required":[],"additionalProperties":false}`, true},
		{`{"type":"object","properties":{"a":{"anyOf":[{"type":"string"},{"type":"null"}]}},"required":["a"],"additionalProperties":false}`, true},
		{`{"type":"object","properties":{"a":{"$ref":"#/$defs/x"}},"required":["a"],"additionalProperties":false,"$defs":{"x":{"type":"object","properties":{"b":{"type":"string"}},"required":["b"],"additionalProperties":false}}}`, true},
		{`{"type":"object","properties":{"a":{"type":"string"}},"required":[],"additionalProperties":false}`, false},
		{`{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}`, false},
		{`{"type":"object","properties":{"a":{"type":"object","properties":{"b":{"type":"string"}}}},"required":["a"],"additionalProperties":false}`, false},
		{`{"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false,"allOf":[]}`, false},
		{`{"type":"array","items":{"type":"string"}}`, false},
	}
	for _, c := range cases {
		var m map[string]any
		if err := json.Unmarshal([]byte(c.schema), &m); err != nil {
			t.Fatal(err)
		}
		if got := strictable(m); got != c.want {
			t.Errorf("strictable(%s) = %v, want %v", c.schema, got, c.want)
		}
	}
}
