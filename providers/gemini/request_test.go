package gemini

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

func TestRequestMapping(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "gemini_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	temp := 0.5
	req := &llm.Request{
		Model:  "gemini-2.5-flash",
		System: "Be brief.",
		Messages: []llm.Message{
			{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("Weather in Tokyo and Paris?")}},
			{Role: llm.RoleAssistant, Parts: []llm.Part{
				{Kind: llm.PartThinking, Text: "Two calls.", Signature: "dGhvdWdodA=="},
				// A signature streamed on the function call part rides in a
				// text-less thinking part just before it.
				{Kind: llm.PartThinking, Signature: "CikBcsjafFK168IbtVtoxVV0Tsn8O+eU45rz"},
				{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "call_0_getWeather", Name: "getWeather", Arguments: `{"location":"Tokyo"}`}},
				{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "call_1_getWeather", Name: "getWeather", Arguments: `{"location":"Paris"}`}},
			}},
			{Role: llm.RoleTool, Parts: []llm.Part{
				{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: "call_0_getWeather", Name: "getWeather", Content: "18C"}},
				{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: "call_1_getWeather", Name: "getWeather", Content: "boom", IsError: true}},
			}},
			{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("Thanks.")}},
		},
		Tools: []llm.ToolSpec{
			{Name: "getWeather", Description: "Current weather",
				Schema: json.RawMessage(`{"type":"object","properties":{"location":{"type":"string"}},"required":["location"]}`)},
			{Name: "now"},
		},
		MaxOutputTokens: 512,
		Temperature:     &temp,
		StopSequences:   []string{"END"},
	}
	if _, err := providertest.Collect(t, t.Context(), provider(t, f), req); err != nil {
		t.Fatalf("Stream: %v", err)
	}
	providertest.EqualJSON(t, f.Bodies()[0], `{
		"systemInstruction": {"parts": [{"text": "Be brief."}], "role": "user"},
		"generationConfig": {"maxOutputTokens": 512, "temperature": 0.5, "stopSequences": ["END"]},
		"contents": [
			{"role": "user", "parts": [{"text": "Weather in Tokyo and Paris?"}]},
			{"role": "model", "parts": [
				{"text": "Two calls.", "thought": true, "thoughtSignature": "dGhvdWdodA=="},
				{"functionCall": {"id": "call_0_getWeather", "name": "getWeather", "args": {"location": "Tokyo"}}, "thoughtSignature": "CikBcsjafFK168IbtVtoxVV0Tsn8O+eU45rz"},
				{"functionCall": {"id": "call_1_getWeather", "name": "getWeather", "args": {"location": "Paris"}}}
			]},
			{"role": "user", "parts": [
				{"functionResponse": {"id": "call_0_getWeather", "name": "getWeather", "response": {"output": "18C"}}},
				{"functionResponse": {"id": "call_1_getWeather", "name": "getWeather", "response": {"error": "boom"}}},
				{"text": "Thanks."}
			]}
		],
		"tools": [{"functionDeclarations": [
			{"name": "getWeather", "description": "Current weather",
				"parametersJsonSchema": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}},
			{"name": "now", "parametersJsonSchema": {"type": "object"}}
		]}]
	}`)
	if got := f.Headers()[0].Get("X-Extra"); got != "yes" {
		t.Errorf("X-Extra = %q, want the configured header", got)
	}
}

// TestRequestKeepsGeminiFields records the body of a conversation that
// came from elsewhere, held to the Gemini API's Content shape: a tool
// result without a name gets the name of the call it answers
// (functionResponse.name is required), and a signature that is not
// base64 (another API's, from a conversation without signers) is dropped
// with its thinking rather than failing the call; a call's is left off.
func TestRequestKeepsGeminiFields(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "gemini_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	req := &llm.Request{Model: "gemini-2.5-flash", Messages: []llm.Message{
		{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("weather?")}},
		{Role: llm.RoleAssistant, Parts: []llm.Part{
			{Kind: llm.PartThinking, Text: "Claude's reasoning", Signature: "ErUBCkYIBRgC+/not=base64!"},
			{Kind: llm.PartThinking, Signature: "sig?"},
			{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "toolu_01", Name: "get_weather", Arguments: `{"city":"Paris"}`}},
		}},
		{Role: llm.RoleTool, Parts: []llm.Part{{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: "toolu_01", Content: "18C"}}}},
	}}
	if _, err := providertest.Collect(t, t.Context(), provider(t, f), req); err != nil {
		t.Fatal(err)
	}
	providertest.EqualJSON(t, f.Bodies()[0], `{
		"generationConfig": {},
		"contents": [
			{"role": "user", "parts": [{"text": "weather?"}]},
			{"role": "model", "parts": [{"functionCall": {"id": "toolu_01", "name": "get_weather", "args": {"city": "Paris"}}}]},
			{"role": "user", "parts": [{"functionResponse": {"id": "toolu_01", "name": "get_weather", "response": {"output": "18C"}}}]}
		]
	}`)
}

