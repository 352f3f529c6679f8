package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/telemetry"
)

func runner(t *testing.T, p llm.Provider, tools ...llm.Tool) *runtime.Runner {
	t.Helper()
	retry := policy.DefaultRetry()
	retry.InitialBackoff, retry.MaxBackoff = time.Millisecond, 2*time.Millisecond
	r, err := runtime.New([]*runtime.Model{{Alias: "sim", ProviderName: "fake", Provider: p, ID: "fake-1", Retry: retry}}, "sim", tools)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func hello() *turnstilev1.RunTurnRequest {
	return &turnstilev1.RunTurnRequest{
		TurnId:   "turn-1",
		Messages: []*turnstilev1.Message{{Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "hello"}}}}},
	}
}

func TestTurnsOverGRPC(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		replies []fake.Reply
		tools   []llm.Tool
		req     func() *turnstilev1.RunTurnRequest
		want    string
		code    codes.Code
		reason  turnstilev1.EndReason
	}{
		{
			name:    "plain turn",
			replies: []fake.Reply{{Chunks: fake.Text("Hello there")}},
			req:     hello,
			want:    "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted",
			reason:  turnstilev1.EndReason_END_REASON_END_TURN,
		},
		{
			name:    "server-side tool",
			replies: []fake.Reply{{Chunks: fake.Call("c1", "lookup", `{"q":"x"}`)}, {Chunks: fake.Text("It is 42")}},
			tools:   []llm.Tool{fake.NewTool("lookup", nil)},
			req:     hello,
			want:    "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted ToolFinished MessageCompleted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted",
			reason:  turnstilev1.EndReason_END_REASON_END_TURN,
		},
		{
			name:    "client-declared tool",
			replies: []fake.Reply{{Chunks: fake.Call("c1", "ask_user", `{}`)}},
			req: func() *turnstilev1.RunTurnRequest {
				r := hello()
				r.Tools = []*turnstilev1.ToolDefinition{{Name: "ask_user", Description: "asks"}}
				return r
			},
			want:   "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted TurnCompleted",
			reason: turnstilev1.EndReason_END_REASON_TOOL_CALLS_REQUIRED,
		},
		{
			name:    "panic in a tool",
			replies: []fake.Reply{{Chunks: fake.Call("c1", "boom", `{}`)}},
			tools: []llm.Tool{fake.NewTool("boom", func(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error) {
				panic("kaboom")
			})},
			req:  hello,
			want: "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted Error",
			code: codes.Internal,
		},
		{
			name:    "provider auth failure",
			replies: []fake.Reply{{Err: &llm.Error{Kind: llm.KindAuth, Message: "invalid x-api-key"}}},
			req:     hello,
			want:    "TurnStarted LlmCallStarted LlmCallFinished Error",
			code:    codes.FailedPrecondition,
		},
		{
			name:    "overloaded until retries run out",
			replies: []fake.Reply{{Err: &llm.Error{Kind: llm.KindOverloaded, Message: "Overloaded"}}},
			req:     hello,
			want:    "TurnStarted LlmCallStarted LlmCallFinished Retry LlmCallStarted LlmCallFinished Retry LlmCallStarted LlmCallFinished Error",
			code:    codes.Unavailable,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ts := start(t, runner(t, fake.NewProvider(tt.replies...), tt.tools...), server.Options{})
			evs, st := wiretest.Collect(t, t.Context(), ts.client, tt.req(), nil)
			if got := wiretest.Names(evs); got != tt.want {
				t.Errorf("events:\n got %s\nwant %s", got, tt.want)
			}
			if st.Code() != tt.code {
				t.Errorf("status = %v, want %v", st, tt.code)
			}
			last := evs[len(evs)-1]
			if tt.code == codes.OK {
				if got := last.GetTurnCompleted().GetEndReason(); got != tt.reason {
					t.Errorf("end reason = %v, want %v", got, tt.reason)
				}
				return
			}
			assertStatusMatchesEvent(t, st, last.GetError())
		})
	}
}

