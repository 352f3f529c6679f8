package telemetry_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/turnstile-dev/turnstile/telemetry"
)

// otelVars are the variables Setup reads; each case starts with all unset.
var otelVars = []string{
	"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
	"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
	"OTEL_PROPAGATORS",
}

// keepGlobals restores OpenTelemetry's globals after the test.
func keepGlobals(t *testing.T) {
	tp, mp, prop := otel.GetTracerProvider(), otel.GetMeterProvider(), otel.GetTextMapPropagator()
	t.Cleanup(func() {
		if otel.GetTracerProvider() != tp {
			otel.SetTracerProvider(tp)
		}
		if otel.GetMeterProvider() != mp {
			otel.SetMeterProvider(mp)
		}
		if otel.GetTextMapPropagator() != prop {
			otel.SetTextMapPropagator(prop)
		}
	})
}

// TestSetupFromEnv asserts which signals each set of OTEL_* variables
// turns on, and that with none set nothing is installed.
func TestSetupFromEnv(t *testing.T) {
	tests := []struct {
		name             string
		env              map[string]string
		prometheus       bool
		tracing, metrics bool
	}{
		{name: "nothing set"},
		{name: "exporters none", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}},
		{name: "sdk disabled", env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, prometheus: false},
		{name: "endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, tracing: true, metrics: true},
		{name: "traces endpoint only", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1/v1/traces"}, tracing: true},
		{name: "metrics exporter only, grpc", env: map[string]string{"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, metrics: true},
		{name: "console traces", env: map[string]string{"OTEL_TRACES_EXPORTER": "console"}, tracing: true},
		{name: "prometheus only", prometheus: true, metrics: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keepGlobals(t)
			for _, v := range otelVars {
				t.Setenv(v, "")
			}
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			before := otel.GetTracerProvider()
			p, err := telemetry.Setup(t.Context(), telemetry.Options{Prometheus: tt.prometheus})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				defer cancel()
				_ = p.Shutdown(ctx) // the endpoints are unreachable
			}()
			if p.Tracing != tt.tracing || p.Metrics != tt.metrics {
				t.Errorf("tracing %v, metrics %v; want %v, %v", p.Tracing, p.Metrics, tt.tracing, tt.metrics)
			}
			_, sdkTP := p.TracerProvider.(*sdktrace.TracerProvider)
			_, sdkMP := p.MeterProvider.(*sdkmetric.MeterProvider)
			if sdkTP != tt.tracing || sdkMP != tt.metrics {
				t.Errorf("SDK tracer provider %v, SDK meter provider %v; want %v, %v", sdkTP, sdkMP, tt.tracing, tt.metrics)
			}
			if (p.ServerHandler() != nil) != (tt.tracing || tt.metrics) {
				t.Errorf("server handler %v with tracing %v, metrics %v", p.ServerHandler(), tt.tracing, tt.metrics)
			}
			if (p.MetricsHandler() != nil) != tt.prometheus {
				t.Errorf("metrics handler %v, want one %v", p.MetricsHandler(), tt.prometheus)
			}
			if global := otel.GetTracerProvider(); (global != before) != tt.tracing {
				t.Errorf("global tracer provider replaced: %v, want %v", global != before, tt.tracing)
			}
		})
	}
}

// TestSetupBadEnv asserts an exporter name autoexport does not know is an
// error, not a silent no-op.
func TestSetupBadEnv(t *testing.T) {
	keepGlobals(t)
	for _, v := range otelVars {
		t.Setenv(v, "")
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "zipkin-please")
	if _, err := telemetry.Setup(t.Context(), telemetry.Options{}); err == nil || !strings.Contains(err.Error(), "traces exporter") {
		t.Errorf("Setup error = %v, want a traces exporter error", err)
	}
}

// TestSetupPropagators asserts OTEL_PROPAGATORS picks the headers the
// server reads and the providers get (default W3C trace context and
// baggage), and that a name it does not know fails Setup.
func TestSetupPropagators(t *testing.T) {
	tests := []struct {
		env    string
		fields []string
		err    string
	}{
		{env: "", fields: []string{"baggage", "traceparent", "tracestate"}},
		{env: "tracecontext", fields: []string{"traceparent", "tracestate"}},
		{env: "b3, tracecontext", fields: []string{"b3", "traceparent", "tracestate"}},
		{env: "b3multi", fields: []string{"x-b3-flags", "x-b3-sampled", "x-b3-spanid", "x-b3-traceid"}},
		{env: "none"},
		{env: "tracecontext,zipkin-please", err: "OTEL_PROPAGATORS: unknown propagator: zipkin-please"},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			keepGlobals(t)
			for _, v := range otelVars {
				t.Setenv(v, "")
			}
			t.Setenv("OTEL_TRACES_EXPORTER", "console")
			t.Setenv("OTEL_PROPAGATORS", tt.env)
			p, err := telemetry.Setup(t.Context(), telemetry.Options{})
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Setup error = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer p.Shutdown(context.Background())
			got := p.Propagator.Fields()
			slices.Sort(got)
			if !slices.Equal(got, tt.fields) {
				t.Errorf("fields %v, want %v", got, tt.fields)
			}
			if g := otel.GetTextMapPropagator().Fields(); !slices.Equal(slices.Sorted(slices.Values(g)), tt.fields) {
				t.Errorf("global propagator's fields %v, want %v", g, tt.fields)
			}
		})
	}
}

