package gemini

import (
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
	"github.com/turnstile-dev/turnstile/runtime"
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
	want := []runtime.Chunk{
		{Kind: runtime.ChunkThinking, Index: 0, Signature: "CikBcsjafFK168IbtVtoxVV0Tsn8O+eU45rz"},
		{Kind: runtime.ChunkToolCallStart, Index: 0, CallID: "call_0_getWeather", Name: "getWeather"},
		{Kind: runtime.ChunkToolCallArgs, Index: 0, Text: `{"location":"Tokyo"}`},
		{Kind: runtime.ChunkToolCallEnd, Index: 0},
		{Kind: runtime.ChunkUsage, Usage: runtime.Usage{InputTokens: 83, OutputTokens: 14 + 104}},
		{Kind: runtime.ChunkStop, Stop: runtime.StopToolUse},
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
	usageChunk := runtime.Chunk{Kind: runtime.ChunkUsage, Usage: runtime.Usage{InputTokens: 40, OutputTokens: 10, CacheReadTokens: 60}}
	cases := []providertest.StreamCase{
		{
			Name: "thoughts, text in two chunks, cached usage, \\n\\n framing",
			Body: data(`{"candidates":[{"content":{"parts":[{"text":"Let me think","thought":true}],"role":"model"},"index":0}]}`) +
				data(`{"candidates":[{"content":{"parts":[{"text":"Hello"}],"role":"model"},"index":0}]}`) +
				data(`{"candidates":[{"content":{"parts":[{"text":" there","thoughtSignature":"c2ln"}],"role":"model"},"finishReason":"STOP","index":0}],`+usage+`}`),
			Want: []runtime.Chunk{
				{Kind: runtime.ChunkThinking, Index: 0, Text: "Let me think"},
				{Kind: runtime.ChunkText, Text: "Hello"},
				{Kind: runtime.ChunkThinking, Index: 1, Signature: "c2ln"},
				{Kind: runtime.ChunkText, Text: " there"},
				usageChunk,
				{Kind: runtime.ChunkStop, Stop: runtime.StopEndTurn},
			},
		},
		{
			Name: "parallel function calls with ids, \\r\\n framing",
			Body: "data: " + `{"candidates":[{"content":{"parts":[{"functionCall":{"id":"a1","name":"f","args":{"x":1}}},{"functionCall":{"id":"a2","name":"g"}}],"role":"model"},"finishReason":"STOP","index":0}]}` + "\r\n\r\n",
			Want: []runtime.Chunk{
				{Kind: runtime.ChunkToolCallStart, Index: 0, CallID: "a1", Name: "f"},
				{Kind: runtime.ChunkToolCallArgs, Index: 0, Text: `{"x":1}`},
				{Kind: runtime.ChunkToolCallEnd, Index: 0},
				{Kind: runtime.ChunkToolCallStart, Index: 1, CallID: "a2", Name: "g"},
				{Kind: runtime.ChunkToolCallArgs, Index: 1, Text: `{}`},
				{Kind: runtime.ChunkToolCallEnd, Index: 1},
				{Kind: runtime.ChunkStop, Stop: runtime.StopToolUse},
			},
		},
		{
			Name: "max tokens",
			Body: data(`{"candidates":[{"content":{"parts":[{"text":"abc"}],"role":"model"},"finishReason":"MAX_TOKENS","index":0}]}`),
			Want: []runtime.Chunk{{Kind: runtime.ChunkText, Text: "abc"}, {Kind: runtime.ChunkStop, Stop: runtime.StopMaxTokens}},
		},
		{
			Name: "safety finish is a refusal",
			Body: data(`{"candidates":[{"content":{"parts":[{"text":"I"}],"role":"model"},"finishReason":"SAFETY","index":0}]}`),
			Want: []runtime.Chunk{{Kind: runtime.ChunkText, Text: "I"}, {Kind: runtime.ChunkStop, Stop: runtime.StopRefusal}},
		},
		{
			Name: "blocked prompt is a refusal",
			Body: data(`{"promptFeedback":{"blockReason":"PROHIBITED_CONTENT"},` + usage + `}`),
			Want: []runtime.Chunk{usageChunk, {Kind: runtime.ChunkStop, Stop: runtime.StopRefusal}},
		},
		{
			Name:    "malformed function call",
			Body:    data(`{"candidates":[{"finishReason":"MALFORMED_FUNCTION_CALL","finishMessage":"Malformed function call: print(x","index":0}]}`),
			WantErr: runtime.KindServerError,
		},
		{
			Name:    "missing finish after output",
			Body:    data(`{"candidates":[{"content":{"parts":[{"text":"Hel"}],"role":"model"},"index":0}]}`),
			Want:    []runtime.Chunk{{Kind: runtime.ChunkText, Text: "Hel"}},
			WantErr: runtime.KindStreamInterrupted,
		},
		{
			Name:    "empty body",
			WantErr: runtime.KindServerError,
		},
		{
			Name:    "malformed chunk",
			Body:    data(`{not json`),
			WantErr: runtime.KindServerError,
		},
		{
			// Vertex sends a bare JSON error line without data:.
			Name: "bare JSON error line after output",
			Body: data(`{"candidates":[{"content":{"parts":[{"text":"The"}],"role":"model"},"index":0}]}`) +
				`{"error": {"code": 503, "message": "The model is overloaded. Please try again later.", "status": "UNAVAILABLE"}}` + "\n\n",
			Want:    []runtime.Chunk{{Kind: runtime.ChunkText, Text: "The"}},
			WantErr: runtime.KindOverloaded,
		},
	}
	providertest.StreamShapes(t, provider, simpleRequest, "gm", cases)
}

func TestMidStreamError(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "gemini_midstream_error.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	chunks, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
	want := []runtime.Chunk{
		{Kind: runtime.ChunkText, Text: "The weather"},
		{Kind: runtime.ChunkUsage, Usage: runtime.Usage{InputTokens: 83}},
	}
	if diff := cmp.Diff(want, chunks); diff != "" {
		t.Errorf("chunks (-want +got):\n%s", diff)
	}
	wantErr := &runtime.Error{Kind: runtime.KindOverloaded, Message: "The model is overloaded. Please try again later.",
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
		New: func(tb testing.TB, baseURL string, client *http.Client) runtime.Provider {
			return newProvider(tb, baseURL, client)
		},
		Request:      simpleRequest,
		Prefix:       data(`{"candidates":[{"content":{"parts":[{"text":"partial"}],"role":"model"},"index":0}]}`),
		PrefixChunks: []runtime.Chunk{{Kind: runtime.ChunkText, Text: "partial"}},
	})
}

func TestNewRequiresKey(t *testing.T) {
	t.Setenv("GEMINI_API_KEY", "from-env-must-not-be-used")
	if _, err := New(Config{}); err == nil || strings.Contains(err.Error(), "from-env") {
		t.Errorf("New without a key = %v, want an error", err)
	}
}
