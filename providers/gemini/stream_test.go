package gemini

import (
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

func TestStreamSuccessFixture(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "gemini_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1beta/models/gemini-2.5-flash:streamGenerateContent" || r.URL.Query().Get("alt") != "sse" {
			http.NotFound(w, r)
			return
		}
		providertest.WriteSSE(w, body)
	})
	chunks, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	want := []llm.Chunk{
		{Kind: llm.ChunkThinking, Index: 0, Signature: "CikBcsjafFK168IbtVtoxVV0Tsn8O+eU45rz"},
		{Kind: llm.ChunkToolCallStart, Index: 0, Name: "getWeather"},
		{Kind: llm.ChunkToolCallArgs, Index: 0, Text: `{"location":"Tokyo"}`},
		{Kind: llm.ChunkToolCallEnd, Index: 0},
		{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 83, OutputTokens: 14 + 104}},
		{Kind: llm.ChunkStop, Stop: llm.StopToolUse, Model: "gemini-2.5-flash", ResponseID: "qpc2afWVFJK4vr0Pq6WiyAU"},
	}
	if diff := cmp.Diff(want, chunks); diff != "" {
		t.Errorf("chunks (-want +got):\n%s", diff)
	}
	if n := f.Requests(); n != 1 {
		t.Errorf("requests = %d, want 1", n)
	}
	if got := f.Headers()[0].Get("X-Goog-Api-Key"); got != testKey {
		t.Errorf("x-goog-api-key = %q", got)
	}
}

func data(json string) string { return "data: " + json + "\n\n" }

