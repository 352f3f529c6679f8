package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/turnstile-dev/turnstile/config"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
)

// collector is an OTLP receiver over gRPC, as an OpenTelemetry Collector
// runs one: it keeps every span and the names of every metric exported.
type collector struct {
	addr string

	mu      sync.Mutex
	spans   []*tracepb.Span
	service []string
	version []string // service.version
	scopes  []string // each span's scope: name version schema
	metrics map[string]bool
}

type traceService struct {
	coltracepb.UnimplementedTraceServiceServer
	c *collector
}

func (s traceService) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, a := range rs.GetResource().GetAttributes() {
			switch a.GetKey() {
			case "service.name":
				s.c.service = append(s.c.service, a.GetValue().GetStringValue())
			case "service.version":
				s.c.version = append(s.c.version, a.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			s.c.spans = append(s.c.spans, ss.GetSpans()...)
			for range ss.GetSpans() {
				sc := ss.GetScope()
				s.c.scopes = append(s.c.scopes, sc.GetName()+" "+sc.GetVersion()+" "+ss.GetSchemaUrl())
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

type metricsService struct {
	colmetricpb.UnimplementedMetricsServiceServer
	c *collector
}

func (s metricsService) Export(_ context.Context, req *colmetricpb.ExportMetricsServiceRequest) (*colmetricpb.ExportMetricsServiceResponse, error) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	for _, rm := range req.GetResourceMetrics() {
		for _, sm := range rm.GetScopeMetrics() {
			for _, m := range sm.GetMetrics() {
				s.c.metrics[m.GetName()] = true
			}
		}
	}
	return &colmetricpb.ExportMetricsServiceResponse{}, nil
}

func startCollector(t *testing.T) *collector {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{addr: lis.Addr().String(), metrics: map[string]bool{}}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, traceService{c: c})
	colmetricpb.RegisterMetricsServiceServer(srv, metricsService{c: c})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return c
}

// tracedUpstream is a fake Chat Completions API that records the
// traceparent of each request and answers each call with the next reply
// (the last one repeats); a reply of "503" is an overloaded error.
type tracedUpstream struct {
	*httptest.Server
	mu           sync.Mutex
	traceparents []string
}

func newTracedUpstream(t *testing.T, replies ...string) *tracedUpstream {
	u := &tracedUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		u.mu.Lock()
		n := len(u.traceparents)
		u.traceparents = append(u.traceparents, r.Header.Get("traceparent"))
		u.mu.Unlock()
		reply := replies[min(n, len(replies)-1)]
		if reply == "503" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"message":"The server is overloaded.","type":"server_error","code":"server_is_overloaded"}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, reply)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *tracedUpstream) sent() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.traceparents)
}

