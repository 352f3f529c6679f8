package server_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/telemetry"
)

// benchReply is a reply of 50 text deltas, the shape of a short answer.
func benchReply() fake.Reply {
	var chunks []llm.Chunk
	for range 50 {
		chunks = append(chunks, llm.Chunk{Kind: llm.ChunkText, Text: "word "})
	}
	chunks = append(chunks,
		llm.Chunk{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 10, OutputTokens: 50}},
		llm.Chunk{Kind: llm.ChunkStop, Stop: llm.StopEndTurn})
	return fake.Reply{Chunks: chunks}
}

// BenchmarkTurn compares one 50-delta turn run by the runtime alone with
// the same turn through the gRPC server on loopback; the difference is
// what the server and the wire add to a turn. The grpc-telemetry-off and
// grpc-telemetry-on variants wire the server as `turnstile serve` does,
// with no OTEL_* variable set, and with traces (100% sampled, batched to
// an OTLP/HTTP receiver that discards them) and metrics on. cpu-ns/op is
// the process's CPU time (user and system, every goroutine: client,
// server, exporter) per turn. Compare them in one run:
//
//	go test -run XXX -bench BenchmarkTurn -benchmem ./server
func BenchmarkTurn(b *testing.B) {
	b.Run("runtime", func(b *testing.B) {
		r := benchRunner(b)
		sink := runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil })
		b.ReportAllocs()
		cpu := startCPU(b)
		for b.Loop() {
			if _, err := r.Run(b.Context(), &runtime.TurnRequest{Messages: []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("hello")}}}}, sink); err != nil {
				b.Fatal(err)
			}
		}
		cpu.report()
	})
	b.Run("grpc", func(b *testing.B) {
		benchGRPC(b, start(b, benchRunner(b), server.Options{}))
	})
	b.Run("grpc-telemetry-off", func(b *testing.B) {
		// What serve builds with nothing set: no-op providers, no stats
		// handler, only the turn's log line (here formatted as JSON and
		// discarded).
		p, err := telemetry.Setup(b.Context(), telemetry.Options{})
		if err != nil || p.Enabled() {
			b.Fatalf("Setup: %v, enabled %v: clear the OTEL_* variables", err, p.Enabled())
		}
		logger := slog.New(slog.NewJSONHandler(io.Discard, nil))
		r := benchRunner(b, runtime.WithObserver(telemetry.NewTurnLog(logger)))
		benchGRPC(b, start(b, r, server.Options{Logger: logger}))
	})
	b.Run("grpc-telemetry-on", func(b *testing.B) {
		receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
		}))
		defer receiver.Close()
		exp, err := otlptracehttp.New(b.Context(), otlptracehttp.WithEndpointURL(receiver.URL+"/v1/traces"))
		if err != nil {
			b.Fatal(err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(exp))
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		defer func() {
			_ = tp.Shutdown(context.Background())
			_ = mp.Shutdown(context.Background())
		}()
		p := &telemetry.Providers{
			TracerProvider: tp, MeterProvider: mp, Tracing: true, Metrics: true,
			Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
		}
		var r *runtime.Runner
		obs, err := telemetry.NewObserver(tp, mp, telemetry.ObserverOptions{
			ProviderTypes: map[string]string{"fake": "openai"},
			Health:        func() []policy.ModelHealth { return r.Health() },
		})
		if err != nil {
			b.Fatal(err)
		}
		logger := slog.New(slog.NewJSONHandler(io.Discard, nil))
		r = benchRunner(b, runtime.WithObserver(runtime.Observers(obs, telemetry.NewTurnLog(logger))))
		benchGRPC(b, start(b, r, server.Options{Logger: logger, GRPCOptions: []grpc.ServerOption{grpc.StatsHandler(p.ServerHandler())}}))
	})
}

func benchGRPC(b *testing.B, ts *testServer) {
	req := hello()
	b.ReportAllocs()
	cpu := startCPU(b)
	for b.Loop() {
		stream, err := ts.client.RunTurn(b.Context(), req)
		if err != nil {
			b.Fatal(err)
		}
		for {
			if _, err := stream.Recv(); err == io.EOF {
				break
			} else if err != nil {
				b.Fatal(err)
			}
		}
	}
	cpu.report()
}

func benchRunner(b *testing.B, opts ...runtime.Option) *runtime.Runner {
	r, err := runtime.New([]*runtime.Model{{Alias: "sim", ProviderName: "fake", Provider: fake.NewProvider(benchReply()), ID: "fake-1", Retry: policy.DefaultRetry()}}, "sim", nil, opts...)
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// cpuClock measures the process's CPU time over a benchmark's loop.
type cpuClock struct {
	b     *testing.B
	start time.Duration
}

func startCPU(b *testing.B) cpuClock { return cpuClock{b: b, start: processCPU()} }

// report adds cpu-ns/op, the CPU time per iteration, when the platform
// measures it.
func (c cpuClock) report() {
	if end := processCPU(); end > 0 && c.b.N > 0 {
		c.b.ReportMetric(float64(end-c.start)/float64(c.b.N), "cpu-ns/op")
	}
}
