package gemini

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
	"github.com/turnstile-dev/turnstile/runtime"
)

var cmpError = cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Err" }, cmp.Ignore())

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
	tests := []struct {
		name    string
		body    string
		want    []runtime.Chunk
		wantErr runtime.Kind
	}{
		{
			name: "thoughts, text in two chunks, cached usage, \\n\\n framing",
			body: data(`{"candidates":[{"content":{"parts":[{"text":"Let me think","thought":true}],"role":"model"},"index":0}]}`) +
				data(`{"candidates":[{"content":{"parts":[{"text":"Hello"}],"role":"model"},"index":0}]}`) +
				data(`{"candidates":[{"content":{"parts":[{"text":" there","thoughtSignature":"c2ln"}],"role":"model"},"finishReason":"STOP","index":0}],`+usage+`}`),
			want: []runtime.Chunk{
				{Kind: runtime.ChunkThinking, Index: 0, Text: "Let me think"},
				{Kind: runtime.ChunkText, Text: "Hello"},
				{Kind: runtime.ChunkThinking, Index: 1, Signature: "c2ln"},
				{Kind: runtime.ChunkText, Text: " there"},
				usageChunk,
				{Kind: runtime.ChunkStop, Stop: runtime.StopEndTurn},
			},
		},
		{
			name: "parallel function calls with ids, \\r\\n framing",
			body: "data: " + `{"candidates":[{"content":{"parts":[{"functionCall":{"id":"a1","name":"f","args":{"x":1}}},{"functionCall":{"id":"a2","name":"g"}}],"role":"model"},"finishReason":"STOP","index":0}]}` + "\r\n\r\n",
			want: []runtime.Chunk{
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
			name: "max tokens",
			body: data(`{"candidates":[{"content":{"parts":[{"text":"abc"}],"role":"model"},"finishReason":"MAX_TOKENS","index":0}]}`),
			want: []runtime.Chunk{{Kind: runtime.ChunkText, Text: "abc"}, {Kind: runtime.ChunkStop, Stop: runtime.StopMaxTokens}},
		},
		{
			name: "safety finish is a refusal",
			body: data(`{"candidates":[{"content":{"parts":[{"text":"I"}],"role":"model"},"finishReason":"SAFETY","index":0}]}`),
			want: []runtime.Chunk{{Kind: runtime.ChunkText, Text: "I"}, {Kind: runtime.ChunkStop, Stop: runtime.StopRefusal}},
		},
		{
			name: "blocked prompt is a refusal",
			body: data(`{"promptFeedback":{"blockReason":"PROHIBITED_CONTENT"},` + usage + `}`),
			want: []runtime.Chunk{usageChunk, {Kind: runtime.ChunkStop, Stop: runtime.StopRefusal}},
		},
		{
			name:    "malformed function call",
			body:    data(`{"candidates":[{"finishReason":"MALFORMED_FUNCTION_CALL","finishMessage":"Malformed function call: print(x","index":0}]}`),
			wantErr: runtime.KindServerError,
		},
		{
			name:    "missing finish after output",
			body:    data(`{"candidates":[{"content":{"parts":[{"text":"Hel"}],"role":"model"},"index":0}]}`),
			want:    []runtime.Chunk{{Kind: runtime.ChunkText, Text: "Hel"}},
			wantErr: runtime.KindStreamInterrupted,
		},
		{
			name:    "empty body",
			wantErr: runtime.KindServerError,
		},
		{
			name:    "malformed chunk",
			body:    data(`{not json`),
			wantErr: runtime.KindServerError,
		},
		{
			// Vertex sends a bare JSON error line without data:.
			name: "bare JSON error line after output",
			body: data(`{"candidates":[{"content":{"parts":[{"text":"The"}],"role":"model"},"index":0}]}`) +
				`{"error": {"code": 503, "message": "The model is overloaded. Please try again later.", "status": "UNAVAILABLE"}}` + "\n\n",
			want:    []runtime.Chunk{{Kind: runtime.ChunkText, Text: "The"}},
			wantErr: runtime.KindOverloaded,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, tt.body) })
			chunks, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
			if diff := cmp.Diff(tt.want, chunks); diff != "" {
				t.Errorf("chunks (-want +got):\n%s", diff)
			}
			switch {
			case tt.wantErr == 0 && err != nil:
				t.Errorf("Stream: %v", err)
			case tt.wantErr != 0:
				e := providertest.AsError(t, err)
				if e.Kind != tt.wantErr || e.Provider != "gm" || e.Message == "" {
					t.Errorf("error = %+v, want kind %v", e, tt.wantErr)
				}
			}
		})
	}
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
	if diff := cmp.Diff(wantErr, providertest.AsError(t, err), cmpError); diff != "" {
		t.Errorf("error (-want +got):\n%s", diff)
	}
	if n := f.Requests(); n != 1 {
		t.Errorf("requests = %d, want 1 (no automatic continuation)", n)
	}
}