// TestTelemetryEndToEnd serves the configuration `turnstile serve` would,
// with OTLP over gRPC to a collector started here (set only by OTEL_*
// variables) and the ops listener on: a client's traced turn retries an
// overloaded model, falls back, runs a tool and answers. The collector
// gets the whole span tree in the client's trace, the providers get the
// trace context, /metrics serves the same instruments in the Prometheus
// format, and the collector gets them over OTLP too.
func TestTelemetryEndToEnd(t *testing.T) {
	// Registered first, the check runs after every other cleanup.
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	col := startCollector(t)
	for _, v := range []string{"OTEL_SDK_DISABLED", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_TRACES_SAMPLER"} {
		t.Setenv(v, "")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+col.addr)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_METRICS_EXPORTER", "otlp")
	t.Setenv("OTEL_SERVICE_NAME", "turnstile-e2e")
	version = "v9.9.9-e2e" // as -ldflags stamps it
	t.Cleanup(func() { version = "" })

	openai := providerCases(t)[0]
	primary := newTracedUpstream(t, "503")
	backup := newTracedUpstream(t, openai.toolCall, openai.answer)
	cfg, err := config.Parse("config.yaml", []byte(fmt.Sprintf(`
providers:
  primary: {type: openai, base_url: %s}
  backup: {type: openai, base_url: %s}
models:
  fast: {provider: primary, model: gpt-4.1-mini, fallbacks: [steady], retry: {max_retries: 1, initial_backoff: 1ms, jitter: 0}}
  steady: {provider: backup, model: gpt-4.1-mini}
default_model: fast
ops: {listen: "127.0.0.1:0"}
store: {dir: ""}
`, primary.URL, backup.URL)))
	if err != nil {
		t.Fatal(err)
	}
	// slog's handler serializes its writes; logs is read once serveOn has
	// returned.
	var logs strings.Builder
	addr, opsAddr, stop := serveWithOps(t, cfg, &logs)

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	const (
		clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
		clientSpan  = "00f067aa0ba902b7"
	)
	rctx := metadata.AppendToOutgoingContext(t.Context(), "traceparent", "00-"+clientTrace+"-"+clientSpan+"-01")
	evs, st := wiretest.Collect(t, rctx, turnstilev1.NewAgentServiceClient(conn), &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("what time is it?")}, nil)
	conn.Close()
	if st.Code() != codes.OK {
		t.Fatalf("status %v", st)
	}
	if got, want := wiretest.Names(evs), "TurnStarted LlmCallStarted LlmCallFinished Retry LlmCallStarted LlmCallFinished Fallback"; !strings.HasPrefix(got, want) {
		t.Fatalf("events %s, want them to start with %s", got, want)
	}

	// The RPC's own duration is recorded by the stats handler after the
	// status has gone out, so the client can scrape before it lands:
	// scrape until every instrument is there, for a few seconds at most.
	wants := []string{
		`gen_ai_client_operation_duration_seconds_count{error_type="OVERLOADED",gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="gpt-4.1-mini",`,
		`gen_ai_client_token_usage_sum{gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="gpt-4.1-mini",gen_ai_response_model="gpt-4.1-mini",gen_ai_token_type="input",`,
		`turnstile_retries_total{error_type="OVERLOADED",`,
		`turnstile_fallbacks_total{error_type="OVERLOADED",`,
		`turnstile_turns_total{`,
		`gen_ai_execute_tool_duration_seconds_count{gen_ai_operation_name="execute_tool",gen_ai_tool_name="current_time",`,
		`turnstile_model_cooling_down{`,
		`rpc_server_call_duration_seconds_count{`,
	}
	var scrape []byte
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get("http://" + opsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		scrape, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if !slices.ContainsFunc(wants, func(w string) bool { return !strings.Contains(string(scrape), w) }) || time.Now().After(deadline) {
			break
		}
	}
	for _, want := range wants {
		if !strings.Contains(string(scrape), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", scrape)
	}

	if err := stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}

	col.mu.Lock()
	spans, services, versions, scopes := slices.Clone(col.spans), slices.Clone(col.service), slices.Clone(col.version), slices.Clone(col.scopes)
	metrics := col.metrics
	col.mu.Unlock()
	byID := map[string]*tracepb.Span{}
	var names []string
	for _, s := range spans {
		byID[fmt.Sprintf("%x", s.GetSpanId())] = s
		if got := fmt.Sprintf("%x", s.GetTraceId()); got != clientTrace {
			t.Errorf("span %s in trace %s, want the client's %s", s.GetName(), got, clientTrace)
		}
	}
	var root *tracepb.Span
	for _, s := range spans {
		parent := byID[fmt.Sprintf("%x", s.GetParentSpanId())]
		name := s.GetName()
		if parent != nil {
			name = parent.GetName() + " > " + name
		} else {
			root = s
		}
		names = append(names, name)
	}
	slices.Sort(names)
	wantNames := []string{
		"chat gpt-4.1-mini > HTTP POST",
		"chat gpt-4.1-mini > HTTP POST",
		"chat gpt-4.1-mini > HTTP POST",
		"chat gpt-4.1-mini > HTTP POST",
		"invoke_agent > chat gpt-4.1-mini",
		"invoke_agent > chat gpt-4.1-mini",
		"invoke_agent > chat gpt-4.1-mini",
		"invoke_agent > chat gpt-4.1-mini",
		"invoke_agent > execute_tool current_time",
		"turnstile.v1.AgentService/RunTurn",
		"turnstile.v1.AgentService/RunTurn > invoke_agent",
	}
	if !slices.Equal(names, wantNames) {
		t.Errorf("spans (parent > span):\n%s\nwant:\n%s", strings.Join(names, "\n"), strings.Join(wantNames, "\n"))
	}
	if root == nil || fmt.Sprintf("%x", root.GetParentSpanId()) != clientSpan {
		t.Errorf("root span %v, want the server span under the client's span %s", root, clientSpan)
	}
	if len(services) == 0 || services[0] != "turnstile-e2e" {
		t.Errorf("service.name = %v, want turnstile-e2e from OTEL_SERVICE_NAME", services)
	}
	if len(versions) == 0 || versions[0] != "v9.9.9-e2e" {
		t.Errorf("service.version = %v, want the stamped v9.9.9-e2e", versions)
	}
	ports := map[string]bool{}
	for _, up := range []*tracedUpstream{primary, backup} {
		ports[fmt.Sprint(up.Listener.Addr().(*net.TCPAddr).Port)] = true
	}
	for i, s := range spans {
		chat := strings.HasPrefix(s.GetName(), "chat ")
		if !chat && s.GetName() != "invoke_agent" && !strings.HasPrefix(s.GetName(), "execute_tool ") {
			continue
		}
		if want := "github.com/turnstile-dev/turnstile/telemetry v9.9.9-e2e https://opentelemetry.io/schemas/1.41.0"; scopes[i] != want {
			t.Errorf("span %s: scope %q, want %q", s.GetName(), scopes[i], want)
		}
		a := map[string]string{}
		for _, kv := range s.GetAttributes() {
			switch v := kv.GetValue(); v.GetValue().(type) {
			case *commonpb.AnyValue_IntValue:
				a[kv.GetKey()] = fmt.Sprint(v.GetIntValue())
			default:
				a[kv.GetKey()] = v.GetStringValue()
			}
		}
		_, failed := a["error.type"]
		switch {
		case s.GetName() == "invoke_agent" && a["gen_ai.provider.name"] != "openai":
			t.Errorf("invoke_agent: gen_ai.provider.name %q, want openai", a["gen_ai.provider.name"])
		case chat && (a["server.address"] != "127.0.0.1" || !ports[a["server.port"]]):
			t.Errorf("%s: server.address %q server.port %q, want a provider's", s.GetName(), a["server.address"], a["server.port"])
		case chat && !failed && a["gen_ai.response.id"] == "":
			t.Errorf("%s: no gen_ai.response.id, want the completion's id", s.GetName())
		}
	}
	for _, s := range spans {
		if s.GetName() != "invoke_agent" {
			continue
		}
		var events []string
		for _, ev := range s.GetEvents() {
			events = append(events, ev.GetName())
		}
		if got := strings.Join(events, " "); got != "turnstile.retry turnstile.fallback turnstile.cooldown" {
			t.Errorf("invoke_agent events = %s", got)
		}
	}
	for _, up := range []*tracedUpstream{primary, backup} {
		for _, tp := range up.sent() {
			if !strings.HasPrefix(tp, "00-"+clientTrace+"-") {
				t.Errorf("the provider got traceparent %q, want the client's trace", tp)
			}
		}
	}
	if n := len(primary.sent()) + len(backup.sent()); n != 4 {
		t.Errorf("%d provider requests, want 4", n)
	}
	for _, m := range []string{"gen_ai.client.operation.duration", "gen_ai.client.token.usage", "turnstile.turns", "rpc.server.call.duration"} {
		if !metrics[m] {
			t.Errorf("the collector got no %s over OTLP (got %v)", m, metrics)
		}
	}
	if line := logs.String(); !strings.Contains(line, `"msg":"turn ended"`) || !strings.Contains(line, `"trace_id":"`+clientTrace+`"`) {
		t.Errorf("no turn line with the client's trace id:\n%s", line)
	}
}