func TestStreamShapes(t *testing.T) {
	t.Parallel()
	const usage = `"usageMetadata":{"promptTokenCount":100,"cachedContentTokenCount":60,"candidatesTokenCount":7,"thoughtsTokenCount":3}`
	usageChunk := llm.Chunk{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 40, OutputTokens: 10, CacheReadTokens: 60}}
	cases := []providertest.StreamCase{
		{
			Name: "thoughts, text in two chunks, cached usage, \\n\\n framing",
			Body: data(`{"candidates":[{"content":{"parts":[{"text":"Let me think","thought":true}],"role":"model"},"index":0}]}`) +
				data(`{"candidates":[{"content":{"parts":[{"text":"Hello"}],"role":"model"},"index":0}]}`) +
				data(`{"candidates":[{"content":{"parts":[{"text":" there","thoughtSignature":"c2ln"}],"role":"model"},"finishReason":"STOP","index":0}],`+usage+`}`),
			Want: []llm.Chunk{
				{Kind: llm.ChunkThinking, Index: 0, Text: "Let me think"},
				{Kind: llm.ChunkText, Text: "Hello"},
				{Kind: llm.ChunkThinking, Index: 1, Signature: "c2ln"},
				{Kind: llm.ChunkText, Text: " there"},
				usageChunk,
				{Kind: llm.ChunkStop, Stop: llm.StopEndTurn},
			},
		},
		{
			Name: "parallel function calls with ids, \\r\\n framing",
			Body: "data: " + `{"candidates":[{"content":{"parts":[{"functionCall":{"id":"a1","name":"f","args":{"x":1}}},{"functionCall":{"id":"a2","name":"g"}}],"role":"model"},"finishReason":"STOP","index":0}]}` + "\r\n\r\n",
			Want: []llm.Chunk{
				{Kind: llm.ChunkToolCallStart, Index: 0, CallID: "a1", Name: "f"},
				{Kind: llm.ChunkToolCallArgs, Index: 0, Text: `{"x":1}`},
				{Kind: llm.ChunkToolCallEnd, Index: 0},
				{Kind: llm.ChunkToolCallStart, Index: 1, CallID: "a2", Name: "g"},
				{Kind: llm.ChunkToolCallArgs, Index: 1, Text: `{}`},
				{Kind: llm.ChunkToolCallEnd, Index: 1},
				{Kind: llm.ChunkStop, Stop: llm.StopToolUse},
			},
		},
		{
			Name: "max tokens",
			Body: data(`{"candidates":[{"content":{"parts":[{"text":"abc"}],"role":"model"},"finishReason":"MAX_TOKENS","index":0}]}`),
			Want: []llm.Chunk{{Kind: llm.ChunkText, Text: "abc"}, {Kind: llm.ChunkStop, Stop: llm.StopMaxTokens}},
		},
		{
			Name: "safety finish is a refusal",
			Body: data(`{"candidates":[{"content":{"parts":[{"text":"I"}],"role":"model"},"finishReason":"SAFETY","index":0}]}`),
			Want: []llm.Chunk{{Kind: llm.ChunkText, Text: "I"}, {Kind: llm.ChunkStop, Stop: llm.StopRefusal}},
		},
		{
			Name: "blocked prompt is a refusal",
			Body: data(`{"promptFeedback":{"blockReason":"PROHIBITED_CONTENT"},` + usage + `}`),
			Want: []llm.Chunk{usageChunk, {Kind: llm.ChunkStop, Stop: llm.StopRefusal}},
		},
		{
			Name:    "malformed function call",
			Body:    data(`{"candidates":[{"finishReason":"MALFORMED_FUNCTION_CALL","finishMessage":"Malformed function call: print(x","index":0}]}`),
			WantErr: llm.KindServerError,
		},
		{
			// Each finish that is not a success is a classified failure,
			// never the end of a turn (issue 33).
			Name:    "finish OTHER is a server error",
			Body:    data(`{"candidates":[{"content":{"parts":[{"text":"Half"}],"role":"model"},"finishReason":"OTHER","index":0}]}`),
			Want:    []llm.Chunk{{Kind: llm.ChunkText, Text: "Half"}},
			WantErr: llm.KindServerError,
		},
		{
			Name:    "finish TOO_MANY_TOOL_CALLS is a server error",
			Body:    data(`{"candidates":[{"content":{"parts":[{"functionCall":{"name":"f","args":{}}}],"role":"model"},"finishReason":"TOO_MANY_TOOL_CALLS","index":0}]}`),
			Want:    []llm.Chunk{{Kind: llm.ChunkToolCallStart, Name: "f"}, {Kind: llm.ChunkToolCallArgs, Text: "{}"}, {Kind: llm.ChunkToolCallEnd}},
			WantErr: llm.KindServerError,
		},
		{
			// The response that ends in a failed finish carries the call's
			// usage: it is reported before the failure, so the turn charges
			// what the provider billed rather than an estimate.
			Name:    "a failed finish reports its usage first",
			Body:    data(`{"candidates":[{"content":{"parts":[{"text":"Half"}],"role":"model"},"finishReason":"OTHER","index":0}],` + usage + `}`),
			Want:    []llm.Chunk{{Kind: llm.ChunkText, Text: "Half"}, usageChunk},
			WantErr: llm.KindServerError,
		},
		{
			Name:    "finish LANGUAGE is an invalid request",
			Body:    data(`{"candidates":[{"finishReason":"LANGUAGE","index":0}]}`),
			WantErr: llm.KindInvalidRequest,
		},
		{
			Name:    "an unknown finish is a server error",
			Body:    data(`{"candidates":[{"content":{"parts":[{"text":"x"}],"role":"model"},"finishReason":"SOMETHING_NEW","index":0}]}`),
			Want:    []llm.Chunk{{Kind: llm.ChunkText, Text: "x"}},
			WantErr: llm.KindServerError,
		},
		{
			Name: "function calls without ids go without: the runtime names them",
			Body: data(`{"candidates":[{"content":{"parts":[{"functionCall":{"name":"f","args":{"x":1}}},{"functionCall":{"name":"f"}}],"role":"model"},"finishReason":"STOP","index":0}]}`),
			Want: []llm.Chunk{
				{Kind: llm.ChunkToolCallStart, Index: 0, Name: "f"},
				{Kind: llm.ChunkToolCallArgs, Index: 0, Text: `{"x":1}`},
				{Kind: llm.ChunkToolCallEnd, Index: 0},
				{Kind: llm.ChunkToolCallStart, Index: 1, Name: "f"},
				{Kind: llm.ChunkToolCallArgs, Index: 1, Text: `{}`},
				{Kind: llm.ChunkToolCallEnd, Index: 1},
				{Kind: llm.ChunkStop, Stop: llm.StopToolUse},
			},
		},
		{
			Name:    "missing finish after output",
			Body:    data(`{"candidates":[{"content":{"parts":[{"text":"Hel"}],"role":"model"},"index":0}]}`),
			Want:    []llm.Chunk{{Kind: llm.ChunkText, Text: "Hel"}},
			WantErr: llm.KindStreamInterrupted,
		},
		{
			Name:    "empty body",
			WantErr: llm.KindServerError,
		},
		{
			Name:    "malformed chunk",
			Body:    data(`{not json`),
			WantErr: llm.KindServerError,
		},
		{
			// Vertex sends a bare JSON error line without data:.
			Name: "bare JSON error line after output",
			Body: data(`{"candidates":[{"content":{"parts":[{"text":"The"}],"role":"model"},"index":0}]}`) +
				`{"error": {"code": 503, "message": "The model is overloaded. Please try again later.", "status": "UNAVAILABLE"}}` + "\n\n",
			Want:    []llm.Chunk{{Kind: llm.ChunkText, Text: "The"}},
			WantErr: llm.KindOverloaded,
		},
	}
	providertest.StreamShapes(t, provider, simpleRequest, "gm", cases)
}

