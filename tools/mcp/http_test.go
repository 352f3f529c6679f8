package mcp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/tools/mcp"
)

// testHTTP is an in-process MCP server over streamable HTTP.
type testHTTP struct {
	*httptest.Server
	// calls counts the tool calls that reached a handler.
	calls atomic.Int32
	// down makes the server answer 404 to everything while set.
	down atomic.Bool
	// restart makes the server forget its sessions.
	restart func()
}

// httpServer serves an in-process MCP server over streamable HTTP on
// 127.0.0.1. Requests without the header X-Token: secret are refused.
func httpServer(t *testing.T) *testHTTP {
	t.Helper()
	th := &testHTTP{}
	calls := &th.calls
	s := sdk.NewServer(&sdk.Implementation{Name: "httptest", Version: "1"}, nil)
	s.AddTool(&sdk.Tool{
		Name:        "count",
		Description: "Counts to three.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"label":{"type":"string"}},"required":["label"]}`),
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true},
	}, func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		calls.Add(1)
		var in struct{ Label string }
		_ = json.Unmarshal(req.Params.Arguments, &in)
		if token := req.Params.GetProgressToken(); token != nil {
			for i := 1; i <= 3; i++ {
				_ = req.Session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{
					ProgressToken: token, Message: fmt.Sprintf("%s %d", in.Label, i), Progress: float64(i), Total: 3,
				})
			}
			_ = req.Session.Ping(ctx, nil) // see testdata/testserver
		}
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "counted " + in.Label}}}, nil
	})
	s.AddTool(&sdk.Tool{Name: "broken", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			calls.Add(1)
			return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: "no"}}}, nil
		})
	var handler atomic.Pointer[sdk.StreamableHTTPHandler]
	// restart replaces the handler, as a restarted server would: it knows
	// none of the old sessions.
	restart := func() {
		for ss := range s.Sessions() {
			_ = ss.Close()
		}
		handler.Store(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, nil))
	}
	restart()
	th.restart = restart
	th.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if th.down.Load() {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("X-Token") != "secret" {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		handler.Load().ServeHTTP(w, r)
	}))
	t.Cleanup(th.Close)
	return th
}

func TestStreamableHTTP(t *testing.T) {
	srv := httpServer(t)

	t.Setenv("TEST_MCP_TOKEN", "secret")
	ts := newToolset(t, mcp.ServerConfig{
		Name:           "remote",
		URL:            srv.URL,
		HeadersFromEnv: map[string]string{"X-Token": "TEST_MCP_TOKEN"},
		Headers:        map[string]string{"X-Other": "1"},
	})
	if got := names(ts.Tools()); !cmp.Equal(got, []string{"broken", "count"}) {
		t.Fatalf("Tools() = %v", got)
	}
	count := toolNamed(t, ts, "count")
	if s := count.Spec(); !s.ReadOnly || !s.Idempotent || s.Description != "Counts to three." {
		t.Errorf("count spec = %+v", s)
	}

	var (
		mu  sync.Mutex
		got []llm.ToolProgress
	)
	out, err := count.Call(t.Context(), llm.ToolCall{Arguments: `{"label":"x"}`}, func(p llm.ToolProgress) {
		mu.Lock()
		got = append(got, p)
		mu.Unlock()
	})
	if err != nil || !cmp.Equal(out, llm.ToolOutput{Content: "counted x"}) {
		t.Fatalf("count() = %+v, %v", out, err)
	}
	mu.Lock()
	want := []llm.ToolProgress{
		{Message: "x 1", Progress: 1, Total: 3},
		{Message: "x 2", Progress: 2, Total: 3},
		{Message: "x 3", Progress: 3, Total: 3},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("progress mismatch (-want +got):\n%s", diff)
	}
	mu.Unlock()

	if out := call(t, toolNamed(t, ts, "broken"), `{}`); !cmp.Equal(out, llm.ToolOutput{Content: "no", IsError: true}) {
		t.Errorf("broken() = %+v, want an error result", out)
	}
	if n := srv.calls.Load(); n != 2 {
		t.Errorf("server handled %d calls, want 2", n)
	}
}

func TestStreamableHTTPHeadersRequired(t *testing.T) {
	srv := httpServer(t)
	ts, err := mcp.New(t.Context(), []mcp.ServerConfig{{Name: "remote", URL: srv.URL}})
	if err == nil {
		ts.Close()
		t.Fatal("New without the token succeeded, want an error")
	}
	if !strings.Contains(err.Error(), `server "remote"`) {
		t.Errorf("New error = %v, want it to name the server", err)
	}
}