// serveWithOps runs serveOn with cfg, as `turnstile serve` does, on
// loopback listeners for the gRPC API (addr) and the ops listener
// (opsAddr), logging JSON to logs; stop ends it and returns serveOn's
// error. Read logs only once stop has returned.
func serveWithOps(t *testing.T, cfg *config.Config, logs io.Writer) (addr, opsAddr string, stop func() error) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ops, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		lis.Close()
		t.Fatal(err)
	}
	// No client here needs the drain: stop at once.
	cfg.Server.DrainDelay = 0
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serveOn(ctx, cfg, slog.New(slog.NewJSONHandler(logs, nil)), lis, ops) }()
	return lis.Addr().String(), ops.Addr().String(), func() error {
		cancel()
		return <-served
	}
}

// TestJSONLogDurations: in JSON logs a duration is a Go duration string
// and a count a number.
func TestJSONLogDurations(t *testing.T) {
	var b strings.Builder
	l, err := newLogger(&b, config.Log{Format: "json", Level: "info"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Info("draining", "grace", 30*time.Second, "turns", 3, "wait_ms", 1.5)
	if got := b.String(); !strings.Contains(got, `"grace":"30s","turns":3,"wait_ms":1.5}`) {
		t.Errorf("line = %s", got)
	}
}

// TestOpsStoreDebug: with pprof and a turn store, the ops listener serves
// /debug/store, the log's messages and bytes, which a turn adds to (the
// count turnstile bench reads); without pprof it is not served.
func TestOpsStoreDebug(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	for _, v := range []string{"OTEL_SDK_DISABLED", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"} {
		t.Setenv(v, "")
	}
	for _, pprof := range []bool{true, false} {
		t.Run(fmt.Sprintf("pprof=%v", pprof), func(t *testing.T) {
			cfg, err := config.Parse("config.yaml", []byte(fmt.Sprintf(`
providers: {sim: {type: simulator, token_delay: 0}}
models: {m: {provider: sim, model: x}}
ops: {listen: "127.0.0.1:0", metrics: false, pprof: %v}
store: {dir: ""}
`, pprof)))
			if err != nil {
				t.Fatal(err)
			}
			var logs strings.Builder
			addr, opsAddr, stop := serveWithOps(t, cfg, &logs)
			defer func() {
				if err := stop(); err != nil {
					t.Fatalf("serve: %v", err)
				}
			}()
			type size struct {
				Messages, Bytes uint64
			}
			get := func() (int, size) {
				t.Helper()
				resp, err := http.Get("http://" + opsAddr + "/debug/store")
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var s size
				if resp.StatusCode == http.StatusOK {
					if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
						t.Fatal(err)
					}
				}
				return resp.StatusCode, s
			}
			code, before := get()
			if !pprof {
				if code != http.StatusNotFound {
					t.Fatalf("/debug/store without pprof: %d, want 404", code)
				}
				return
			}
			if code != http.StatusOK {
				t.Fatalf("/debug/store: %d, want 200", code)
			}
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, st := wiretest.Collect(t, t.Context(), turnstilev1.NewAgentServiceClient(conn), &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("hello")}, nil); st.Code() != codes.OK {
				t.Fatal(st)
			}
			// The run's record and at least one frame of its events.
			if _, after := get(); after.Messages < before.Messages+2 || after.Bytes <= before.Bytes {
				t.Errorf("/debug/store after a turn: %+v, before %+v: want 2 messages or more and more bytes", after, before)
			}
		})
	}
}