func TestMidStreamError(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "gemini_midstream_error.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	chunks, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
	want := []llm.Chunk{
		{Kind: llm.ChunkText, Text: "The weather"},
		{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 83}},
	}
	if diff := cmp.Diff(want, chunks); diff != "" {
		t.Errorf("chunks (-want +got):\n%s", diff)
	}
	wantErr := &llm.Error{Kind: llm.KindOverloaded, Message: "The model is overloaded. Please try again later.",
		Provider: "gm", StatusCode: 200, RequestID: "qpc2afWVFJK4vr0Pq6WiyAU"}
	if diff := cmp.Diff(wantErr, providertest.AsError(t, err), providertest.IgnoreErr); diff != "" {
		t.Errorf("error (-want +got):\n%s", diff)
	}
	if n := f.Requests(); n != 1 {
		t.Errorf("requests = %d, want 1 (no automatic continuation)", n)
	}
}

func TestTransportFailures(t *testing.T) {
	t.Parallel()
	providertest.TransportFailures(t, providertest.Adapter{
		New: func(tb testing.TB, baseURL string, client *http.Client) llm.Provider {
			return newProvider(tb, baseURL, client)
		},
		Request:      simpleRequest,
		Prefix:       data(`{"candidates":[{"content":{"parts":[{"text":"partial"}],"role":"model"},"index":0}]}`),
		PrefixChunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "partial"}},
	})
}

func TestNewRequiresKey(t *testing.T) {
	t.Setenv("GEMINI_API_KEY", "from-env-must-not-be-used")
	if _, err := New(Config{}); err == nil || strings.Contains(err.Error(), "from-env") {
		t.Errorf("New without a key = %v, want an error", err)
	}
}

// A failure the decoder finds mid-stream carries the status and, as the
// Gemini API sends no request id header, the streamed responseId.
func TestDecodeErrorCarriesResponseID(t *testing.T) {
	t.Parallel()
	body := data(`{"candidates":[{"finishReason":"MALFORMED_FUNCTION_CALL","index":0}],"responseId":"resp_bad_call"}`)
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	_, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
	if e := providertest.AsError(t, err); e.Kind != llm.KindServerError || e.StatusCode != 200 || e.RequestID != "resp_bad_call" {
		t.Errorf("error = %+v, want SERVER_ERROR with status 200 and request id resp_bad_call", e)
	}
}
