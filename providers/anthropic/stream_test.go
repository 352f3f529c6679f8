package anthropic

import (
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

func TestStreamSuccessFixture(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "anthropic_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	chunks, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	want := []llm.Chunk{
		{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 394, OutputTokens: 1}},
		{Kind: llm.ChunkToolCallStart, Index: 0, CallID: "toolu_017QoD96fYwGzCWvLfaPADWg", Name: "get_weather"},
		{Kind: llm.ChunkToolCallArgs, Index: 0, Text: `{"city": "Sa`},
		{Kind: llm.ChunkToolCallArgs, Index: 0, Text: `n Francisco"}`},
		{Kind: llm.ChunkToolCallEnd, Index: 0},
		{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 394, OutputTokens: 79}},
		{Kind: llm.ChunkStop, Stop: llm.StopToolUse, Model: "claude-sonnet-4-5-20250929", ResponseID: "msg_01P7nF1bmxyzFZjF8zwbUDBM"},
	}
	if diff := cmp.Diff(want, chunks); diff != "" {
		t.Errorf("chunks (-want +got):\n%s", diff)
	}
	if n := f.Requests(); n != 1 {
		t.Errorf("requests = %d, want 1", n)
	}
}

func ev(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }

const msgStart = `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"cache_creation_input_tokens":200,"cache_read_input_tokens":3000,"output_tokens":1}}}`

