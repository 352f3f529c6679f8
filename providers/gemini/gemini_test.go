package gemini

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/turnstile-dev/turnstile/runtime"
)

func TestMain(m *testing.M) {
	// The SDK's dependency go.opencensus.io starts a worker at init.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
}

const testKey = "AIzaSy-test-key-0123456789"

// fakeGemini serves streamGenerateContent with a handler and counts and
// records requests.
type fakeGemini struct {
	*httptest.Server
	requests atomic.Int32
	lastBody atomic.Value // []byte
	lastHdr  atomic.Value // http.Header
}

func newFake(t *testing.T, h http.HandlerFunc) *fakeGemini {
	t.Helper()
	f := &fakeGemini{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.requests.Add(1)
		b, _ := io.ReadAll(r.Body)
		f.lastBody.Store(b)
		f.lastHdr.Store(r.Header.Clone())
		if !strings.HasSuffix(r.URL.Path, ":streamGenerateContent") || r.URL.Query().Get("alt") != "sse" {
			http.Error(w, "unexpected path "+r.URL.String(), http.StatusTeapot)
			return
		}
		h(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

func newProvider(t *testing.T, url string) *Provider {
	t.Helper()
	p, err := New(Config{Name: "gem", BaseURL: url, APIKey: testKey, Headers: map[string]string{"X-Team": "agents"}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// sse writes SSE events, flushing after each.
func sse(w http.ResponseWriter, events ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	for _, e := range events {
		io.WriteString(w, e)
		w.(http.Flusher).Flush()
	}
}

func fixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func userRequest() *runtime.Request {
	return &runtime.Request{Model: "gemini-2.5-flash", Messages: []runtime.Message{{Role: runtime.RoleUser, Parts: []runtime.Part{runtime.TextPart("weather in Tokyo?")}}}}
}

func drain(t *testing.T, p *Provider, req *runtime.Request) ([]runtime.Chunk, error) {
	t.Helper()
	var chunks []runtime.Chunk
	for c, err := range p.Stream(t.Context(), req) {
		if err != nil {
			return chunks, err
		}
		chunks = append(chunks, c)
	}
	return chunks, nil
}

func TestFixtureToolCall(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, _ *http.Request) { sse(w, fixture(t, "gemini_ok.sse")) })
	chunks, err := drain(t, newProvider(t, f.URL), userRequest())
	if err != nil {
		t.Fatal(err)
	}
	want := []runtime.Chunk{
		{Kind: runtime.ChunkUsage, Usage: runtime.Usage{InputTokens: 83, OutputTokens: 14 + 104}},
		{Kind: runtime.ChunkThinking, Index: 0, Signature: "CikBcsjafFK168IbtVtoxVV0Tsn8O+eU45rz"},
		{Kind: runtime.ChunkToolCallStart, Index: 0, Name: "getWeather"},
		{Kind: runtime.ChunkToolCallArgs, Index: 0, Text: `{"location":"Tokyo"}`},
		{Kind: runtime.ChunkToolCallEnd, Index: 0},
		{Kind: runtime.ChunkStop, Stop: runtime.StopToolUse},
	}
	if diff := cmp.Diff(want, chunks); diff != "" {
		t.Errorf("chunks (-want +got):\n%s", diff)
	}
	h := f.lastHdr.Load().(http.Header)
	if h.Get("x-goog-api-key") != testKey || h.Get("X-Team") != "agents" {
		t.Errorf("headers: key %q, extra %q", h.Get("x-goog-api-key"), h.Get("X-Team"))
	}
}

func TestTextStreamAndFramings(t *testing.T) {
	for _, sep := range []string{"\n\n", "\r\n\r\n"} {
		t.Run(fmt.Sprintf("%q", sep), func(t *testing.T) {
			f := newFake(t, func(w http.ResponseWriter, _ *http.Request) {
				sse(w,
					`data: {"candidates":[{"content":{"parts":[{"text":"I think","thought":true}],"role":"model"}}]}`+sep,
					`data: {"candidates":[{"content":{"parts":[{"text":"Sunny"}],"role":"model"}}]}`+sep,
					`data: {"candidates":[{"content":{"parts":[{"text":" and warm."}],"role":"model"},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":10,"cachedContentTokenCount":4,"candidatesTokenCount":3,"thoughtsTokenCount":2}}`+sep,
				)
			})
			chunks, err := drain(t, newProvider(t, f.URL), userRequest())
			if err != nil {
				t.Fatal(err)
			}
			want := []runtime.Chunk{
				{Kind: runtime.ChunkThinking, Text: "I think"},
				{Kind: runtime.ChunkText, Text: "Sunny"},
				{Kind: runtime.ChunkUsage, Usage: runtime.Usage{InputTokens: 6, CacheReadTokens: 4, OutputTokens: 5}},
				{Kind: runtime.ChunkText, Text: " and warm."},
				{Kind: runtime.ChunkStop, Stop: runtime.StopEndTurn},
			}
			if diff := cmp.Diff(want, chunks); diff != "" {
				t.Errorf("chunks (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFinishReasons(t *testing.T) {
	tests := []struct {
		body string
		stop runtime.StopReason
		kind runtime.Kind
	}{
		{`{"candidates":[{"content":{"parts":[{"text":"cut"}]},"finishReason":"MAX_TOKENS"}]}`, runtime.StopMaxTokens, 0},
		{`{"candidates":[{"finishReason":"SAFETY"}]}`, runtime.StopRefusal, 0},
		{`{"candidates":[{"finishReason":"RECITATION"}]}`, runtime.StopRefusal, 0},
		{`{"promptFeedback":{"blockReason":"PROHIBITED_CONTENT"}}`, runtime.StopRefusal, 0},
		{`{"candidates":[{"finishReason":"MALFORMED_FUNCTION_CALL"}]}`, 0, runtime.KindServerError},
	}
	for _, tt := range tests {
		t.Run(tt.body, func(t *testing.T) {
			f := newFake(t, func(w http.ResponseWriter, _ *http.Request) { sse(w, "data: "+tt.body+"\n\n") })
			chunks, err := drain(t, newProvider(t, f.URL), userRequest())
			if tt.kind != 0 {
				var e *runtime.Error
				if !errors.As(err, &e) || e.Kind != tt.kind {
					t.Fatalf("err = %v, want %v", err, tt.kind)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if last := chunks[len(chunks)-1]; last.Kind != runtime.ChunkStop || last.Stop != tt.stop {
				t.Errorf("last chunk = %+v, want stop %v", last, tt.stop)
			}
		})
	}
}

// apiError writes a google.rpc error body with status code.
func apiError(code int, status, message string, details ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		d := ""
		if len(details) > 0 {
			d = `,"details":[` + strings.Join(details, ",") + `]`
		}
		fmt.Fprintf(w, `{"error":{"code":%d,"message":%q,"status":%q%s}}`, code, message, status, d)
	}
}

func TestClassification(t *testing.T) {
	const (
		retry55   = `{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"55s"}`
		perMinute = `{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerMinutePerProjectPerModel-FreeTier"}]}`
		perDay    = `{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]}`
		keyBad    = `{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID","domain":"googleapis.com"}`
	)
	tests := []struct {
		name       string
		h          http.HandlerFunc
		kind       runtime.Kind
		status     int
		retryAfter time.Duration
		hint       runtime.Hint
		message    string
	}{
		{"429 per minute with RetryInfo", apiError(429, "RESOURCE_EXHAUSTED", "You exceeded your current quota, please check your plan and billing details.", perMinute, retry55),
			runtime.KindRateLimited, 429, 55 * time.Second, runtime.HintAfter, "You exceeded your current quota, please check your plan and billing details."},
		{"429 per day", apiError(429, "RESOURCE_EXHAUSTED", "Quota exceeded for metric", perDay, retry55),
			runtime.KindQuotaExhausted, 429, 55 * time.Second, runtime.HintAfter, "Quota exceeded for metric"},
		{"429 free tier limit 0", apiError(429, "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Generate Content API requests per minute', limit: 0"),
			runtime.KindQuotaExhausted, 429, 0, runtime.HintDefault, "Quota exceeded for quota metric 'Generate Content API requests per minute', limit: 0"},
		{"503 overloaded", apiError(503, "UNAVAILABLE", "The model is overloaded. Please try again later."),
			runtime.KindOverloaded, 503, 0, runtime.HintDefault, "The model is overloaded. Please try again later."},
		{"500 internal", apiError(500, "INTERNAL", "An internal error has occurred."), runtime.KindServerError, 500, 0, runtime.HintDefault, "An internal error has occurred."},
		{"504 deadline", apiError(504, "DEADLINE_EXCEEDED", "Deadline expired before operation could complete."), runtime.KindServerError, 504, 0, runtime.HintDefault, "Deadline expired before operation could complete."},
		{"400 input too long", apiError(400, "INVALID_ARGUMENT", "The input token count (3475108) exceeds the maximum number of tokens allowed (1048576)."),
			runtime.KindContextOverflow, 400, 0, runtime.HintDefault, "The input token count (3475108) exceeds the maximum number of tokens allowed (1048576)."},
		{"400 bad key", apiError(400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key.", keyBad), runtime.KindAuth, 400, 0, runtime.HintDefault, "API key not valid. Please pass a valid API key."},
		{"400 failed precondition", apiError(400, "FAILED_PRECONDITION", "User location is not supported for the API use."), runtime.KindAuth, 400, 0, runtime.HintDefault, "User location is not supported for the API use."},
		{"403 permission denied", apiError(403, "PERMISSION_DENIED", "Permission denied."), runtime.KindAuth, 403, 0, runtime.HintDefault, "Permission denied."},
		{"404 not found", apiError(404, "NOT_FOUND", "models/gemini-9 is not found for API version v1beta"), runtime.KindNotFound, 404, 0, runtime.HintDefault, "models/gemini-9 is not found for API version v1beta"},
		{"400 invalid", apiError(400, "INVALID_ARGUMENT", "Invalid JSON payload received."), runtime.KindInvalidRequest, 400, 0, runtime.HintDefault, "Invalid JSON payload received."},
		{"502 HTML from a proxy", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(502)
			io.WriteString(w, "<html><body>Bad Gateway</body></html>")
		}, runtime.KindServerError, 502, 7 * time.Second, runtime.HintAfter, "HTTP 502 Bad Gateway"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t, tt.h)
			_, err := drain(t, newProvider(t, f.URL), userRequest())
			var e *runtime.Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %T %v", err, err)
			}
			got := []any{e.Kind, e.StatusCode, e.RetryAfter, e.Hint, e.Message, e.Provider}
			want := []any{tt.kind, tt.status, tt.retryAfter, tt.hint, tt.message, "gem"}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("error %v (-want +got):\n%s", err, diff)
			}
			if n := f.requests.Load(); n != 1 {
				t.Errorf("%d HTTP requests for one call: the SDK retried", n)
			}
			if strings.Contains(err.Error(), testKey) {
				t.Errorf("error leaks the key: %v", err)
			}
		})
	}
}

func TestMidStreamErrors(t *testing.T) {
	tests := []struct {
		name string
		body string
	}{
		{"data frame (Gemini API)", fixture(t, "gemini_midstream_error.sse")},
		{"bare JSON line (Vertex)", `data: {"candidates": [{"content": {"parts": [{"text": "The weather"}],"role": "model"},"index": 0}]}` + "\n\n" +
			`{"error": {"code": 503,"message": "The model is overloaded. Please try again later.","status": "UNAVAILABLE"}}` + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t, func(w http.ResponseWriter, _ *http.Request) { sse(w, tt.body) })
			chunks, err := drain(t, newProvider(t, f.URL), userRequest())
			var text string
			for _, c := range chunks {
				text += c.Text
			}
			if text != "The weather" {
				t.Errorf("chunks before the error = %+v", chunks)
			}
			if tt.name == "data frame (Gemini API)" && (chunks[0].Kind != runtime.ChunkUsage || chunks[0].Usage.InputTokens != 83) {
				t.Errorf("the failed attempt's input tokens were not reported: %+v", chunks)
			}
			var e *runtime.Error
			if !errors.As(err, &e) || e.Kind != runtime.KindOverloaded || e.Message != "The model is overloaded. Please try again later." {
				t.Errorf("err = %v", err)
			}
		})
	}
}

func TestMissingFinish(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, _ *http.Request) {
		sse(w, `data: {"candidates":[{"content":{"parts":[{"text":"half"}]}}]}`+"\n\n")
	})
	_, err := drain(t, newProvider(t, f.URL), userRequest())
	var e *runtime.Error
	if !errors.As(err, &e) || e.Kind != runtime.KindStreamInterrupted {
		t.Errorf("err = %v, want stream interrupted", err)
	}
}

func TestNetworkFailures(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedURL := "http://" + closed.Addr().String()
	closed.Close()

	tests := []struct {
		name string
		url  func(t *testing.T) string
		kind runtime.Kind
	}{
		{"connection refused", func(*testing.T) string { return refusedURL }, runtime.KindNetwork},
		{"reset before headers", func(t *testing.T) string {
			return newFake(t, func(w http.ResponseWriter, _ *http.Request) {
				conn, _, err := w.(http.Hijacker).Hijack()
				if err != nil {
					return
				}
				conn.(*net.TCPConn).SetLinger(0)
				conn.Close()
			}).URL
		}, runtime.KindNetwork},
		{"body cut after output", func(t *testing.T) string {
			return newFake(t, func(w http.ResponseWriter, _ *http.Request) {
				sse(w, `data: {"candidates":[{"content":{"parts":[{"text":"par"}]}}]}`+"\n\n")
				panic(http.ErrAbortHandler)
			}).URL
		}, runtime.KindStreamInterrupted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := drain(t, newProvider(t, tt.url(t)), userRequest())
			var e *runtime.Error
			if !errors.As(err, &e) || e.Kind != tt.kind {
				t.Errorf("err = %v, want %v", err, tt.kind)
			}
		})
	}
}

func TestCancelMidStream(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		sse(w, `data: {"candidates":[{"content":{"parts":[{"text":"a"}]}}]}`+"\n\n")
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	p := newProvider(t, f.URL)
	ctx, cancel := contextWithCancel(t)
	var start time.Time
	for c, err := range p.Stream(ctx, userRequest()) {
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("err = %v before cancel", err)
			}
			break
		}
		if c.Kind == runtime.ChunkText {
			start = time.Now()
			cancel()
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("stream ended %v after cancel", d)
	}
}

func TestRequestMapping(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, _ *http.Request) {
		sse(w, `data: {"candidates":[{"content":{"parts":[{"text":"ok"}]},"finishReason":"STOP"}]}`+"\n\n")
	})
	temp := 0.3
	req := &runtime.Request{
		Model:           "gemini-2.5-flash",
		System:          "Be brief.",
		MaxOutputTokens: 256,
		Temperature:     &temp,
		StopSequences:   []string{"END"},
		Tools:           []runtime.ToolSpec{{Name: "getWeather", Description: "Weather by city", Schema: json.RawMessage(`{"type":"object","properties":{"location":{"type":"string"}}}`)}},
		Messages: []runtime.Message{
			{Role: runtime.RoleUser, Parts: []runtime.Part{runtime.TextPart("weather in Tokyo and Oslo?")}},
			{Role: runtime.RoleAssistant, Parts: []runtime.Part{
				{Kind: runtime.PartThinking, Text: "two cities", Signature: encodeSignature([]byte("sig-thought"))},
				{Kind: runtime.PartThinking, Signature: encodeSignature([]byte("sig-call"))},
				{Kind: runtime.PartToolCall, ToolCall: &runtime.ToolCall{ID: "c1", Name: "getWeather", Arguments: `{"location":"Tokyo"}`}},
				{Kind: runtime.PartToolCall, ToolCall: &runtime.ToolCall{ID: "c2", Name: "getWeather", Arguments: `{"location":"Oslo"}`}},
			}},
			{Role: runtime.RoleTool, Parts: []runtime.Part{
				{Kind: runtime.PartToolResult, ToolResult: &runtime.ToolResult{CallID: "c1", Content: "sunny"}},
				{Kind: runtime.PartToolResult, ToolResult: &runtime.ToolResult{CallID: "c2", Name: "getWeather", Content: "no such city", IsError: true}},
			}},
		},
	}
	if _, err := drain(t, newProvider(t, f.URL), req); err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	if err := json.Unmarshal(f.lastBody.Load().([]byte), &body); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"contents": []any{
			map[string]any{"role": "user", "parts": []any{map[string]any{"text": "weather in Tokyo and Oslo?"}}},
			map[string]any{"role": "model", "parts": []any{
				map[string]any{"text": "two cities", "thought": true, "thoughtSignature": encodeSignature([]byte("sig-thought"))},
				map[string]any{"functionCall": map[string]any{"id": "c1", "name": "getWeather", "args": map[string]any{"location": "Tokyo"}}, "thoughtSignature": encodeSignature([]byte("sig-call"))},
				map[string]any{"functionCall": map[string]any{"id": "c2", "name": "getWeather", "args": map[string]any{"location": "Oslo"}}},
			}},
			map[string]any{"role": "user", "parts": []any{
				map[string]any{"functionResponse": map[string]any{"id": "c1", "name": "getWeather", "response": map[string]any{"output": "sunny"}}},
				map[string]any{"functionResponse": map[string]any{"id": "c2", "name": "getWeather", "response": map[string]any{"error": "no such city"}}},
			}},
		},
		"systemInstruction": map[string]any{"parts": []any{map[string]any{"text": "Be brief."}}, "role": "user"},
		"generationConfig":  map[string]any{"maxOutputTokens": float64(256), "temperature": 0.3, "stopSequences": []any{"END"}},
		"tools": []any{map[string]any{"functionDeclarations": []any{map[string]any{
			"name": "getWeather", "description": "Weather by city",
			"parametersJsonSchema": map[string]any{"type": "object", "properties": map[string]any{"location": map[string]any{"type": "string"}}},
		}}}},
	}
	opts := cmp.Options{cmp.Comparer(func(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 })}
	if diff := cmp.Diff(want, body, opts); diff != "" {
		t.Errorf("request body (-want +got):\n%s", diff)
	}
}

func TestNewRequiresKey(t *testing.T) {
	t.Setenv("GEMINI_API_KEY", "from-env-should-be-ignored")
	if _, err := New(Config{}); err == nil {
		t.Error("New without an API key succeeded")
	}
}

func contextWithCancel(t *testing.T) (ctx context.Context, cancel context.CancelFunc) {
	return context.WithCancel(t.Context())
}
