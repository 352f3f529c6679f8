package openai

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/turnstile-dev/turnstile/llm"
)

// benchBody is a reply of 20 text chunks as OpenAI streams it: a role
// chunk, the content, a finish chunk, a usage chunk and [DONE].
func benchBody() []byte {
	const head = `data: {"id":"chatcmpl-0123456789","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4.1-mini-2025-04-14","service_tier":"default","system_fingerprint":"fp_0123456789","choices":[`
	var b strings.Builder
	b.WriteString(head + `{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"abc"}` + "\n\n")
	for i := range 20 {
		b.WriteString(head + `{"index":0,"delta":{"content":"word` + strconv.Itoa(i) + ` "},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"abc"}` + "\n\n")
	}
	b.WriteString(head + `{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null,"obfuscation":"abc"}` + "\n\n")
	b.WriteString(head + `],"usage":{"prompt_tokens":12,"completion_tokens":20,"total_tokens":32,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"obfuscation":"abc"}` + "\n\n")
	b.WriteString("data: [DONE]\n\n")
	return []byte(b.String())
}

// BenchmarkDecode decodes one 20-chunk reply to runtime chunks, through
// the SDK's decoding and through the fast path:
//
//	go test -run XXX -bench BenchmarkDecode -benchmem ./providers/openai
func BenchmarkDecode(b *testing.B) {
	body := benchBody()
	p, err := New(Config{Name: "oa", BaseURL: "http://127.0.0.1:1/v1"})
	if err != nil {
		b.Fatal(err)
	}
	resp := func() *http.Response {
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: io.NopCloser(bytes.NewReader(body))}
	}
	yield := func(c llm.Chunk, err error) bool {
		if err != nil {
			b.Fatal(err)
		}
		return true
	}
	b.Run("sdk", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r := resp()
			s := ssestream.NewStream[openai.ChatCompletionChunk](ssestream.NewDecoder(r), nil)
			p.consume(b.Context(), s, r, yield)
		}
	})
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p.consumeFast(b.Context(), resp(), yield)
		}
	})
}

// replay is an in-process transport that answers every request with body,
// as a stream, after reading the request's body.
type replay struct{ body []byte }

func (r replay) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		_ = req.Body.Close()
	}
	return &http.Response{StatusCode: 200, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: io.NopCloser(bytes.NewReader(r.body)), Request: req}, nil
}

// BenchmarkRequest runs one turn of a 20-chunk reply against an in-process
// transport, the request built and sent by the SDK's pipeline ("sdk") or
// directly ("direct"; the reply is read by the fast decoder in both), for
// a one-message request ("short", as turnstile bench sends) and one with
// history and two tools ("tools"):
//
//	go test -run XXX -bench BenchmarkRequest -benchmem ./providers/openai
func BenchmarkRequest(b *testing.B) {
	p, err := New(Config{Name: "oa", BaseURL: "http://127.0.0.1:1/v1", APIKey: testKey,
		HTTPClient: &http.Client{Transport: replay{benchBody()}}})
	if err != nil {
		b.Fatal(err)
	}
	temp := 0.7
	reqs := []struct {
		name string
		req  *llm.Request
	}{
		{"short", &llm.Request{Model: "gpt-4.1-mini", Messages: []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("Say hello in twenty words.")}}}}},
		{"tools", &llm.Request{Model: "gpt-4.1-mini", System: "You are a helpful assistant. Use the tools when they help.", MaxOutputTokens: 1024, Temperature: &temp,
			Messages: []llm.Message{
				{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("What is the weather in Paris, and what time is it there?")}},
				{Role: llm.RoleAssistant, Parts: []llm.Part{{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "call_0123456789", Name: "get_weather", Arguments: `{"city":"Paris"}`}}}},
				{Role: llm.RoleTool, Parts: []llm.Part{{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: "call_0123456789", Name: "get_weather", Content: `{"temperature":18,"sky":"clear"}`}}}},
			},
			Tools: []llm.ToolSpec{
				{Name: "get_weather", Description: "Current weather in a city", Schema: []byte(`{"type":"object","properties":{"city":{"type":"string","description":"City name"}},"required":["city"]}`)},
				{Name: "get_time", Description: "Current local time in a city", Schema: []byte(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`)},
			}}},
	}
	yield := func(c llm.Chunk, err error) bool {
		if err != nil {
			b.Fatal(err)
		}
		return true
	}
	for _, r := range reqs {
		b.Run(r.name+"/sdk", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				params, err := buildParams(r.req)
				if err != nil {
					b.Fatal(err)
				}
				p.viaSDK(b.Context(), params, yield)
			}
		})
		b.Run(r.name+"/direct", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for _, err := range p.Stream(b.Context(), r.req) {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
