package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/turnstile-dev/turnstile/client"
	"github.com/turnstile-dev/turnstile/config"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
)

// TestGoClientTrace: a Go program traced with OpenTelemetry runs a turn
// through the Go client with otelgrpc's client stats handler, as
// docs/observability.md says to, against a server exporting traces over OTLP
// (OTEL_* variables only). The server's spans are in the program's trace:
// its RunTurn span is a child of the client's RPC span, invoke_agent of
// that, and the provider's HTTP span carries the turn id like the others.
// The provider gets the trace context too.
func TestGoClientTrace(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	col := startCollector(t)
	for _, v := range []string{"OTEL_SDK_DISABLED", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_TRACES_SAMPLER", "OTEL_PROPAGATORS"} {
		t.Setenv(v, "")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+col.addr)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_METRICS_EXPORTER", "none")

	up := newTracedUpstream(t, openaiAnswer("It is late."))
	cfg, err := config.Parse("config.yaml", []byte(fmt.Sprintf(`
providers:
  up: {type: openai, base_url: %s}
models:
  m: {provider: up, model: gpt-4.1-mini}
default_model: m
store: {mode: off}
`, up.URL)))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Server.DrainDelay = 0 // no client here needs the drain
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serveOn(ctx, cfg, slog.New(slog.DiscardHandler), lis, nil) }()

	// The program's own tracing: its tracer provider and W3C propagation,
	// handed to the client's gRPC connection.
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	c, err := client.New(lis.Addr().String(), client.WithInsecure(), client.WithDialOptions(grpc.WithStatsHandler(
		otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(propagation.TraceContext{})))))
	if err != nil {
		t.Fatal(err)
	}
	tctx, span := tp.Tracer("program").Start(t.Context(), "ask")
	res, err := c.RunTurn(tctx, &turnstilev1.RunTurnRequest{TurnId: "traced-turn", Messages: wiretest.UserText("what time is it?")}).Wait()
	span.End()
	c.Close()
	if err != nil || res.EndReason != turnstilev1.EndReason_END_REASON_END_TURN {
		t.Fatalf("turn: %v, %v", res, err)
	}
	stop()
	if err := <-served; err != nil {
		t.Fatalf("serve: %v", err)
	}
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}

	var rpc sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "turnstile.v1.AgentService/RunTurn" {
			rpc = s
		}
	}
	if rpc == nil || rpc.Parent().SpanID() != span.SpanContext().SpanID() {
		t.Fatalf("the client's RPC span %v, want one under %s", rpc, span.SpanContext().SpanID())
	}
	trace := span.SpanContext().TraceID().String()

	col.mu.Lock()
	spans := slices.Clone(col.spans)
	col.mu.Unlock()
	byName := map[string]*tracepb.Span{}
	for _, s := range spans {
		byName[s.GetName()] = s
		if got := fmt.Sprintf("%x", s.GetTraceId()); got != trace {
			t.Errorf("server span %s in trace %s, want the program's %s", s.GetName(), got, trace)
		}
	}
	server, agent, httpSpan := byName["turnstile.v1.AgentService/RunTurn"], byName["invoke_agent"], byName["HTTP POST"]
	if server == nil || agent == nil || httpSpan == nil {
		t.Fatalf("server spans %v", spans)
	}
	if got, want := fmt.Sprintf("%x", server.GetParentSpanId()), rpc.SpanContext().SpanID().String(); got != want {
		t.Errorf("the server span's parent is %s, want the client's RPC span %s", got, want)
	}
	if !slices.Equal(agent.GetParentSpanId(), server.GetSpanId()) {
		t.Errorf("invoke_agent's parent is %x, want the server span %x", agent.GetParentSpanId(), server.GetSpanId())
	}
	for _, s := range []*tracepb.Span{server, agent, byName["chat gpt-4.1-mini"], httpSpan} {
		var id string
		for _, a := range s.GetAttributes() {
			if a.GetKey() == "turnstile.turn.id" {
				id = a.GetValue().GetStringValue()
			}
		}
		if id != "traced-turn" {
			t.Errorf("span %s: turnstile.turn.id = %q, want traced-turn", s.GetName(), id)
		}
	}
	if sent := up.sent(); len(sent) != 1 || !strings.HasPrefix(sent[0], "00-"+trace+"-") {
		t.Errorf("the provider got traceparent %q, want the program's trace", sent)
	}
}
