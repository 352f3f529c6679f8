package telemetry_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/providers/openai"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/telemetry"
)

// sseChunk is one chat.completion.chunk event of the OpenAI wire format.
func sseChunk(body string) string {
	return `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-test-2026-01-01",` + body + "}\n\n"
}

// openAIUpstream is a fake Chat Completions API: it answers "hello" and
// records the traceparent header of each request.
type openAIUpstream struct {
	*httptest.Server
	mu           sync.Mutex
	traceparents []string
}

func newOpenAIUpstream(t *testing.T) *openAIUpstream {
	u := &openAIUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		u.mu.Lock()
		u.traceparents = append(u.traceparents, r.Header.Get("traceparent"))
		u.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, sseChunk(`"choices":[{"index":0,"delta":{"role":"assistant","content":"hello"},"finish_reason":null}]`))
		io.WriteString(w, sseChunk(`"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]`))
		io.WriteString(w, sseChunk(`"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}`))
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(u.Close)
	return u
}

// TestClientTraceparentParentsTheTurn sends a turn with a W3C traceparent
// through a real gRPC server with otelgrpc, to the real OpenAI adapter
// over HTTP: the server span continues the client's trace under the
// client's span, the turn's spans hang under it, and the provider's HTTP
// request is a span of the same trace whose traceparent reaches the API.
func TestClientTraceparentParentsTheTurn(t *testing.T) {
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })

	p := newPipeline(t)
	up := newOpenAIUpstream(t)
	prov, err := openai.New(openai.Config{Name: "oai", BaseURL: up.URL})
	if err != nil {
		t.Fatal(err)
	}
	obs := observer(t, p, telemetry.ObserverOptions{})
	r, err := runtime.New([]*runtime.Model{{Alias: "fast", ProviderName: "oai", Provider: prov, ID: "gpt-test", Retry: policy.DefaultRetry()}},
		"fast", nil, runtime.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	providers := &telemetry.Providers{
		TracerProvider: p.tp, MeterProvider: p.mp, Tracing: true, Metrics: true,
		Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}
	conn := serve(t, r, providers)

	const (
		clientTrace = "0af7651916cd43dd8448eb211c80319c"
		clientSpan  = "b7ad6b7169203331"
	)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "traceparent", "00-"+clientTrace+"-"+clientSpan+"-01")
	req := &turnstilev1.RunTurnRequest{TurnId: "turn-tp", Messages: []*turnstilev1.Message{{
		Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "hi"}}},
	}}}
	if _, st := wiretest.Collect(t, ctx, turnstilev1.NewAgentServiceClient(conn), req, nil); st.Err() != nil {
		t.Fatalf("turn failed: %v", st)
	}

	// otelgrpc ends the server span after the handler returned, on the
	// server's goroutine: wait for it.
	const serverSpan = "turnstile.v1.AgentService/RunTurn"
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && !hasSpan(p, serverSpan) {
		time.Sleep(5 * time.Millisecond)
	}
	spans := p.spans.Ended()
	for _, s := range spans {
		if got := s.SpanContext().TraceID().String(); got != clientTrace {
			t.Errorf("span %s is in trace %s, want the client's %s", s.Name(), got, clientTrace)
		}
	}
	root := named(t, spans, serverSpan, 0)
	if got := root.Parent().SpanID().String(); got != clientSpan || !root.Parent().IsRemote() {
		t.Errorf("server span's parent = %s (remote %v), want the client's span %s", got, root.Parent().IsRemote(), clientSpan)
	}
	if got := attrs(root)["turnstile.turn.id"]; got != "turn-tp" {
		t.Errorf("server span's turnstile.turn.id = %q, want turn-tp", got)
	}
	got := tree(spans, "gen_ai.response.model", "http.response.status_code")
	want := `turnstile.v1.AgentService/RunTurn [server]
  invoke_agent [internal]
    chat gpt-test [client] gen_ai.response.model=gpt-test-2026-01-01
      HTTP POST [client] http.response.status_code=200
`
	// The client's span is not recorded here: the server span is the
	// root of what this process recorded.
	if got != want {
		t.Errorf("span tree:\n%s\nwant:\n%s", got, want)
	}
	httpSpan := named(t, spans, "HTTP POST", 0)
	up.mu.Lock()
	sent := append([]string(nil), up.traceparents...)
	up.mu.Unlock()
	if len(sent) != 1 || sent[0] != "00-"+clientTrace+"-"+httpSpan.SpanContext().SpanID().String()+"-01" {
		t.Errorf("traceparent the API received = %q, want the HTTP span %s of trace %s", sent, httpSpan.SpanContext().SpanID(), clientTrace)
	}
}

// serve serves r on loopback with providers' stats handler, as serve
// does, and returns a client connection; both stop with the test.
func serve(t *testing.T, r *runtime.Runner, providers *telemetry.Providers) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(r, server.Options{GRPCOptions: []grpc.ServerOption{grpc.StatsHandler(providers.ServerHandler())}})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		<-served
	})
	return conn
}

func hasSpan(p *pipeline, name string) bool {
	for _, s := range p.spans.Ended() {
		if s.Name() == name {
			return true
		}
	}
	return false
}

// TestHealthChecksAreNotTraced asserts the server handler leaves health
// checks out of traces, while the turn after them is traced.
func TestHealthChecksAreNotTraced(t *testing.T) {
	p := newPipeline(t)
	providers := &telemetry.Providers{TracerProvider: p.tp, MeterProvider: p.mp, Tracing: true, Propagator: propagation.TraceContext{}}
	r, err := runtime.New([]*runtime.Model{{Alias: "a", ProviderName: "x", Provider: fake.NewProvider(fake.Reply{Chunks: fake.Text("ok")}), ID: "a", Retry: fastRetry()}}, "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	conn := serve(t, r, providers)
	for range 3 {
		if _, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	req := &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{{
		Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "hi"}}},
	}}}
	if _, st := wiretest.Collect(t, t.Context(), turnstilev1.NewAgentServiceClient(conn), req, nil); st.Err() != nil {
		t.Fatalf("turn failed: %v", st)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && !hasSpan(p, "turnstile.v1.AgentService/RunTurn") {
		time.Sleep(5 * time.Millisecond)
	}
	if got, want := tree(p.spans.Ended()), "turnstile.v1.AgentService/RunTurn [server]\n"; got != want {
		t.Errorf("spans:\n%s\nwant the turn's only:\n%s", got, want)
	}
}
