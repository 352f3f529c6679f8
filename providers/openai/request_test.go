package openai

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

func TestRequestMapping(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "openai_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		providertest.WriteSSE(w, body)
	})
	temp := 0.2
	req := &llm.Request{
		Model:  "gpt-4o",
		System: "Be brief.",
		Messages: []llm.Message{
			{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("Weather in SF and LA?")}},
			{Role: llm.RoleAssistant, Parts: []llm.Part{
				{Kind: llm.PartThinking, Text: "two calls", Signature: "sig"},
				llm.TextPart("Checking."),
				{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "call_1", Name: "get_weather", Arguments: `{"city":"SF"}`}},
				{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "call_2", Name: "get_weather", Arguments: `{"city":"LA"}`}},
			}},
			{Role: llm.RoleTool, Parts: []llm.Part{
				{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: "call_1", Name: "get_weather", Content: "18C"}},
				{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: "call_2", Name: "get_weather", Content: "boom", IsError: true}},
			}},
			{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("Thanks. "), llm.TextPart("And NYC?")}},
		},
		Tools: []llm.ToolSpec{
			{Name: "get_weather", Description: "Current weather", Schema: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`)},
			{Name: "now"},
		},
		MaxOutputTokens: 256,
		Temperature:     &temp,
		StopSequences:   []string{"END"},
	}
	if _, err := providertest.Collect(t, t.Context(), provider(t, f), req); err != nil {
		t.Fatalf("Stream: %v", err)
	}
	providertest.EqualJSON(t, f.Bodies()[0], `{
		"model": "gpt-4o",
		"stream": true,
		"stream_options": {"include_usage": true},
		"max_completion_tokens": 256,
		"temperature": 0.2,
		"stop": ["END"],
		"messages": [
			{"role": "system", "content": "Be brief."},
			{"role": "user", "content": "Weather in SF and LA?"},
			{"role": "assistant", "content": "Checking.", "tool_calls": [
				{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"SF\"}"}},
				{"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"LA\"}"}}
			]},
			{"role": "tool", "tool_call_id": "call_1", "content": "18C"},
			{"role": "tool", "tool_call_id": "call_2", "content": "boom"},
			{"role": "user", "content": [{"type": "text", "text": "Thanks. "}, {"type": "text", "text": "And NYC?"}]}
		],
		"tools": [
			{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
				"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
			{"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}
		]
	}`)
	h := f.Headers()[0]
	if got := h.Get("Authorization"); got != "Bearer "+testKey {
		t.Errorf("Authorization = %q", got)
	}
	if got := h.Get("X-Extra"); got != "yes" {
		t.Errorf("X-Extra = %q, want the configured header", got)
	}
}

func TestRequestWithoutKeySendsNoAuthorization(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "sk-from-env-must-not-be-used")
	body := providertest.Fixture(t, "openai_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	client := f.Client()
	defer client.CloseIdleConnections()
	p, err := New(Config{BaseURL: f.URL + "/v1", HTTPClient: client})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := providertest.Collect(t, t.Context(), p, simpleRequest); err != nil {
		t.Fatal(err)
	}
	if got := f.Headers()[0].Get("Authorization"); got != "" {
		t.Errorf("Authorization = %q, want none", got)
	}
}

func TestRequestRejectsBadSchema(t *testing.T) {
	t.Parallel()
	p, err := New(Config{Name: "oa", BaseURL: "http://127.0.0.1:1/v1"})
	if err != nil {
		t.Fatal(err)
	}
	req := &llm.Request{Model: "m", Tools: []llm.ToolSpec{{Name: "t", Schema: json.RawMessage(`[`)}}}
	_, err = providertest.Collect(t, t.Context(), p, req)
	if e := providertest.AsError(t, err); e.Kind != llm.KindInvalidRequest {
		t.Errorf("error = %+v, want INVALID_REQUEST", e)
	}
}

// FuzzDecode feeds arbitrary bytes to the stream decoder as an SSE body:
// it must not panic, must yield an error at most once and last, and must
// end with either a stop or an error.
func FuzzDecode(f *testing.F) {
	for _, name := range []string{"openai_ok.sse", "openai_midstream_error.sse"} {
		f.Add([]byte(providertest.Fixture(f, name)))
	}
	f.Add([]byte(chunkLine(`{"tool_calls":[{"index":3,"id":"x","function":{"name":"f","arguments":"{"}}]}`, "tool_calls")))
	f.Add([]byte("data: {\"error\":\"x\"}\n\n"))
	p, err := New(Config{Name: "fuzz", BaseURL: "http://127.0.0.1:1/v1"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		resp := &http.Response{
			StatusCode: 200,
			Header:     http.Header{"Content-Type": {"text/event-stream"}},
			Body:       io.NopCloser(bytes.NewReader(body)),
		}
		stream := ssestream.NewStream[openai.ChatCompletionChunk](ssestream.NewDecoder(resp), nil)
		defer stream.Close()
		yield, end := providertest.CheckYield(t)
		p.consume(t.Context(), stream, resp, yield)
		end()
	})
}