// assertStatusMatchesEvent checks the status carries ErrorInfo (reason =
// the event's code) always and RetryInfo exactly when retryable.
func assertStatusMatchesEvent(t *testing.T, st *status.Status, e *turnstilev1.Error) {
	t.Helper()
	if e == nil {
		t.Fatal("last event is not an error")
	}
	if st.Message() != e.GetMessage() {
		t.Errorf("status message %q, event message %q", st.Message(), e.GetMessage())
	}
	var info *errdetails.ErrorInfo
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			retry = d
		}
	}
	if want := strings.TrimPrefix(e.GetCode().String(), "ERROR_CODE_"); info == nil || info.GetReason() != want || info.GetDomain() != "turnstile" {
		t.Errorf("ErrorInfo = %v, want reason %s", info, want)
	}
	if (retry != nil) != e.GetRetryable() {
		t.Errorf("RetryInfo = %v with retryable = %v", retry, e.GetRetryable())
	}
	if e.Retryable == nil {
		t.Error("terminal error gives no retry advice")
	}
}

func TestInvalidRequests(t *testing.T) {
	t.Parallel()
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("x")})), server.Options{})
	user := func(parts ...*turnstilev1.Part) *turnstilev1.Message {
		return &turnstilev1.Message{Role: turnstilev1.Role_ROLE_USER, Parts: parts}
	}
	text := &turnstilev1.Part{Kind: &turnstilev1.Part_Text{Text: "hi"}}
	neg := int32(-1)
	hot := 3.0
	tests := []struct {
		name  string
		req   *turnstilev1.RunTurnRequest
		field string
	}{
		{"no messages", &turnstilev1.RunTurnRequest{}, "messages"},
		{"no role", &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{{Parts: []*turnstilev1.Part{text}}}}, "messages[0].role"},
		{"empty part", &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{user(&turnstilev1.Part{})}}, "messages[0].parts[0]"},
		{"no parts", &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{user()}}, "messages[0].parts"},
		{"tool call without id", &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{user(text), {Role: turnstilev1.Role_ROLE_ASSISTANT, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_ToolCall{ToolCall: &turnstilev1.ToolCall{Name: "x"}}}}}}}, "messages[1].parts[0].tool_call.id"},
		{"unknown model", &turnstilev1.RunTurnRequest{Model: "gpt-9", Messages: []*turnstilev1.Message{user(text)}}, "model"},
		{"bad tool name", &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{user(text)}, Tools: []*turnstilev1.ToolDefinition{{Name: "has space"}}}, "tools[0].name"},
		{"negative max tokens", &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{user(text)}, Generation: &turnstilev1.GenerationOptions{MaxOutputTokens: &neg}}, "generation.max_output_tokens"},
		{"temperature too high", &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{user(text)}, Generation: &turnstilev1.GenerationOptions{Temperature: &hot}}, "generation.temperature"},
		{"limit out of range", &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{user(text)}, Limits: &turnstilev1.TurnLimits{MaxModelCalls: &neg}}, "limits.max_model_calls"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs, st := wiretest.Collect(t, t.Context(), ts.client, tt.req, nil)
			if len(evs) != 0 {
				t.Errorf("got %d events before the error", len(evs))
			}
			if st.Code() != codes.InvalidArgument {
				t.Fatalf("status = %v", st)
			}
			var field string
			var reason string
			for _, d := range st.Details() {
				switch d := d.(type) {
				case *errdetails.BadRequest:
					field = d.GetFieldViolations()[0].GetField()
				case *errdetails.ErrorInfo:
					reason = d.GetReason()
				}
			}
			if field != tt.field || reason != "INVALID_REQUEST" || !strings.HasPrefix(st.Message(), tt.field+": ") {
				t.Errorf("status %q, field %q, reason %q; want field %q", st.Message(), field, reason, tt.field)
			}
		})
	}
}

func TestClientCancelMidStream(t *testing.T) {
	t.Parallel()
	p := fake.NewProvider(fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "streaming"}}, Hang: true})
	ts := start(t, runner(t, p), server.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	evs, st := wiretest.Collect(t, ctx, ts.client, hello(), func(ev *turnstilev1.AgentEvent) {
		if ev.GetTextDelta() != nil {
			cancel()
		}
	})
	if st.Code() != codes.Canceled {
		t.Errorf("status = %v", st)
	}
	// Client and server deadlines race: the server's may pass first, and
	// then its terminal error can still reach the client.
	got := wiretest.Names(evs)
	if got != "TurnStarted LlmCallStarted TextDelta" && got != "TurnStarted LlmCallStarted TextDelta Error" {
		t.Errorf("events %s, want TurnStarted LlmCallStarted TextDelta, and maybe Error", got)
	}
	if last := evs[len(evs)-1]; last.GetError() != nil && last.GetError().GetCode() != turnstilev1.ErrorCode_ERROR_CODE_DEADLINE_EXCEEDED {
		t.Errorf("terminal error %v, want DEADLINE_EXCEEDED", last.GetError())
	}
}

