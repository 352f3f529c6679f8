package openai

import (
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

func TestStreamSuccessFixture(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "openai_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-request-id", "req_ok")
		providertest.WriteSSE(w, body)
	})
	chunks, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	want := []llm.Chunk{
		{Kind: llm.ChunkToolCallStart, Index: 0, CallID: "call_2Uzw0AEZQeOex2CP2TKjcLKc", Name: "get_weather"},
		{Kind: llm.ChunkToolCallArgs, Index: 0, Text: `{"location":"`},
		{Kind: llm.ChunkToolCallArgs, Index: 0, Text: `San Francisco, CA"}`},
		{Kind: llm.ChunkToolCallEnd, Index: 0},
		{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 61, OutputTokens: 16}},
		{Kind: llm.ChunkStop, Stop: llm.StopToolUse, Model: "gpt-4o-2024-08-06", ResponseID: "chatcmpl-Cgx6pZPBgfLcMqfT0ILIH2mID2zWQ"},
	}
	if diff := cmp.Diff(want, chunks); diff != "" {
		t.Errorf("chunks (-want +got):\n%s", diff)
	}
	if n := f.Requests(); n != 1 {
		t.Errorf("requests = %d, want 1", n)
	}
}

// chunkLine builds one chat.completion.chunk event.
func chunkLine(delta, finish string) string {
	if finish == "" {
		finish = "null"
	} else {
		finish = `"` + finish + `"`
	}
	return `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + `}]}` + "\n\n"
}

func TestStreamShapes(t *testing.T) {
	t.Parallel()
	cases := []providertest.StreamCase{
		{
			Name: "text, cached usage, stop",
			Body: chunkLine(`{"role":"assistant","content":"Hel"}`, "") + chunkLine(`{"content":"lo"}`, "") +
				chunkLine(`{}`, "stop") +
				`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":5,"total_tokens":105,"prompt_tokens_details":{"cached_tokens":80}}}` + "\n\n" +
				"data: [DONE]\n\n",
			Want: []llm.Chunk{
				{Kind: llm.ChunkText, Text: "Hel"}, {Kind: llm.ChunkText, Text: "lo"},
				{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 20, OutputTokens: 5, CacheReadTokens: 80}},
				{Kind: llm.ChunkStop, Stop: llm.StopEndTurn, Model: "m", ResponseID: "c"},
			},
		},
		{
			Name: "reasoning of compatible servers, length",
			Body: chunkLine(`{"reasoning_content":"think"}`, "") + chunkLine(`{"reasoning":"more"}`, "") +
				chunkLine(`{"content":"x"}`, "length") + "data: [DONE]\n\n",
			Want: []llm.Chunk{
				{Kind: llm.ChunkThinking, Text: "think"}, {Kind: llm.ChunkThinking, Text: "more"},
				{Kind: llm.ChunkText, Text: "x"}, {Kind: llm.ChunkStop, Stop: llm.StopMaxTokens, Model: "m", ResponseID: "c"},
			},
		},
		{
			Name: "parallel tool calls, whole and fragmented, stop after calls",
			Body: chunkLine(`{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\":"}}]}`, "") +
				chunkLine(`{"tool_calls":[{"index":1,"id":"b","type":"function","function":{"name":"g","arguments":"{}"}}]}`, "") +
				chunkLine(`{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}`, "") +
				chunkLine(`{"tool_calls":[{"index":2,"id":"c","type":"function","function":{"name":"h"}}]}`, "") +
				chunkLine(`{}`, "stop") + "data: [DONE]\n\n",
			Want: []llm.Chunk{
				{Kind: llm.ChunkToolCallStart, Index: 0, CallID: "a", Name: "f"},
				{Kind: llm.ChunkToolCallArgs, Index: 0, Text: `{"x":`},
				{Kind: llm.ChunkToolCallStart, Index: 1, CallID: "b", Name: "g"},
				{Kind: llm.ChunkToolCallArgs, Index: 1, Text: `{}`},
				{Kind: llm.ChunkToolCallArgs, Index: 0, Text: `1}`},
				{Kind: llm.ChunkToolCallStart, Index: 2, CallID: "c", Name: "h"},
				{Kind: llm.ChunkToolCallEnd, Index: 0},
				{Kind: llm.ChunkToolCallEnd, Index: 1},
				{Kind: llm.ChunkToolCallArgs, Index: 2, Text: `{}`},
				{Kind: llm.ChunkToolCallEnd, Index: 2},
				{Kind: llm.ChunkStop, Stop: llm.StopToolUse, Model: "m", ResponseID: "c"},
			},
		},
		{
			Name: "refusal",
			Body: chunkLine(`{"refusal":"I can't"}`, "") + chunkLine(`{"refusal":" help."}`, "") + chunkLine(`{}`, "stop") + "data: [DONE]\n\n",
			Want: []llm.Chunk{
				{Kind: llm.ChunkText, Text: "I can't"}, {Kind: llm.ChunkText, Text: " help."},
				{Kind: llm.ChunkStop, Stop: llm.StopRefusal, Model: "m", ResponseID: "c"},
			},
		},
		{
			Name: "content filter",
			Body: chunkLine(`{"content":"I"}`, "content_filter") + "data: [DONE]\n\n",
			Want: []llm.Chunk{{Kind: llm.ChunkText, Text: "I"}, {Kind: llm.ChunkStop, Stop: llm.StopRefusal, Model: "m", ResponseID: "c"}},
		},
		{
			Name: "invalid tool arguments",
			Body: chunkLine(`{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\":"}}]}`, "tool_calls") +
				"data: [DONE]\n\n",
			Want: []llm.Chunk{
				{Kind: llm.ChunkToolCallStart, Index: 0, CallID: "a", Name: "f"},
				{Kind: llm.ChunkToolCallArgs, Index: 0, Text: `{"x":`},
			},
			WantErr: llm.KindServerError,
		},
		{
			Name: "arguments that are not an object",
			Body: chunkLine(`{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":"[1]"}}]}`, "tool_calls") +
				"data: [DONE]\n\n",
			Want: []llm.Chunk{
				{Kind: llm.ChunkToolCallStart, Index: 0, CallID: "a", Name: "f"},
				{Kind: llm.ChunkToolCallArgs, Index: 0, Text: `[1]`},
			},
			WantErr: llm.KindServerError,
		},
		{
			Name:    "missing finish after output",
			Body:    chunkLine(`{"content":"Hel"}`, "") + "data: [DONE]\n\n",
			Want:    []llm.Chunk{{Kind: llm.ChunkText, Text: "Hel"}},
			WantErr: llm.KindStreamInterrupted,
		},
		{
			Name:    "missing finish, connection closed without [DONE]",
			Body:    chunkLine(`{"role":"assistant"}`, ""),
			WantErr: llm.KindServerError,
		},
		{
			Name:    "empty body",
			Body:    "",
			WantErr: llm.KindServerError,
		},
		{
			// Old llama.cpp: the SDK drops an "error:" line and sees [DONE].
			Name:    "old llama.cpp error frame",
			Body:    `error: {"code":500,"message":"slot unavailable","type":"server_error"}` + "\n\n" + "data: [DONE]\n\n",
			WantErr: llm.KindServerError,
		},
		{
			Name:    "malformed event",
			Body:    "data: {not json\n\n",
			WantErr: llm.KindServerError,
		},
	}
	providertest.StreamShapes(t, provider, simpleRequest, "oa", cases)
}

