package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/turnstile-dev/turnstile/config"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/telemetry"
)

// planted are distinct secrets, one in every place the configuration can
// hold one.
var planted = map[string]string{
	"provider API key":                 "sk-planted-apikey-7f3a9c01",
	"provider header":                  "static-hdr-planted-41b2",
	"provider header from env":         "env-hdr-planted-88d1",
	"MCP URL user":                     "mcpuser-planted",
	"MCP URL password":                 "mcppass-planted-2c9e",
	"MCP URL query":                    "mcpquery-planted-a71f",
	"MCP header":                       "mcphdr-planted-5e0d",
	"MCP header from env":              "mcpenvhdr-planted-93aa",
	"client key token":                 "client-token-planted-6d4c",
	"MCP URL password, as Go masks it": ":***@",
}

// leakSinks collects every text a client, an operator or a model may see:
// events, statuses, log lines and what the upstreams received. Spans join
// it once tracing exists (issue #10): add the exported spans with add.
type leakSinks struct {
	mu    sync.Mutex
	texts map[string]*strings.Builder
}

func (s *leakSinks) add(sink, text string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.texts == nil {
		s.texts = map[string]*strings.Builder{}
	}
	if s.texts[sink] == nil {
		s.texts[sink] = &strings.Builder{}
	}
	s.texts[sink].WriteString(text)
	s.texts[sink].WriteByte('\n')
}

// check fails for each planted secret any sink holds.
func (s *leakSinks) check(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for sink, b := range s.texts {
		for what, secret := range planted {
			if strings.Contains(b.String(), secret) {
				t.Errorf("the %s leaked into %s", what, sink)
			}
		}
	}
}

// openaiError is the body of an OpenAI error that quotes everything it
// got, as the worst upstream would: the key, the headers, the URL.
func openaiError(r *http.Request) string {
	msg := fmt.Sprintf("Incorrect API key provided: %s; headers %v; url %s", r.Header.Get("Authorization"), r.Header, r.URL)
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "code": "invalid_api_key"}})
	return string(b)
}