// TestDeadline: a turn still running at its client's deadline ends
// DEADLINE_EXCEEDED. The deadline is the test's wait: long enough for the
// turn's first delta on a loaded machine.
func TestDeadline(t *testing.T) {
	t.Parallel()
	p := fake.NewProvider(fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "slow"}}, Hang: true})
	ts := start(t, runner(t, p), server.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	evs, st := wiretest.Collect(t, ctx, ts.client, hello(), nil)
	if st.Code() != codes.DeadlineExceeded {
		t.Errorf("status = %v", st)
	}
	// Client and server deadlines race: the server's may pass first, and
	// then its terminal error can still reach the client.
	got := wiretest.Names(evs)
	if got != "TurnStarted LlmCallStarted TextDelta" && got != "TurnStarted LlmCallStarted TextDelta Error" {
		t.Errorf("events %s, want TurnStarted LlmCallStarted TextDelta, and maybe Error", got)
	}
	if last := evs[len(evs)-1]; last.GetError() != nil && last.GetError().GetCode() != turnstilev1.ErrorCode_ERROR_CODE_DEADLINE_EXCEEDED {
		t.Errorf("terminal error %v, want DEADLINE_EXCEEDED", last.GetError())
	}
}

func TestHealthAndReflection(t *testing.T) {
	t.Parallel()
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("x")})), server.Options{})
	h, err := healthpb.NewHealthClient(ts.conn).Check(t.Context(), &healthpb.HealthCheckRequest{Service: "turnstile.v1.AgentService"})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v", h, err)
	}
	rc, err := reflectionpb.NewServerReflectionClient(ts.conn).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := rc.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if !strings.Contains(strings.Join(names, ","), "turnstile.v1.AgentService") {
		t.Errorf("reflection lists %v", names)
	}
	_ = rc.CloseSend()
}

func TestShutdownDrainsThenCancelsRetryable(t *testing.T) {
	t.Parallel()
	p := fake.NewProvider(fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "long answer"}}, Hang: true})
	ts := start(t, runner(t, p), server.Options{ShutdownGrace: 50 * time.Millisecond, DrainDelay: 300 * time.Millisecond})
	health := healthpb.NewHealthClient(ts.conn)
	started := make(chan struct{})
	var once sync.Once
	var evs []*turnstilev1.AgentEvent
	var st *status.Status
	done := make(chan struct{})
	go func() {
		defer close(done)
		evs, st = wiretest.Collect(t, context.Background(), ts.client, hello(), func(ev *turnstilev1.AgentEvent) {
			if ev.GetTextDelta() != nil {
				once.Do(func() { close(started) })
			}
		})
	}()
	<-started
	// While draining, health says NOT_SERVING: its Watch tells the change.
	wctx, unwatch := context.WithCancel(t.Context())
	defer unwatch()
	w, err := health.Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if h, err := w.Recv(); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health before the shutdown: %v %v", h, err)
	}
	shut := make(chan struct{})
	go func() {
		defer close(shut)
		ts.srv.Shutdown(context.Background())
	}()
	if h, err := w.Recv(); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health while draining: %v %v", h, err)
	}
	unwatch() // the graceful stop waits for every RPC to end
	<-done
	<-shut
	if st.Code() != codes.Unavailable {
		t.Fatalf("status = %v", st)
	}
	if got, want := wiretest.Names(evs), "TurnStarted LlmCallStarted TextDelta Error"; got != want {
		t.Errorf("events %s, want %s", got, want)
	}
	e := evs[len(evs)-1].GetError()
	if e.GetCode() != turnstilev1.ErrorCode_ERROR_CODE_UNAVAILABLE || !e.GetRetryable() {
		t.Errorf("error = %v", e)
	}
	assertStatusMatchesEvent(t, st, e)
}

