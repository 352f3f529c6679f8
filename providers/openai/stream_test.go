package openai

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/net/http2"

	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
	"github.com/turnstile-dev/turnstile/runtime"
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
	want := []runtime.Chunk{
		{Kind: runtime.ChunkToolCallStart, Index: 0, CallID: "call_2Uzw0AEZQeOex2CP2TKjcLKc", Name: "get_weather"},
		{Kind: runtime.ChunkToolCallArgs, Index: 0, Text: `{"location":"`},
		{Kind: runtime.ChunkToolCallArgs, Index: 0, Text: `San Francisco, CA"}`},
		{Kind: runtime.ChunkToolCallEnd, Index: 0},
		{Kind: runtime.ChunkUsage, Usage: runtime.Usage{InputTokens: 61, OutputTokens: 16}},
		{Kind: runtime.ChunkStop, Stop: runtime.StopToolUse},
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
	tests := []struct {
		name    string
		body    string
		want    []runtime.Chunk
		wantErr runtime.Kind
	}{
		{
			name: "text, cached usage, stop",
			body: chunkLine(`{"role":"assistant","content":"Hel"}`, "") + chunkLine(`{"content":"lo"}`, "") +
				chunkLine(`{}`, "stop") +
				`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":5,"total_tokens":105,"prompt_tokens_details":{"cached_tokens":80}}}` + "\n\n" +
				"data: [DONE]\n\n",
			want: []runtime.Chunk{
				{Kind: runtime.ChunkText, Text: "Hel"}, {Kind: runtime.ChunkText, Text: "lo"},
				{Kind: runtime.ChunkUsage, Usage: runtime.Usage{InputTokens: 20, OutputTokens: 5, CacheReadTokens: 80}},
				{Kind: runtime.ChunkStop, Stop: runtime.StopEndTurn},
			},
		},
		{
			name: "reasoning of compatible servers, length",
			body: chunkLine(`{"reasoning_content":"think"}`, "") + chunkLine(`{"reasoning":"more"}`, "") +
				chunkLine(`{"content":"x"}`, "length") + "data: [DONE]\n\n",
			want: []runtime.Chunk{
				{Kind: runtime.ChunkThinking, Text: "think"}, {Kind: runtime.ChunkThinking, Text: "more"},
				{Kind: runtime.ChunkText, Text: "x"}, {Kind: runtime.ChunkStop, Stop: runtime.StopMaxTokens},
			},
		},
		{
			name: "parallel tool calls, whole and fragmented, stop after calls",
			body: chunkLine(`{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\":"}}]}`, "") +
				chunkLine(`{"tool_calls":[{"index":1,"id":"b","type":"function","function":{"name":"g","arguments":"{}"}}]}`, "") +
				chunkLine(`{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}`, "") +
				chunkLine(`{"tool_calls":[{"index":2,"id":"c","type":"function","function":{"name":"h"}}]}`, "") +
				chunkLine(`{}`, "stop") + "data: [DONE]\n\n",
			want: []runtime.Chunk{
				{Kind: runtime.ChunkToolCallStart, Index: 0, CallID: "a", Name: "f"},
				{Kind: runtime.ChunkToolCallArgs, Index: 0, Text: `{"x":`},
				{Kind: runtime.ChunkToolCallStart, Index: 1, CallID: "b", Name: "g"},
				{Kind: runtime.ChunkToolCallArgs, Index: 1, Text: `{}`},
				{Kind: runtime.ChunkToolCallArgs, Index: 0, Text: `1}`},
				{Kind: runtime.ChunkToolCallStart, Index: 2, CallID: "c", Name: "h"},
				{Kind: runtime.ChunkToolCallEnd, Index: 0},
				{Kind: runtime.ChunkToolCallEnd, Index: 1},
				{Kind: runtime.ChunkToolCallArgs, Index: 2, Text: `{}`},
				{Kind: runtime.ChunkToolCallEnd, Index: 2},
				{Kind: runtime.ChunkStop, Stop: runtime.StopToolUse},
			},
		},
		{
			name: "refusal",
			body: chunkLine(`{"refusal":"I can't"}`, "") + chunkLine(`{"refusal":" help."}`, "") + chunkLine(`{}`, "stop") + "data: [DONE]\n\n",
			want: []runtime.Chunk{
				{Kind: runtime.ChunkText, Text: "I can't"}, {Kind: runtime.ChunkText, Text: " help."},
				{Kind: runtime.ChunkStop, Stop: runtime.StopRefusal},
			},
		},
		{
			name: "content filter",
			body: chunkLine(`{"content":"I"}`, "content_filter") + "data: [DONE]\n\n",
			want: []runtime.Chunk{{Kind: runtime.ChunkText, Text: "I"}, {Kind: runtime.ChunkStop, Stop: runtime.StopRefusal}},
		},
		{
			name: "invalid tool arguments",
			body: chunkLine(`{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\":"}}]}`, "tool_calls") +
				"data: [DONE]\n\n",
			want: []runtime.Chunk{
				{Kind: runtime.ChunkToolCallStart, Index: 0, CallID: "a", Name: "f"},
				{Kind: runtime.ChunkToolCallArgs, Index: 0, Text: `{"x":`},
			},
			wantErr: runtime.KindServerError,
		},
		{
			name: "arguments that are not an object",
			body: chunkLine(`{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":"[1]"}}]}`, "tool_calls") +
				"data: [DONE]\n\n",
			want: []runtime.Chunk{
				{Kind: runtime.ChunkToolCallStart, Index: 0, CallID: "a", Name: "f"},
				{Kind: runtime.ChunkToolCallArgs, Index: 0, Text: `[1]`},
			},
			wantErr: runtime.KindServerError,
		},
		{
			name:    "missing finish after output",
			body:    chunkLine(`{"content":"Hel"}`, "") + "data: [DONE]\n\n",
			want:    []runtime.Chunk{{Kind: runtime.ChunkText, Text: "Hel"}},
			wantErr: runtime.KindStreamInterrupted,
		},
		{
			name:    "missing finish, connection closed without [DONE]",
			body:    chunkLine(`{"role":"assistant"}`, ""),
			wantErr: runtime.KindServerError,
		},
		{
			name:    "empty body",
			body:    "",
			wantErr: runtime.KindServerError,
		},
		{
			// Old llama.cpp: the SDK drops an "error:" line and sees [DONE].
			name:    "old llama.cpp error frame",
			body:    `error: {"code":500,"message":"slot unavailable","type":"server_error"}` + "\n\n" + "data: [DONE]\n\n",
			wantErr: runtime.KindServerError,
		},
		{
			name:    "malformed event",
			body:    "data: {not json\n\n",
			wantErr: runtime.KindServerError,
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
				if e.Kind != tt.wantErr || e.Provider != "oa" || e.Message == "" {
					t.Errorf("error = %+v, want kind %v", e, tt.wantErr)
				}
			}
		})
	}
}