func TestStreamableHTTPReconnect(t *testing.T) {
	srv := httpServer(t)
	ts := newToolset(t, mcp.ServerConfig{Name: "remote", URL: srv.URL, Headers: map[string]string{"X-Token": "secret"}})
	count := toolNamed(t, ts, "count")
	if out := call(t, count, `{"label":"a"}`); out.Content != "counted a" {
		t.Fatalf("count() = %+v", out)
	}
	srv.restart()
	_, err := count.Call(t.Context(), llm.ToolCall{Arguments: `{"label":"b"}`}, nil)
	if err == nil || !strings.Contains(err.Error(), `mcp server "remote"`) {
		t.Fatalf("count() after restart = %v, want an error naming the server", err)
	}
	t.Logf("error: %v", err)
	if out := call(t, count, `{"label":"c"}`); out.Content != "counted c" {
		t.Fatalf("count() after reconnect = %+v", out)
	}
	if n := srv.calls.Load(); n != 2 {
		t.Errorf("server handled %d calls, want 2", n)
	}
}

func TestReconnectBackoff(t *testing.T) {
	srv := httpServer(t)
	ts := newToolset(t, mcp.ServerConfig{Name: "remote", URL: srv.URL, Headers: map[string]string{"X-Token": "secret"}})
	count := toolNamed(t, ts, "count")
	srv.restart()
	srv.down.Store(true)
	try := func() error {
		_, err := count.Call(t.Context(), llm.ToolCall{Arguments: `{"label":"x"}`}, nil)
		return err
	}
	if err := try(); err == nil || !strings.Contains(err.Error(), "reconnected on the next call") {
		t.Fatalf("first call after the restart = %v, want the session lost", err)
	}
	if err := try(); err == nil || !strings.Contains(err.Error(), "reconnecting failed after 3 attempts") {
		t.Fatalf("call while down = %v, want reconnecting to fail after 3 attempts", err)
	}
	if err := try(); err == nil || !strings.Contains(err.Error(), "unavailable (retrying in") {
		t.Fatalf("call during the cool-down = %v, want it to fail at once", err)
	}
	srv.down.Store(false)
	// The cool-down after one failed round is twice the backoff (40ms).
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := try()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing after the server came back: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestURLNotInErrors(t *testing.T) {
	srv := httpServer(t)
	secretURL := srv.URL + "/mcp?token=topsecret"
	srv.Close() // nothing listens there any more
	ts, err := mcp.New(t.Context(), []mcp.ServerConfig{{Name: "remote", URL: secretURL}})
	if err == nil {
		ts.Close()
		t.Fatal("New succeeded, want an error")
	}
	if strings.Contains(err.Error(), "topsecret") || !strings.Contains(err.Error(), `server "remote"`) {
		t.Errorf("New error = %q, want it to name the server and not show the URL", err)
	}
	t.Logf("error: %v", err)
}

// TestURLSecrets: a URL's user, password and query reach the server, on
// every request, but no error text, whatever library formats it: the
// SDK and net/http only ever see the URL without them.
func TestURLSecrets(t *testing.T) {
	srv := httpServer(t)
	var seen atomic.Int32
	var leaked atomic.Bool
	gate := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, pw, _ := r.BasicAuth()
		if user != "mcpuser" || pw != "pw-planted-1234" || r.URL.Query().Get("token") != "q-planted-5678" {
			leaked.Store(true)
			http.Error(w, "who are you", http.StatusUnauthorized)
			return
		}
		seen.Add(1)
		r.Header.Set("X-Token", "secret")
		proxy(srv.URL, w, r)
	}))
	t.Cleanup(gate.Close)
	secretURL := strings.Replace(gate.URL, "http://", "http://mcpuser:pw-planted-1234@", 1) + "/mcp?token=q-planted-5678"
	ts := newToolset(t, mcp.ServerConfig{Name: "remote", URL: secretURL, Headers: map[string]string{"X-Api-Key": "hdr-planted-9999"}})
	if out := call(t, toolNamed(t, ts, "count"), `{"label":"y"}`); out.Content != "counted y" {
		t.Fatalf("count() = %+v", out)
	}
	if leaked.Load() || seen.Load() < 2 {
		t.Errorf("requests without the URL's credentials and query: %v; with: %d", leaked.Load(), seen.Load())
	}
	gate.Close()
	srv.restart() // forget the session: the next call reconnects, to nothing
	_, err := toolNamed(t, ts, "count").Call(t.Context(), llm.ToolCall{Arguments: `{"label":"z"}`}, nil)
	if err == nil {
		t.Fatal("a call to a closed server succeeded")
	}
	for _, secret := range []string{"pw-planted-1234", "q-planted-5678", "hdr-planted-9999", "token="} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("error %q holds %q", err, secret)
		}
	}
	t.Logf("error: %v", err)
}

// proxy forwards r to base.
func proxy(base string, w http.ResponseWriter, r *http.Request) {
	req, err := http.NewRequestWithContext(r.Context(), r.Method, base+r.URL.Path, r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	req.Header = r.Header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			_, _ = w.Write(buf[:n])
			w.(http.Flusher).Flush()
		}
		if err != nil {
			return
		}
	}
}
