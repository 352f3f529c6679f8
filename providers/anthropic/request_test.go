package anthropic

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/packages/ssestream"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

func TestRequestMapping(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "anthropic_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/messages" {
			http.NotFound(w, r)
			return
		}
		providertest.WriteSSE(w, body)
	})
	temp := 0.5
	req := &llm.Request{
		Model:  "claude-sonnet-4-5",
		System: "Be brief.",
		Messages: []llm.Message{
			{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("Weather in SF and LA?")}},
			{Role: llm.RoleAssistant, Parts: []llm.Part{
				{Kind: llm.PartThinking, Text: "Two calls.", Signature: "EqQBCgIYAhIM"},
				{Kind: llm.PartThinking, Text: "unsigned, dropped"},
				llm.TextPart("Checking."),
				{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "toolu_1", Name: "get_weather", Arguments: `{"city":"SF"}`}},
				{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "toolu_2", Name: "get_weather", Arguments: `{"city":"LA"}`}},
			}},
			{Role: llm.RoleTool, Parts: []llm.Part{
				{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: "toolu_1", Name: "get_weather", Content: "18C"}},
				{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: "toolu_2", Name: "get_weather", Content: "boom", IsError: true}},
			}},
			{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("And NYC?")}},
		},
		Tools: []llm.ToolSpec{
			{Name: "get_weather", Description: "Current weather",
				Schema: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}`)},
			{Name: "now"},
		},
		MaxOutputTokens: 1024,
		Temperature:     &temp,
		StopSequences:   []string{"END"},
	}
	if _, err := providertest.Collect(t, t.Context(), provider(t, f), req); err != nil {
		t.Fatalf("Stream: %v", err)
	}
	providertest.EqualJSON(t, f.Bodies()[0], `{
		"model": "claude-sonnet-4-5",
		"stream": true,
		"max_tokens": 1024,
		"temperature": 0.5,
		"stop_sequences": ["END"],
		"system": [{"type": "text", "text": "Be brief."}],
		"messages": [
			{"role": "user", "content": [{"type": "text", "text": "Weather in SF and LA?"}]},
			{"role": "assistant", "content": [
				{"type": "thinking", "thinking": "Two calls.", "signature": "EqQBCgIYAhIM"},
				{"type": "text", "text": "Checking."},
				{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "SF"}},
				{"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "LA"}}
			]},
			{"role": "user", "content": [
				{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": false, "content": [{"type": "text", "text": "18C"}]},
				{"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true, "content": [{"type": "text", "text": "boom"}]},
				{"type": "text", "text": "And NYC?"}
			]}
		],
		"tools": [
			{"name": "get_weather", "description": "Current weather", "input_schema": {"type": "object",
				"properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false}},
			{"name": "now", "input_schema": {"type": "object"}}
		]
	}`)
	h := f.Headers()[0]
	if got := h.Get("X-Api-Key"); got != testKey {
		t.Errorf("X-Api-Key = %q", got)
	}
	if got := h.Get("Anthropic-Version"); got == "" {
		t.Error("anthropic-version header missing")
	}
	if got := h.Get("X-Extra"); got != "yes" {
		t.Errorf("X-Extra = %q, want the configured header", got)
	}
}

func TestRequestDefaultsMaxTokens(t *testing.T) {
	t.Parallel()
	params, err := buildParams(simpleRequest)
	if err != nil {
		t.Fatal(err)
	}
	if params.MaxTokens != DefaultMaxTokens {
		t.Errorf("MaxTokens = %d, want %d", params.MaxTokens, DefaultMaxTokens)
	}
	if _, err := buildParams(&llm.Request{Model: "m", Tools: []llm.ToolSpec{{Name: "t", Schema: json.RawMessage(`null`)}}}); err == nil {
		t.Error("a null schema was accepted")
	}
}

// FuzzDecode feeds arbitrary bytes to the stream decoder as an SSE body:
// it must not panic, must yield an error at most once and last, and must
// end with either a stop or an error.
func FuzzDecode(f *testing.F) {
	for _, name := range []string{"anthropic_ok.sse", "anthropic_midstream_error.sse"} {
		f.Add([]byte(providertest.Fixture(f, name)))
	}
	f.Add([]byte(ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"n","input":{"a":1}}}`) +
		ev("content_block_stop", `{"type":"content_block_stop","index":0}`)))
	p, err := New(Config{Name: "fuzz", BaseURL: "http://127.0.0.1:1"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/v1/messages", nil)
		resp := &http.Response{
			StatusCode: 200,
			Header:     http.Header{"Content-Type": {"text/event-stream"}},
			Body:       io.NopCloser(bytes.NewReader(body)),
			Request:    req,
		}
		stream := ssestream.NewStream[anthropic.MessageStreamEventUnion](ssestream.NewDecoder(resp), nil)
		defer stream.Close()
		yield, end := providertest.CheckYield(t)
		p.consume(t.Context(), stream, resp, yield)
		end()
	})
}