func TestMidStreamError(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "openai_midstream_error.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-request-id", "req_mid")
		providertest.WriteSSE(w, body)
	})
	chunks, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
	if diff := cmp.Diff([]runtime.Chunk{{Kind: runtime.ChunkText, Text: "Let me"}}, chunks); diff != "" {
		t.Errorf("chunks (-want +got):\n%s", diff)
	}
	e := providertest.AsError(t, err)
	want := &runtime.Error{
		Kind:       runtime.KindServerError,
		Message:    "The server had an error while processing your request. Sorry about that!",
		Provider:   "oa",
		StatusCode: 200,
		RequestID:  "req_mid",
	}
	if diff := cmp.Diff(want, e, cmpError); diff != "" {
		t.Errorf("error (-want +got):\n%s", diff)
	}
	if n := f.Requests(); n != 1 {
		t.Errorf("requests = %d, want 1", n)
	}
}

var cmpError = cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Err" }, cmp.Ignore())

func TestMidStreamErrorByCode(t *testing.T) {
	t.Parallel()
	body := chunkLine(`{"content":"a"}`, "") +
		`data: {"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}` + "\n\n"
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	_, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
	if e := providertest.AsError(t, err); e.Kind != runtime.KindRateLimited || e.Message != "Rate limit reached" {
		t.Errorf("error = %+v, want RATE_LIMITED", e)
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
		p, err := New(Config{Name: "oa", BaseURL: "http://" + addr + "/v1", APIKey: testKey, HTTPClient: &http.Client{}})
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
	t.Run("reset mid-body", func(t *testing.T) {
		t.Parallel()
		f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				panic(err)
			}
			buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + chunkLine(`{"content":"partial"}`, ""))
			buf.Flush()
			time.Sleep(50 * time.Millisecond)
			conn.(*net.TCPConn).SetLinger(0)
			conn.Close()
		})
		chunks, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
		if len(chunks) != 1 {
			t.Errorf("chunks = %+v, want the partial text", chunks)
		}
		if e := providertest.AsError(t, err); e.Kind != runtime.KindNetwork {
			t.Errorf("error = %+v, want NETWORK", e)
		}
	})
	t.Run("body cut short", func(t *testing.T) {
		t.Parallel()
		f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
			providertest.WriteSSE(w, chunkLine(`{"content":"partial"}`, ""))
			panic(http.ErrAbortHandler)
		})
		_, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
		if e := providertest.AsError(t, err); e.Kind != runtime.KindNetwork {
			t.Errorf("error = %+v, want NETWORK", e)
		}
		if n := f.Requests(); n != 1 {
			t.Errorf("requests = %d, want 1", n)
		}
	})
	t.Run("HTTP/2 RST_STREAM mid-body", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body)
			providertest.WriteSSE(w, chunkLine(`{"content":"partial"}`, ""))
			panic(http.ErrAbortHandler) // HTTP/2: RST_STREAM INTERNAL_ERROR
		}))
		srv.EnableHTTP2 = true
		srv.StartTLS()
		defer srv.Close()
		client := srv.Client()
		defer client.CloseIdleConnections()
		p, err := New(Config{Name: "oa", BaseURL: srv.URL + "/v1", HTTPClient: client})
		if err != nil {
			t.Fatal(err)
		}
		chunks, err := providertest.Collect(t, t.Context(), p, simpleRequest)
		if len(chunks) != 1 {
			t.Errorf("chunks = %+v, want the partial text", chunks)
		}
		e := providertest.AsError(t, err)
		var se http2.StreamError
		if e.Kind != runtime.KindNetwork || !errors.As(e, &se) {
			t.Errorf("error = %+v (%v), want NETWORK from an HTTP/2 stream error", e, e.Err)
		}
	})
	t.Run("client timeout", func(t *testing.T) {
		t.Parallel()
		release := make(chan struct{})
		f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		})
		defer close(release)
		p, err := New(Config{Name: "oa", BaseURL: f.URL + "/v1", HTTPClient: &http.Client{Timeout: 50 * time.Millisecond}})
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
		providertest.WriteSSE(w, chunkLine(`{"content":"first"}`, ""))
		<-r.Context().Done()
	})
	p := provider(t, f)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	start := time.Now()
	var got error
	for c, err := range p.Stream(ctx, simpleRequest) {
		if err != nil {
			got = err
			break
		}
		if c.Kind == runtime.ChunkText {
			cancel()
		}
	}
	if !errors.Is(got, context.Canceled) {
		t.Errorf("error = %v, want context.Canceled", got)
	}
	if runtime.KindOf(got) != runtime.KindCancelled {
		t.Errorf("KindOf = %v, want CANCELLED", runtime.KindOf(got))
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Stream took %v to stop after cancel", d)
	}
}

func TestCallerDeadlineWinsOverTimeout(t *testing.T) {
	t.Parallel()
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err := providertest.Collect(t, ctx, provider(t, f), simpleRequest)
	if !errors.Is(err, context.DeadlineExceeded) || runtime.KindOf(err) != runtime.KindDeadlineExceeded {
		t.Errorf("error = %v, want the caller's deadline", err)
	}
}

func TestStopEarly(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "openai_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	for c, err := range provider(t, f).Stream(t.Context(), simpleRequest) {
		if err != nil || c.Kind != runtime.ChunkToolCallStart {
			t.Fatalf("first = %+v, %v", c, err)
		}
		break
	}
}