func TestNoSecretInErrors(t *testing.T) {
	t.Parallel()
	const key = "sk-secret-123"
	p := fake.NewProvider(fake.Reply{Err: &llm.Error{Kind: llm.KindAuth, Message: "invalid api key", Err: errors.New("Authorization: Bearer " + key)}})
	ts := start(t, runner(t, p), server.Options{})
	evs, st := wiretest.Collect(t, t.Context(), ts.client, hello(), nil)
	for _, ev := range evs {
		if strings.Contains(ev.String(), key) {
			t.Errorf("event leaks the key: %v", ev)
		}
	}
	if strings.Contains(fmt.Sprint(st.Proto()), key) {
		t.Errorf("status leaks the key: %v", st)
	}
}

// TestInternalFailureLogsItsCause runs a turn whose provider fails in a
// way nobody classified (as a base_url without a scheme did), wired as
// cmd/turnstile wires it: the client gets INTERNAL with a generic message,
// the turn's one line above DEBUG holds the root cause, and the RPC's own
// line is at DEBUG.
func TestInternalFailureLogsItsCause(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cause := errors.New(`Post "api.example.com/v1/chat/completions": unsupported protocol scheme ""`)
	r, err := runtime.New([]*runtime.Model{{Alias: "sim", ProviderName: "fake", Provider: fake.NewProvider(fake.Reply{Err: cause}), ID: "fake-1", Retry: policy.DefaultRetry()}},
		"sim", nil, runtime.WithObserver(telemetry.NewTurnLog(logger)))
	if err != nil {
		t.Fatal(err)
	}
	ts := start(t, r, server.Options{Logger: logger})
	evs, st := wiretest.Collect(t, t.Context(), ts.client, hello(), nil)
	if st.Code() != codes.Internal || strings.Contains(st.Message(), "scheme") {
		t.Errorf("status = %v %q; want INTERNAL without the cause", st.Code(), st.Message())
	}
	if got := evs[len(evs)-1].GetError().GetMessage(); strings.Contains(got, "scheme") {
		t.Errorf("the error event leaks the cause: %q", got)
	}
	// The interceptor logs after the handler returned.
	logs.awaitLine(t, "finished call")
	var above []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not JSON: %s", line)
		}
		switch {
		case m["msg"] == "finished call" && m["level"] != "DEBUG":
			t.Errorf("the RPC of a turn logs above DEBUG: %s", line)
		case m["level"] != "DEBUG":
			above = append(above, line)
		}
	}
	if len(above) != 1 || !strings.Contains(above[0], `"msg":"turn ended"`) || !strings.Contains(above[0], "unsupported protocol scheme") ||
		!strings.Contains(above[0], `"error_code":"INTERNAL"`) || !strings.Contains(above[0], `"level":"ERROR"`) {
		t.Errorf("want one ERROR turn line with the root cause, got:\n%s", strings.Join(above, "\n"))
	}
}

// TestRPCLogLevels asserts which RPC lines are logged above DEBUG: a
// RunTurn refused before its turn started is; health checks and
// reflection are not.
func TestRPCLogLevels(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("hi")})), server.Options{Logger: logger})
	if _, err := healthpb.NewHealthClient(ts.conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	refl, err := reflectionpb.NewServerReflectionClient(ts.conn).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := refl.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := refl.Recv(); err != nil {
		t.Fatal(err)
	}
	_ = refl.CloseSend()
	if _, err := refl.Recv(); err != io.EOF {
		t.Fatalf("reflection stream: %v", err)
	}
	bad := hello()
	bad.Messages = nil
	if _, st := wiretest.Collect(t, t.Context(), ts.client, bad, nil); st.Code() != codes.InvalidArgument {
		t.Fatalf("status = %v, want INVALID_ARGUMENT", st.Code())
	}
	want := map[string]string{
		"grpc.health.v1.Health":               "DEBUG",
		"grpc.reflection.v1.ServerReflection": "DEBUG",
		"turnstile.v1.AgentService":           "INFO",
	}
	logs.await(t, "the line of each RPC", func(logs string) bool { return strings.Count(logs, "finished call") >= len(want) })
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not JSON: %s", line)
		}
		if m["msg"] == "finished call" {
			got[fmt.Sprint(m["grpc.service"])] = fmt.Sprint(m["level"])
		}
	}
	// The benchmarks share this binary: go-cmp is kept out of it.
	if !maps.Equal(want, got) {
		t.Errorf("levels of the RPC lines = %v, want %v", got, want)
	}
}