// TestOpsProfilesWithoutMetrics: the ops listener is the one place for
// profiles and runtime counters (turnstile bench uses it so): with
// metrics: false and pprof: true it serves them, and no /metrics, and
// metrics stay off.
func TestOpsProfilesWithoutMetrics(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	for _, v := range []string{"OTEL_SDK_DISABLED", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"} {
		t.Setenv(v, "")
	}
	cfg, err := config.Parse("config.yaml", []byte(`
providers: {sim: {type: simulator}}
models: {m: {provider: sim, model: x}}
ops: {listen: "127.0.0.1:0", metrics: false, pprof: true}
store: {mode: off}
`))
	if err != nil {
		t.Fatal(err)
	}
	// Read once serveOn has returned.
	var logs strings.Builder
	_, opsAddr, stop := serveWithOps(t, cfg, &logs)
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + opsAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/metrics"); code != http.StatusNotFound {
		t.Errorf("/metrics: %d, want 404", code)
	}
	if code, body := get("/debug/alloc"); code != http.StatusOK || !strings.Contains(body, `"alloc_objects":`) {
		t.Errorf("/debug/alloc: %d %s", code, body)
	}
	if code, body := get("/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("/debug/pprof/: %d", code)
	}
	if err := stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	if line := logs.String(); !strings.Contains(line, `"msg":"serving"`) || !strings.Contains(line, `"metrics":false`) || !strings.Contains(line, `"tracing":false`) {
		t.Errorf("the serving line says metrics or tracing are on:\n%s", line)
	}
}
