package gemini

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

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

// TestOutputSchemaWithTools records the bodies of calls that ask for an
// output schema while offering tools, held to the Gemini API's documented
// shapes: Gemini 2.5 refuses function calling with a JSON response type,
// so the schema is one more function, respond, called in mode ANY; Gemini
// 3 takes both as they are. A call that forces a tool gets no schema.
func TestOutputSchemaWithTools(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "gemini_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	p := provider(t, f)
	const schema = `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`
	const contents = `"contents":[{"role":"user","parts":[{"text":"hi"}]}]`
	const weather = `{"name":"getWeather","parametersJsonSchema":{"type":"object"}}`
	const respond = `{"name":"respond","description":"` + answerDescription + `","parametersJsonSchema":` + schema + `}`
	on := func(model string, r llm.Request) *llm.Request {
		r.Model, r.Messages = model, simpleRequest.Messages
		if r.Tools == nil {
			r.Tools = []llm.ToolSpec{{Name: "getWeather"}}
		}
		r.OutputSchema = &llm.OutputSchema{Name: "place", Schema: json.RawMessage(schema)}
		return &r
	}
	cases := []struct {
		name string
		req  *llm.Request
		want string
	}{
		{"2.5: the schema is the respond function, in mode ANY", on("gemini-2.5-flash", llm.Request{}),
			`{` + contents + `,"generationConfig":{},"tools":[{"functionDeclarations":[` + weather + `,` + respond + `]}],"toolConfig":{"functionCallingConfig":{"mode":"ANY"}}}`},
		{"2.5: tool choice auto is ANY with respond", on("gemini-2.5-pro", llm.Request{ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceAuto}}),
			`{` + contents + `,"generationConfig":{},"tools":[{"functionDeclarations":[` + weather + `,` + respond + `]}],"toolConfig":{"functionCallingConfig":{"mode":"ANY"}}}`},
		{"2.5: tool choice none allows respond alone", on("gemini-2.5-flash", llm.Request{ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceNone}}),
			`{` + contents + `,"generationConfig":{},"tools":[{"functionDeclarations":[` + weather + `,` + respond + `]}],"toolConfig":{"functionCallingConfig":{"mode":"ANY","allowedFunctionNames":["respond"]}}}`},
		{"2.5: a forced tool is not the answer: no schema", on("gemini-2.5-flash", llm.Request{ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceRequired}}),
			`{` + contents + `,"generationConfig":{},"tools":[{"functionDeclarations":[` + weather + `]}],"toolConfig":{"functionCallingConfig":{"mode":"ANY"}}}`},
		{"2.5: a tool named respond moves the function's name", on("gemini-2.5-flash", llm.Request{Tools: []llm.ToolSpec{{Name: "respond"}}}),
			`{` + contents + `,"generationConfig":{},"tools":[{"functionDeclarations":[{"name":"respond","parametersJsonSchema":{"type":"object"}},` +
				strings.Replace(respond, `"respond"`, `"respond_2"`, 1) + `]}],"toolConfig":{"functionCallingConfig":{"mode":"ANY"}}}`},
		{"2.5 without tools: JSON mode", &llm.Request{Model: "gemini-2.5-flash", Messages: simpleRequest.Messages, OutputSchema: &llm.OutputSchema{Schema: json.RawMessage(schema)}},
			`{` + contents + `,"generationConfig":{"responseMimeType":"application/json","responseJsonSchema":` + schema + `}}`},
		{"3: JSON mode beside the tools", on("gemini-3-pro-preview", llm.Request{}),
			`{` + contents + `,"generationConfig":{"responseMimeType":"application/json","responseJsonSchema":` + schema + `},"tools":[{"functionDeclarations":[` + weather + `]}]}`},
	}
	for i, tc := range cases {
		if _, err := providertest.Collect(t, t.Context(), p, tc.req); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		t.Run(tc.name, func(t *testing.T) { providertest.EqualJSON(t, f.Bodies()[i], tc.want) })
	}
}