// bodyTransport answers every request with body as a 200 SSE stream,
// without a network.
type bodyTransport []byte

func (b bodyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{
		StatusCode: 200, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:  http.Header{"Content-Type": {"text/event-stream"}},
		Body:    io.NopCloser(bytes.NewReader(b)),
		Request: r,
	}, nil
}

// FuzzDecode feeds arbitrary bytes to the SDK's stream reader and the
// decoder as an SSE body: it must not panic, must yield an error at most
// once and last, and must end with either a stop or an error.
func FuzzDecode(f *testing.F) {
	for _, name := range []string{"gemini_ok.sse", "gemini_midstream_error.sse"} {
		f.Add([]byte(providertest.Fixture(f, name)))
	}
	f.Add([]byte(data(`{"promptFeedback":{"blockReason":"SAFETY"}}`)))
	f.Add([]byte(`{"error": {"code": 503, "status": "UNAVAILABLE"}}` + "\n\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := New(Config{Name: "fuzz", BaseURL: "http://fuzz.invalid", APIKey: testKey,
			HTTPClient: &http.Client{Transport: bodyTransport(body)}})
		if err != nil {
			t.Fatal(err)
		}
		yield, end := providertest.CheckYield(t)
		for c, err := range p.Stream(t.Context(), simpleRequest) {
			yield(c, err)
		}
		end()
	})
}

// gemini3 answers as Gemini 3 does: a request in which the first function
// call of a model step of the current turn (the steps since the last user
// content that answers no call) carries no thoughtSignature is refused
// with the API's 400; any other gets body.
func gemini3(t *testing.T, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Contents []struct {
				Role  string                       `json:"role"`
				Parts []map[string]json.RawMessage `json:"parts"`
			} `json:"contents"`
		}
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &req); err != nil {
			t.Errorf("body: %v", err)
		}
		start := 0
		for i, c := range req.Contents {
			answers := false
			for _, p := range c.Parts {
				_, fr := p["functionResponse"]
				answers = answers || fr
			}
			if c.Role == "user" && !answers {
				start = i + 1
			}
		}
		for i, c := range req.Contents[start:] {
			for j, p := range c.Parts {
				if _, call := p["functionCall"]; !call {
					continue
				}
				if _, signed := p["thoughtSignature"]; !signed {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusBadRequest)
					fmt.Fprintf(w, `{"error": {"code": 400, "message": "Function call is missing a thought_signature in functionCall parts. This is required for tools to work correctly, and missing thought_signature may lead to degraded model performance. Additional data, function call `+"`default_api:get_weather`"+` , position %d. Please refer to https://ai.google.dev/gemini-api/docs/thought-signatures for more details.", "status": "INVALID_ARGUMENT"}}`, start+i+j+1)
					return
				}
				break // a step's later calls carry none
			}
		}
		providertest.WriteSSE(w, body)
	}
}