// TestOpsHandler asserts what the ops listener serves: /metrics in the
// Prometheus format with the same instruments as OTLP, /debug/pprof/ only
// when asked for, nothing else.
func TestOpsHandler(t *testing.T) {
	keepGlobals(t)
	for _, v := range otelVars {
		t.Setenv(v, "")
	}
	p, err := telemetry.Setup(t.Context(), telemetry.Options{Prometheus: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	scenario(t, observer(t, &pipeline{tp: sdktrace.NewTracerProvider(), mp: p.MeterProvider.(*sdkmetric.MeterProvider)}, telemetry.ObserverOptions{}), nil)

	get := func(h http.Handler, path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		b, _ := io.ReadAll(rec.Body)
		return rec.Code, string(b)
	}
	withPProf := telemetry.OpsHandler(p.MetricsHandler(), true)
	code, body := get(withPProf, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{
		`gen_ai_client_operation_duration_seconds_bucket{`,
		`turnstile_retries_total{error_type="OVERLOADED"`,
		`turnstile_turns_total{`,
		`go_goroutines `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if code, _ := get(withPProf, "/debug/pprof/"); code != http.StatusOK {
		t.Errorf("/debug/pprof/ with pprof: %d", code)
	}
	code, body = get(withPProf, "/debug/alloc")
	var alloc map[string]uint64
	if err := json.Unmarshal([]byte(body), &alloc); code != http.StatusOK || err != nil || alloc["alloc_bytes"] == 0 || alloc["alloc_objects"] == 0 || len(alloc) != 3 {
		t.Errorf("/debug/alloc with pprof: %d %s", code, body)
	}
	gc := httptest.NewRecorder()
	withPProf.ServeHTTP(gc, httptest.NewRequest(http.MethodPost, "/debug/gc", nil))
	if gc.Code != http.StatusOK {
		t.Errorf("POST /debug/gc with pprof: %d", gc.Code)
	}
	if _, after := get(withPProf, "/debug/alloc"); !strings.Contains(after, `"gc_cycles":`) {
		t.Errorf("/debug/alloc after /debug/gc: %s", after)
	}
	without := telemetry.OpsHandler(p.MetricsHandler(), false)
	for path, want := range map[string]int{"/debug/pprof/": 404, "/debug/alloc": 404, "/metrics": 200, "/": 404} {
		if code, _ := get(without, path); code != want {
			t.Errorf("%s without pprof: %d, want %d", path, code, want)
		}
	}
	profilesOnly := telemetry.OpsHandler(nil, true)
	for path, want := range map[string]int{"/debug/pprof/": 200, "/metrics": 404} {
		if code, _ := get(profilesOnly, path); code != want {
			t.Errorf("%s without metrics: %d, want %d", path, code, want)
		}
	}
}
