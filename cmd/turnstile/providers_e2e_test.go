package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/turnstile-dev/turnstile/config"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
)

// upstream is a fake provider API that answers each call with the next
// scripted SSE body (the last one repeats) and records request bodies.
type upstream struct {
	*httptest.Server
	mu     sync.Mutex
	bodies []string
}

func newUpstream(t *testing.T, replies ...string) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		n := len(u.bodies)
		u.bodies = append(u.bodies, string(b))
		u.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		for _, event := range strings.SplitAfter(replies[min(n, len(replies)-1)], "\n\n") {
			io.WriteString(w, event)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) requests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.bodies...)
}

func readFixture(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// providerCase is one real provider adapter behind a fake API.
type providerCase struct {
	typ, model, keyEnv string
	// toolCall answers with a call of current_time {"zone":"UTC"}.
	toolCall string
	// answer answers with text.
	answer string
	// midStream streams some text, then fails inside the stream with an
	// overloaded error.
	midStream string
	// sawToolResult reports whether a request body carries the tool result.
	sawToolResult func(body string) bool
}

func providerCases(t *testing.T) []providerCase {
	return []providerCase{{
		typ: "gemini", model: "gemini-2.5-flash", keyEnv: "TEST_GEMINI_KEY",
		toolCall:  `data: {"candidates":[{"content":{"parts":[{"functionCall":{"name":"current_time","args":{"zone":"UTC"}},"thoughtSignature":"c2lnbmF0dXJl"}],"role":"model"},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":20,"candidatesTokenCount":5}}` + "\n\n",
		answer:    `data: {"candidates":[{"content":{"parts":[{"text":"It is late."}],"role":"model"},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":30,"candidatesTokenCount":4}}` + "\n\n",
		midStream: readFixture(t, "../../providers/gemini/testdata/gemini_midstream_error.sse"),
		sawToolResult: func(b string) bool {
			return strings.Contains(b, `"functionResponse"`) && strings.Contains(b, `"thoughtSignature":"c2lnbmF0dXJl"`)
		},
	}}
}

func providerYAML(pc providerCase, url string) string {
	return fmt.Sprintf(`
providers:
  up: {type: %s, base_url: %s, api_key_env: %s}
models:
  m: {provider: up, model: %s, retry: {initial_backoff: 1ms, max_backoff: 2ms}}
`, pc.typ, url, pc.keyEnv, pc.model)
}

// TestProvidersThroughServer runs a turn with a server-side tool call and a
// turn that fails mid-stream through each real adapter and the real gRPC
// server, against a fake API speaking the provider's wire format.
func TestProvidersThroughServer(t *testing.T) {
	for _, pc := range providerCases(t) {
		t.Run(pc.typ+"/tool call", func(t *testing.T) {
			t.Setenv(pc.keyEnv, "test-key-0123456789")
			up := newUpstream(t, pc.toolCall, pc.answer)
			w := serveYAML(t, providerYAML(pc, up.URL))
			evs, st := wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("what time is it?")}, nil)
			if st.Code() != codes.OK {
				t.Fatalf("status %v", st)
			}
			want := "TurnStarted LlmCallStarted ThinkingDelta ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted ToolFinished MessageCompleted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
			if got := wiretest.Names(evs); got != want {
				t.Errorf("events:\n got %s\nwant %s", got, want)
			}
			reqs := up.requests()
			if len(reqs) != 2 || !pc.sawToolResult(reqs[1]) {
				t.Errorf("second request does not carry the tool result: %v", reqs)
			}
		})
		t.Run(pc.typ+"/mid-stream failure", func(t *testing.T) {
			t.Setenv(pc.keyEnv, "test-key-0123456789")
			up := newUpstream(t, pc.midStream, pc.answer)
			w := serveYAML(t, providerYAML(pc, up.URL))
			evs, st := wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("weather?")}, nil)
			if st.Code() != codes.OK {
				t.Fatalf("status %v", st)
			}
			want := "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage Retry LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
			if got := wiretest.Names(evs); got != want {
				t.Errorf("events:\n got %s\nwant %s", got, want)
			}
			for _, ev := range evs {
				if r := ev.GetRetry(); r != nil && (!r.GetDiscardPartial() || r.GetReason() != turnstilev1.ErrorCode_ERROR_CODE_OVERLOADED) {
					t.Errorf("retry = %v, want OVERLOADED with discard_partial", r)
				}
			}
			if got := evs[len(evs)-1].GetTurnCompleted().GetMessages()[0].GetParts()[0].GetText(); got != "It is late." {
				t.Errorf("committed %q: the failed attempt's text leaked in", got)
			}
		})
	}
}

func TestProviderKeyMissing(t *testing.T) {
	for _, pc := range providerCases(t) {
		t.Run(pc.typ, func(t *testing.T) {
			t.Setenv(pc.keyEnv, "")
			_, err := newProvider("up", configProvider(pc, "http://127.0.0.1:1"))
			if err == nil || !strings.Contains(err.Error(), pc.keyEnv) {
				t.Errorf("err = %v, want it to name %s", err, pc.keyEnv)
			}
		})
	}
}

func configProvider(pc providerCase, url string) config.Provider {
	return config.Provider{Type: pc.typ, BaseURL: url, APIKeyEnv: pc.keyEnv}
}
