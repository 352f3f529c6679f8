package gemini

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

// TestGenerationOptionsRequest compares the body each generation option
// produces with the shapes of the Gemini API reference
// (generationConfig.responseMimeType and responseJsonSchema,
// toolConfig.functionCallingConfig, generationConfig.thinkingConfig).
func TestGenerationOptionsRequest(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "gemini_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	p := provider(t, f)
	const schema = `{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}`
	const contents = `"contents":[{"role":"user","parts":[{"text":"hi"}]}]`
	const tools = `"tools":[{"functionDeclarations":[{"name":"getWeather","parametersJsonSchema":{"type":"object"}}]}]`
	withTools := func(r llm.Request) *llm.Request {
		r.Model, r.Messages = simpleRequest.Model, simpleRequest.Messages
		r.Tools = []llm.ToolSpec{{Name: "getWeather"}}
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
			`{` + contents + `,"generationConfig":{"responseMimeType":"application/json","responseJsonSchema":` + schema + `}}`},
		{"tool choice auto", withTools(llm.Request{ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceAuto}}),
			`{` + contents + `,"generationConfig":{},` + tools + `,"toolConfig":{"functionCallingConfig":{"mode":"AUTO"}}}`},
		{"tool choice none", withTools(llm.Request{ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceNone}}),
			`{` + contents + `,"generationConfig":{},` + tools + `,"toolConfig":{"functionCallingConfig":{"mode":"NONE"}}}`},
		{"tool choice required is any", withTools(llm.Request{ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceRequired}}),
			`{` + contents + `,"generationConfig":{},` + tools + `,"toolConfig":{"functionCallingConfig":{"mode":"ANY"}}}`},
		{"tool choice of one function", withTools(llm.Request{ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceTool, Name: "getWeather"}}),
			`{` + contents + `,"generationConfig":{},` + tools + `,"toolConfig":{"functionCallingConfig":{"mode":"ANY","allowedFunctionNames":["getWeather"]}}}`},
		{"thinking budget", plain(llm.Request{Reasoning: &llm.Reasoning{BudgetTokens: 2048}}),
			`{` + contents + `,"generationConfig":{"thinkingConfig":{"includeThoughts":true,"thinkingBudget":2048}}}`},
		{"thinking effort", plain(llm.Request{Reasoning: &llm.Reasoning{Effort: llm.EffortMedium}}),
			`{` + contents + `,"generationConfig":{"thinkingConfig":{"includeThoughts":true,"thinkingBudget":4096}}}`},
		{"end user is not sent", plain(llm.Request{EndUser: "user-7f3a"}),
			`{` + contents + `,"generationConfig":{}}`},
	}
	for i, tc := range cases {
		if _, err := providertest.Collect(t, t.Context(), p, tc.req); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		t.Run(tc.name, func(t *testing.T) { providertest.EqualJSON(t, f.Bodies()[i], tc.want) })
	}
}