func TestNetworkFailures(t *testing.T) {
	t.Parallel()
	t.Run("connection refused", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		p, err := New(Config{Name: "gm", BaseURL: "http://" + addr, APIKey: testKey, HTTPClient: &http.Client{}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = providertest.Collect(t, t.Context(), p, simpleRequest)
		if e := providertest.AsError(t, err); e.Kind != runtime.KindNetwork || e.Message != "connection refused" {
			t.Errorf("error = %+v, want NETWORK connection refused", e)
		}
	})
	t.Run("reset before headers", func(t *testing.T) {
		t.Parallel()
		f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				panic(err)
			}
			conn.(*net.TCPConn).SetLinger(0)
			conn.Close()
		})
		_, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
		if e := providertest.AsError(t, err); e.Kind != runtime.KindNetwork {
			t.Errorf("error = %+v, want NETWORK", e)
		}
		if n := f.Requests(); n != 1 {
			t.Errorf("requests = %d, want 1 (SDK retries must be off)", n)
		}
	})
	t.Run("body cut short after output", func(t *testing.T) {
		t.Parallel()
		f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
			providertest.WriteSSE(w, data(`{"candidates":[{"content":{"parts":[{"text":"partial"}],"role":"model"},"index":0}]}`))
			panic(http.ErrAbortHandler)
		})
		chunks, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
		if len(chunks) != 1 {
			t.Errorf("chunks = %+v, want the partial text", chunks)
		}
		if e := providertest.AsError(t, err); e.Kind != runtime.KindNetwork {
			t.Errorf("error = %+v, want NETWORK", e)
		}
		if n := f.Requests(); n != 1 {
			t.Errorf("requests = %d, want 1 (no automatic continuation)", n)
		}
	})
	t.Run("client timeout", func(t *testing.T) {
		t.Parallel()
		f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
		p, err := New(Config{Name: "gm", BaseURL: f.URL, APIKey: testKey, HTTPClient: &http.Client{Timeout: 50 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = providertest.Collect(t, t.Context(), p, simpleRequest)
		if e := providertest.AsError(t, err); e.Kind != runtime.KindTimeout {
			t.Errorf("error = %+v, want TIMEOUT", e)
		}
	})
}

func TestCancelMidStream(t *testing.T) {
	t.Parallel()
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		providertest.WriteSSE(w, data(`{"candidates":[{"content":{"parts":[{"text":"first"}],"role":"model"},"index":0}]}`))
		<-r.Context().Done()
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	start := time.Now()
	var got error
	for c, err := range provider(t, f).Stream(ctx, simpleRequest) {
		if err != nil {
			got = err
			break
		}
		if c.Kind == runtime.ChunkText {
			cancel()
		}
	}
	if !errors.Is(got, context.Canceled) || runtime.KindOf(got) != runtime.KindCancelled {
		t.Errorf("error = %v, want context.Canceled", got)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Stream took %v to stop after cancel", d)
	}
}

func TestNewRequiresKey(t *testing.T) {
	t.Setenv("GEMINI_API_KEY", "from-env-must-not-be-used")
	if _, err := New(Config{}); err == nil || strings.Contains(err.Error(), "from-env") {
		t.Errorf("New without a key = %v, want an error", err)
	}
}