func TestStreamShapes(t *testing.T) {
	t.Parallel()
	stop := func(reason string) string {
		return ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"`+reason+`","stop_sequence":null},"usage":{"output_tokens":42}}`) +
			ev("message_stop", `{"type":"message_stop"}`)
	}
	cacheUsage := func(out int64) llm.Chunk {
		return llm.Chunk{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 10, OutputTokens: out, CacheReadTokens: 3000, CacheWriteTokens: 200}}
	}
	cases := []providertest.StreamCase{
		{
			Name: "thinking with signature, text, two tool calls, cache usage",
			Body: ev("message_start", msgStart) +
				ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`) +
				ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Two cities."}}`) +
				ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCgIYAhIM"}}`) +
				ev("content_block_stop", `{"type":"content_block_stop","index":0}`) +
				ev("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`) +
				ev("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Checking."}}`) +
				ev("content_block_stop", `{"type":"content_block_stop","index":1}`) +
				ev("content_block_start", `{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_a","name":"w","input":{}}}`) +
				ev("content_block_delta", `{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"c\":\"SF\"}"}}`) +
				ev("content_block_stop", `{"type":"content_block_stop","index":2}`) +
				ev("content_block_start", `{"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"toolu_b","name":"now","input":{}}}`) +
				ev("content_block_stop", `{"type":"content_block_stop","index":3}`) +
				stop("tool_use"),
			Want: []llm.Chunk{
				cacheUsage(1),
				{Kind: llm.ChunkThinking, Index: 0, Text: "Two cities."},
				{Kind: llm.ChunkThinking, Index: 0, Signature: "EqQBCgIYAhIM"},
				{Kind: llm.ChunkText, Text: "Checking."},
				{Kind: llm.ChunkToolCallStart, Index: 0, CallID: "toolu_a", Name: "w"},
				{Kind: llm.ChunkToolCallArgs, Index: 0, Text: `{"c":"SF"}`},
				{Kind: llm.ChunkToolCallEnd, Index: 0},
				{Kind: llm.ChunkToolCallStart, Index: 1, CallID: "toolu_b", Name: "now"},
				{Kind: llm.ChunkToolCallArgs, Index: 1, Text: `{}`},
				{Kind: llm.ChunkToolCallEnd, Index: 1},
				cacheUsage(42),
				{Kind: llm.ChunkStop, Stop: llm.StopToolUse, Model: "claude", ResponseID: "msg_1"},
			},
		},
		{
			Name: "stop reasons: max_tokens",
			Body: ev("message_start", msgStart) + stop("max_tokens"),
			Want: []llm.Chunk{cacheUsage(1), cacheUsage(42), {Kind: llm.ChunkStop, Stop: llm.StopMaxTokens, Model: "claude", ResponseID: "msg_1"}},
		},
		{
			Name: "stop reasons: refusal",
			Body: ev("message_start", msgStart) + stop("refusal"),
			Want: []llm.Chunk{cacheUsage(1), cacheUsage(42), {Kind: llm.ChunkStop, Stop: llm.StopRefusal, Model: "claude", ResponseID: "msg_1"}},
		},
		{
			Name: "stop reasons: pause_turn",
			Body: ev("message_start", msgStart) + stop("pause_turn"),
			Want: []llm.Chunk{cacheUsage(1), cacheUsage(42), {Kind: llm.ChunkStop, Stop: llm.StopPauseTurn, Model: "claude", ResponseID: "msg_1"}},
		},
		{
			Name: "stop reasons: stop_sequence",
			Body: ev("message_start", msgStart) + stop("stop_sequence"),
			Want: []llm.Chunk{cacheUsage(1), cacheUsage(42), {Kind: llm.ChunkStop, Stop: llm.StopSequence, Model: "claude", ResponseID: "msg_1"}},
		},
		{
			Name:    "model_context_window_exceeded is an overflow",
			Body:    ev("message_start", msgStart) + stop("model_context_window_exceeded"),
			Want:    []llm.Chunk{cacheUsage(1), cacheUsage(42)},
			WantErr: llm.KindContextOverflow,
		},
		{
			Name: "invalid tool arguments",
			Body: ev("message_start", msgStart) +
				ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_a","name":"w","input":{}}}`) +
				ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"c\":"}}`) +
				ev("content_block_stop", `{"type":"content_block_stop","index":0}`) + stop("tool_use"),
			Want: []llm.Chunk{
				cacheUsage(1),
				{Kind: llm.ChunkToolCallStart, Index: 0, CallID: "toolu_a", Name: "w"},
				{Kind: llm.ChunkToolCallArgs, Index: 0, Text: `{"c":`},
			},
			WantErr: llm.KindServerError,
		},
		{
			Name: "missing message_stop after output",
			Body: ev("message_start", msgStart) +
				ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`) +
				ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`),
			Want:    []llm.Chunk{cacheUsage(1), {Kind: llm.ChunkText, Text: "Hi"}},
			WantErr: llm.KindStreamInterrupted,
		},
		{
			Name:    "missing message_stop, no output",
			Body:    ev("message_start", msgStart),
			Want:    []llm.Chunk{cacheUsage(1)},
			WantErr: llm.KindServerError,
		},
		{
			Name:    "empty body",
			WantErr: llm.KindServerError,
		},
		{
			Name:    "malformed event",
			Body:    ev("message_start", `{not json`),
			WantErr: llm.KindServerError,
		},
	}
	providertest.StreamShapes(t, provider, simpleRequest, "an", cases)
}

func TestMidStreamError(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "anthropic_midstream_error.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("request-id", "req_mid")
		providertest.WriteSSE(w, body)
	})
	chunks, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
	want := []llm.Chunk{
		{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 394, OutputTokens: 1}},
		{Kind: llm.ChunkText, Text: "I'd be"},
	}
	if diff := cmp.Diff(want, chunks); diff != "" {
		t.Errorf("chunks (-want +got):\n%s", diff)
	}
	wantErr := &llm.Error{Kind: llm.KindOverloaded, Message: "Overloaded", Provider: "an", StatusCode: 200, RequestID: "req_mid"}
	if diff := cmp.Diff(wantErr, providertest.AsError(t, err), providertest.IgnoreErr); diff != "" {
		t.Errorf("error (-want +got):\n%s", diff)
	}
}

func TestTransportFailures(t *testing.T) {
	t.Parallel()
	providertest.TransportFailures(t, providertest.Adapter{
		New: func(tb testing.TB, baseURL string, client *http.Client) llm.Provider {
			return newProvider(tb, baseURL, client)
		},
		Request: simpleRequest,
		Prefix: ev("message_start", msgStart) +
			ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`) +
			ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`),
		PrefixChunks: []llm.Chunk{
			{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 10, OutputTokens: 1, CacheReadTokens: 3000, CacheWriteTokens: 200}},
			{Kind: llm.ChunkText, Text: "Hi"},
		},
	})
}

// TestBodyCutShortBeforeOutput cuts the body after message_start, before
// any content block: still a network failure, not a missing finish.
func TestBodyCutShortBeforeOutput(t *testing.T) {
	t.Parallel()
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		providertest.WriteSSE(w, ev("message_start", msgStart))
		panic(http.ErrAbortHandler)
	})
	_, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
	if e := providertest.AsError(t, err); e.Kind != llm.KindNetwork {
		t.Errorf("error = %+v, want NETWORK", e)
	}
	if n := f.Requests(); n != 1 {
		t.Errorf("requests = %d, want 1", n)
	}
}