const (
	sseToolCall = `data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"lookup","arguments":"{\"q\":\"x\"}"}}]},"finish_reason":null}]}` + "\n\n" +
		`data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}` + "\n\n" +
		"data: [DONE]\n\n"
	sseAnswer = `data: {"id":"c2","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"ok"},"finish_reason":null}]}` + "\n\n" +
		`data: {"id":"c2","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n" +
		"data: [DONE]\n\n"
)

// plantedUpstream is an OpenAI-compatible API whose answer is chosen by
// the last user message: "401" and "500" fail quoting the request, "tool"
// calls the MCP tool lookup, anything else answers. It records request
// bodies: what the model would see.
func plantedUpstream(t *testing.T, sinks *leakSinks) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		sinks.add("a request body sent to the model", string(body))
		var req struct {
			Messages []struct {
				Role    string `json:"role"`
				Content any    `json:"content"`
			} `json:"messages"`
		}
		_ = json.Unmarshal(body, &req)
		last := req.Messages[len(req.Messages)-1]
		ask := fmt.Sprint(last.Content)
		switch {
		case strings.Contains(ask, "401"):
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, openaiError(r))
			return
		case strings.Contains(ask, "500"):
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, strings.Replace(openaiError(r), "invalid_api_key", "server_error", 1))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		if strings.Contains(ask, "tool") && last.Role == "user" {
			io.WriteString(w, sseToolCall)
			return
		}
		io.WriteString(w, sseAnswer)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// plantedMCP is an MCP server over streamable HTTP that answers only
// requests carrying every planted MCP credential, and says what it got
// when it refuses.
func plantedMCP(t *testing.T) (*httptest.Server, *atomic.Bool) {
	s := sdk.NewServer(&sdk.Implementation{Name: "planted", Version: "1"}, nil)
	s.AddTool(&sdk.Tool{Name: "lookup", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "found"}}}, nil
		})
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, nil)
	var refuse atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, pw, _ := r.BasicAuth()
		ok := user == planted["MCP URL user"] && pw == planted["MCP URL password"] && r.URL.Query().Get("token") == planted["MCP URL query"] &&
			r.Header.Get("X-Api-Key") == planted["MCP header"] && r.Header.Get("X-Env-Key") == planted["MCP header from env"]
		if !ok || refuse.Load() {
			// Quote everything back, as a careless server would.
			http.Error(w, fmt.Sprintf("refused %s with %v", r.URL, r.Header), http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &refuse
}

func closedPort(t *testing.T) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

func plantedConfig(upstream, mcpURL, downAddr string) string {
	return fmt.Sprintf(`
providers:
  up:   {type: openai, base_url: %s, api_key_env: PLANT_API_KEY, headers: {X-Static: %s}, headers_from_env: {X-Secret: PLANT_HDR}}
  down: {type: openai, base_url: http://%s/v1, api_key_env: PLANT_API_KEY}
models:
  fast: {provider: up, model: m, retry: {max_retries: 1, initial_backoff: 1ms, max_backoff: 2ms}}
  dead: {provider: down, model: m, retry: {max_retries: 0}}
default_model: fast
mcp_servers:
  files:
    url: %s
    headers: {X-Api-Key: %s}
    headers_from_env: {X-Env-Key: PLANT_MCP_HDR}
auth:
  keys: [{name: tester, token_env: PLANT_CLIENT_TOKEN}]
log: {format: json, level: debug}
`, upstream, planted["provider header"], downAddr, mcpURL, planted["MCP header"])
}

func plantEnv(t *testing.T) {
	t.Setenv("PLANT_API_KEY", planted["provider API key"])
	t.Setenv("PLANT_HDR", planted["provider header from env"])
	t.Setenv("PLANT_MCP_HDR", planted["MCP header from env"])
	t.Setenv("PLANT_CLIENT_TOKEN", planted["client key token"])
}

func secretURL(base string) string {
	return strings.Replace(base, "http://", "http://"+planted["MCP URL user"]+":"+planted["MCP URL password"]+"@", 1) +
		"/mcp?token=" + planted["MCP URL query"]
}

// TestPlantedSecrets plants a distinct secret in every place the
// configuration holds one, drives the failures that quote them (provider
// 401 and 500 echoing the request, a provider down, an MCP server
// refusing and down, bad requests and bad keys), and looks for each in
// every event, status, log line, span (content capture on) and model
// request.
func TestPlantedSecrets(t *testing.T) {
	plantEnv(t)
	sinks := &leakSinks{}
	up := plantedUpstream(t, sinks)
	mcpSrv, refuseMCP := plantedMCP(t)
	cfg, err := config.Parse("config.yaml", []byte(plantedConfig(up.URL+"/v1", secretURL(mcpSrv.URL), closedPort(t))))
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncWriter{sink: sinks, name: "the log"}
	logger, err := newLogger(logs, cfg.Log, cfg.Secrets(func(k string) string { v, _ := lookupEnv(k); return v }))
	if err != nil {
		t.Fatal(err)
	}
	defer routeStdLog(logger)()
	// Spans, with content capture on, and the provider requests' HTTP
	// spans through the global tracer provider.
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	prevTP := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	defer otel.SetTracerProvider(prevTP)
	obs, err := telemetry.NewObserver(tp, metricnoop.NewMeterProvider(), telemetry.ObserverOptions{CaptureContent: true})
	if err != nil {
		t.Fatal(err)
	}
	addr, stop := serveAsServe(t, cfg, logger, runtime.WithObserver(obs))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := turnstilev1.NewAgentServiceClient(conn)

	authed := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+planted["client key token"])
	turn := func(name string, ctx context.Context, req *turnstilev1.RunTurnRequest) []*turnstilev1.AgentEvent {
		evs, st := wiretest.Collect(t, ctx, client, req, nil)
		for _, ev := range evs {
			b, _ := protojson.Marshal(ev)
			sinks.add("the events of "+name, string(b))
		}
		b, _ := protojson.Marshal(st.Proto())
		sinks.add("the status of "+name, string(b))
		t.Logf("%s: %s, %v", name, wiretest.Names(evs), st.Code())
		return evs
	}
	ask := func(text string) *turnstilev1.RunTurnRequest {
		return &turnstilev1.RunTurnRequest{Messages: wiretest.UserText(text)}
	}

	turn("provider 401", authed, ask("answer 401"))
	turn("provider 500", authed, ask("answer 500"))
	dead := ask("hello")
	dead.Model = "dead"
	turn("provider down", authed, dead)
	if evs := turn("MCP tool call", authed, ask("call the tool")); !strings.Contains(wiretest.Names(evs), "ToolFinished") {
		t.Fatalf("the MCP tool was not called: %s", wiretest.Names(evs))
	}
	refuseMCP.Store(true)
	turn("MCP server refusing", authed, ask("call the tool again"))
	mcpSrv.Close()
	turn("MCP server down", authed, ask("call the tool once more"))
	turn("bad request", authed, &turnstilev1.RunTurnRequest{Model: planted["provider API key"][:6] + "nope"})
	turn("wrong key", metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+planted["client key token"]+"x"), ask("hi"))
	turn("no key", t.Context(), ask("hi"))
	// A library writing with the standard logger goes through the same
	// redaction.
	log.Printf("a library quotes %s", planted["provider API key"])

	// An MCP server down at start-up stops serve with an error.
	badCfg, err := config.Parse("config.yaml", []byte(plantedConfig(up.URL+"/v1", secretURL("http://"+closedPort(t)), closedPort(t))))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := buildRunner(t.Context(), badCfg, logger); err == nil {
		t.Error("buildRunner with an MCP server down succeeded")
	} else {
		sinks.add("the start-up error", err.Error())
		logger.Error("serve failed", "error", err)
	}
	stop() // its last log lines are written
	ended := spans.Ended()
	if len(ended) == 0 {
		t.Fatal("no span was recorded")
	}
	kinds := map[string]bool{}
	for _, sp := range ended {
		sinks.add("the span "+sp.Name(), describeSpan(sp))
		kinds[strings.Fields(sp.Name())[0]] = true
	}
	for _, want := range []string{"invoke_agent", "chat", "execute_tool", "HTTP"} {
		if !kinds[want] {
			t.Errorf("no %s span was recorded; spans: %v", want, kinds)
		}
	}
	sinks.check(t)
	if !strings.Contains(logs.String(), `"msg":"a library quotes [redacted]","source":"stdlog"`) {
		t.Error("the standard logger's line is not a redacted slog line")
	}
	if !strings.Contains(logs.String(), `"client":"tester"`) {
		t.Error("no log line names the client key")
	}
}

// describeSpan renders everything a span exports: its name, status,
// attributes, and its events with their attributes.
func describeSpan(sp sdktrace.ReadOnlySpan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s status=%s %q", sp.Name(), sp.Status().Code, sp.Status().Description)
	for _, kv := range sp.Attributes() {
		fmt.Fprintf(&b, " %s=%s", kv.Key, kv.Value.Emit())
	}
	for _, ev := range sp.Events() {
		fmt.Fprintf(&b, " event %s", ev.Name)
		for _, kv := range ev.Attributes {
			fmt.Fprintf(&b, " %s=%s", kv.Key, kv.Value.Emit())
		}
	}
	return b.String()
}

func lookupEnv(k string) (string, bool) {
	for what, env := range map[string]string{
		"provider API key": "PLANT_API_KEY", "provider header from env": "PLANT_HDR",
		"MCP header from env": "PLANT_MCP_HDR", "client key token": "PLANT_CLIENT_TOKEN",
	} {
		if env == k {
			return planted[what], true
		}
	}
	return "", false
}

// syncWriter collects log output into sinks.
type syncWriter struct {
	sink *leakSinks
	name string
	mu   sync.Mutex
	b    strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.b.Write(p)
	w.mu.Unlock()
	w.sink.add(w.name, string(p))
	return len(p), nil
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