// TestForeignCallsSignedForGemini3: a conversation whose current turn began
// on another model (a fallback from Claude) reaches Gemini 3 with the
// placeholder signature on the first call of each of that turn's steps,
// none on a step's later calls or on an earlier turn's, and Gemini's own
// signature kept; Gemini 3 takes it where it refused the calls unsigned.
// Gemini 2.5, which checks no signature, is sent none.
func TestForeignCallsSignedForGemini3(t *testing.T) {
	t.Parallel()
	const placeholder = `"thoughtSignature": "skip/thought/signature/validator"`
	call := func(id, city string) llm.Part {
		return llm.Part{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: id, Name: "get_weather", Arguments: `{"city":"` + city + `"}`}}
	}
	result := func(id string) llm.Part {
		return llm.Part{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: id, Name: "get_weather", Content: "18C"}}
	}
	msgs := []llm.Message{
		// An earlier turn, its call made by Claude: not checked.
		{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("weather in Oslo?")}},
		{Role: llm.RoleAssistant, Parts: []llm.Part{call("toolu_00", "Oslo")}},
		{Role: llm.RoleTool, Parts: []llm.Part{result("toolu_00")}},
		{Role: llm.RoleAssistant, Parts: []llm.Part{llm.TextPart("9C.")}},
		// The current turn: two parallel calls by Claude, with Claude's
		// signature (dropped), then one by Gemini with its own.
		{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("and Paris, Rome, Tokyo?")}},
		{Role: llm.RoleAssistant, Parts: []llm.Part{
			{Kind: llm.PartThinking, Text: "Claude's reasoning", Signature: "ErUBCkYIBRgC+/not=base64!", Signer: "anthropic"},
			call("toolu_01", "Paris"), call("toolu_02", "Rome"),
		}},
		{Role: llm.RoleTool, Parts: []llm.Part{result("toolu_01"), result("toolu_02")}},
		{Role: llm.RoleAssistant, Parts: []llm.Part{
			{Kind: llm.PartThinking, Signature: "Z2VtaW5p", Signer: "gemini"},
			call("call_3", "Tokyo"),
		}},
		{Role: llm.RoleTool, Parts: []llm.Part{result("call_3")}},
	}
	body := providertest.Fixture(t, "gemini_ok.sse")
	for _, tt := range []struct {
		model string
		want  string
	}{
		{"gemini-3-pro-preview", `[
			{"role": "user", "parts": [{"text": "weather in Oslo?"}]},
			{"role": "model", "parts": [{"functionCall": {"id": "toolu_00", "name": "get_weather", "args": {"city": "Oslo"}}}]},
			{"role": "user", "parts": [{"functionResponse": {"id": "toolu_00", "name": "get_weather", "response": {"output": "18C"}}}]},
			{"role": "model", "parts": [{"text": "9C."}]},
			{"role": "user", "parts": [{"text": "and Paris, Rome, Tokyo?"}]},
			{"role": "model", "parts": [
				{"functionCall": {"id": "toolu_01", "name": "get_weather", "args": {"city": "Paris"}}, ` + placeholder + `},
				{"functionCall": {"id": "toolu_02", "name": "get_weather", "args": {"city": "Rome"}}}
			]},
			{"role": "user", "parts": [
				{"functionResponse": {"id": "toolu_01", "name": "get_weather", "response": {"output": "18C"}}},
				{"functionResponse": {"id": "toolu_02", "name": "get_weather", "response": {"output": "18C"}}}
			]},
			{"role": "model", "parts": [{"functionCall": {"id": "call_3", "name": "get_weather", "args": {"city": "Tokyo"}}, "thoughtSignature": "Z2VtaW5p"}]},
			{"role": "user", "parts": [{"functionResponse": {"id": "call_3", "name": "get_weather", "response": {"output": "18C"}}}]}
		]`},
		{"gemini-2.5-flash", `[
			{"role": "user", "parts": [{"text": "weather in Oslo?"}]},
			{"role": "model", "parts": [{"functionCall": {"id": "toolu_00", "name": "get_weather", "args": {"city": "Oslo"}}}]},
			{"role": "user", "parts": [{"functionResponse": {"id": "toolu_00", "name": "get_weather", "response": {"output": "18C"}}}]},
			{"role": "model", "parts": [{"text": "9C."}]},
			{"role": "user", "parts": [{"text": "and Paris, Rome, Tokyo?"}]},
			{"role": "model", "parts": [
				{"functionCall": {"id": "toolu_01", "name": "get_weather", "args": {"city": "Paris"}}},
				{"functionCall": {"id": "toolu_02", "name": "get_weather", "args": {"city": "Rome"}}}
			]},
			{"role": "user", "parts": [
				{"functionResponse": {"id": "toolu_01", "name": "get_weather", "response": {"output": "18C"}}},
				{"functionResponse": {"id": "toolu_02", "name": "get_weather", "response": {"output": "18C"}}}
			]},
			{"role": "model", "parts": [{"functionCall": {"id": "call_3", "name": "get_weather", "args": {"city": "Tokyo"}}, "thoughtSignature": "Z2VtaW5p"}]},
			{"role": "user", "parts": [{"functionResponse": {"id": "call_3", "name": "get_weather", "response": {"output": "18C"}}}]}
		]`},
	} {
		t.Run(tt.model, func(t *testing.T) {
			t.Parallel()
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
			if tt.model == "gemini-3-pro-preview" {
				h = gemini3(t, body)
			}
			f := providertest.NewServer(t, h)
			if _, err := providertest.Collect(t, t.Context(), provider(t, f), &llm.Request{Model: tt.model, Messages: msgs}); err != nil {
				t.Fatalf("the turn's call failed: %v", err)
			}
			var got struct {
				Contents json.RawMessage `json:"contents"`
			}
			if err := json.Unmarshal(f.Bodies()[0], &got); err != nil {
				t.Fatal(err)
			}
			providertest.EqualJSON(t, got.Contents, tt.want)
		})
	}
}