// TestAnswerFunction: a call of the respond function is the reply's
// answer, its arguments the text, and the reply ends the turn; a schema
// that is not an object's is wrapped and unwrapped. A real tool call
// beside it stays a tool call.
func TestAnswerFunction(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, schema, reply string
		want                []llm.Chunk
	}{
		{"object schema", `{"type":"object","properties":{"city":{"type":"string"}}}`,
			`{"candidates":[{"content":{"parts":[{"functionCall":{"name":"respond","args":{"city":"Paris"}},"thoughtSignature":"c2ln"}],"role":"model"},"finishReason":"STOP","index":0}]}`,
			[]llm.Chunk{{Kind: llm.ChunkThinking, Signature: "c2ln"}, {Kind: llm.ChunkText, Text: `{"city":"Paris"}`}, {Kind: llm.ChunkStop, Stop: llm.StopEndTurn}}},
		{"array schema, wrapped", `{"type":"array","items":{"type":"integer"}}`,
			`{"candidates":[{"content":{"parts":[{"functionCall":{"name":"respond","args":{"response":[1,2]}}}],"role":"model"},"finishReason":"STOP","index":0}]}`,
			[]llm.Chunk{{Kind: llm.ChunkText, Text: `[1,2]`}, {Kind: llm.ChunkStop, Stop: llm.StopEndTurn}}},
		{"a tool first", `{"type":"object"}`,
			`{"candidates":[{"content":{"parts":[{"functionCall":{"name":"getWeather","args":{"city":"Paris"}}}],"role":"model"},"finishReason":"STOP","index":0}]}`,
			[]llm.Chunk{{Kind: llm.ChunkToolCallStart, Name: "getWeather"}, {Kind: llm.ChunkToolCallArgs, Text: `{"city":"Paris"}`},
				{Kind: llm.ChunkToolCallEnd}, {Kind: llm.ChunkStop, Stop: llm.StopToolUse}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, data(tc.reply)) })
			req := &llm.Request{Model: "gemini-2.5-flash", Messages: simpleRequest.Messages, Tools: []llm.ToolSpec{{Name: "getWeather"}},
				OutputSchema: &llm.OutputSchema{Schema: json.RawMessage(tc.schema)}}
			chunks, err := providertest.Collect(t, t.Context(), provider(t, f), req)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, chunks); diff != "" {
				t.Errorf("chunks (-want +got):\n%s", diff)
			}
			if strings.Contains(tc.schema, "array") && !strings.Contains(string(f.Bodies()[0]), `"properties":{"response":{"items":{"type":"integer"},"type":"array"}}`) {
				t.Errorf("the array schema is not wrapped: %s", f.Bodies()[0])
			}
		})
	}
}

// TestSamplingAndThinkingByModel: top_p as topP; no thinkingConfig to a
// model that does not reason (Gemini 2.0); thinkingLevel for a model
// configured for adaptive thinking.
func TestSamplingAndThinkingByModel(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "gemini_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	p := provider(t, f)
	topP := 0.8
	const contents = `"contents":[{"role":"user","parts":[{"text":"hi"}]}]`
	cases := []struct {
		req  *llm.Request
		want string
	}{
		{&llm.Request{Model: "gemini-2.5-flash", TopP: &topP}, `{` + contents + `,"generationConfig":{"topP":0.8}}`},
		{&llm.Request{Model: "gemini-2.0-flash", Reasoning: &llm.Reasoning{Effort: llm.EffortHigh}}, `{` + contents + `,"generationConfig":{}}`},
		{&llm.Request{Model: "gemini-3-flash-preview", Reasoning: &llm.Reasoning{Effort: llm.EffortHigh},
			Capabilities: &llm.Capabilities{Thinking: llm.ThinkingAdaptive}},
			`{` + contents + `,"generationConfig":{"thinkingConfig":{"includeThoughts":true,"thinkingLevel":"HIGH"}}}`},
	}
	for i, tc := range cases {
		tc.req.Messages = simpleRequest.Messages
		if _, err := providertest.Collect(t, t.Context(), p, tc.req); err != nil {
			t.Fatal(err)
		}
		providertest.EqualJSON(t, f.Bodies()[i], tc.want)
	}
}
