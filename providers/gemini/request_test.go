package gemini

import (
	"bytes"
	"encoding/json"
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