func TestMidStreamError(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "openai_midstream_error.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-request-id", "req_mid")
		providertest.WriteSSE(w, body)
	})
	chunks, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
	if diff := cmp.Diff([]llm.Chunk{{Kind: llm.ChunkText, Text: "Let me"}}, chunks); diff != "" {
		t.Errorf("chunks (-want +got):\n%s", diff)
	}
	e := providertest.AsError(t, err)
	want := &llm.Error{
		Kind:       llm.KindServerError,
		Message:    "The server had an error while processing your request. Sorry about that!",
		Provider:   "oa",
		StatusCode: 200,
		RequestID:  "req_mid",
	}
	if diff := cmp.Diff(want, e, providertest.IgnoreErr); diff != "" {
		t.Errorf("error (-want +got):\n%s", diff)
	}
	if n := f.Requests(); n != 1 {
		t.Errorf("requests = %d, want 1", n)
	}
}

func TestMidStreamErrorByCode(t *testing.T) {
	t.Parallel()
	body := chunkLine(`{"content":"a"}`, "") +
		`data: {"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}` + "\n\n"
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	_, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
	if e := providertest.AsError(t, err); e.Kind != llm.KindRateLimited || e.Message != "Rate limit reached" {
		t.Errorf("error = %+v, want RATE_LIMITED", e)
	}
}

func TestTransportFailures(t *testing.T) {
	t.Parallel()
	providertest.TransportFailures(t, providertest.Adapter{
		New: func(tb testing.TB, baseURL string, client *http.Client) llm.Provider {
			return newProvider(tb, baseURL, client)
		},
		Request:      simpleRequest,
		Prefix:       chunkLine(`{"content":"partial"}`, ""),
		PrefixChunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "partial"}},
	})
}

func TestStopEarly(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "openai_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	for c, err := range provider(t, f).Stream(t.Context(), simpleRequest) {
		if err != nil || c.Kind != llm.ChunkToolCallStart {
			t.Fatalf("first = %+v, %v", c, err)
		}
		break
	}
}

// A failure the decoder finds in the stream carries the response's status
// and request id, as every other error does.
func TestDecodeErrorCarriesResponse(t *testing.T) {
	t.Parallel()
	body := chunkLine(`{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":"[1]"}}]}`, "tool_calls")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-request-id", "req_args")
		providertest.WriteSSE(w, body)
	})
	_, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
	if e := providertest.AsError(t, err); e.Kind != llm.KindServerError || e.StatusCode != 200 || e.RequestID != "req_args" {
		t.Errorf("error = %+v, want SERVER_ERROR with status 200 and request id req_args", e)
	}
}
