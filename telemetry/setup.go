package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/propagators/autoprop"
	"go.opentelemetry.io/otel"
	promexporter "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/stats"
)

// Options tune [Setup].
type Options struct {
	// Prometheus adds a reader that serves every instrument in the
	// Prometheus format, for the ops listener's /metrics ([Providers.MetricsHandler]).
	Prometheus bool
	// Logger receives the SDK's own errors (an unreachable collector,
	// a dropped batch) as warnings; nil discards them.
	Logger *slog.Logger
	// Version is the service.version resource attribute; empty leaves it
	// out.
	Version string
}

// Providers are the OpenTelemetry providers turnstile records through.
// Build them with [Setup]; when neither traces nor metrics are exported,
// both are no-op providers and nothing else runs.
type Providers struct {
	// TracerProvider starts spans; a no-op provider when traces are off.
	TracerProvider trace.TracerProvider
	// MeterProvider records metrics; a no-op provider when no exporter
	// and no Prometheus reader is configured.
	MeterProvider metric.MeterProvider
	// Propagator reads and writes the trace context: the propagators
	// OTEL_PROPAGATORS names (tracecontext, baggage, b3, b3multi, jaeger,
	// xray, ottrace, none), by default W3C trace context and baggage.
	Propagator propagation.TextMapPropagator
	// Tracing and Metrics report which signals are exported.
	Tracing, Metrics bool

	metrics  http.Handler
	shutdown []func(context.Context) error
}

// Setup builds the providers from the standard OTEL_* environment
// variables, through the contrib autoexport package, and installs them as
// OpenTelemetry's globals, which the providers' HTTP clients use.
//
// Traces are exported when OTEL_TRACES_EXPORTER names an exporter other
// than none, or, when it is unset, when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (OTLP, over
// OTEL_EXPORTER_OTLP_PROTOCOL: http/protobuf by default, or grpc).
// Metrics likewise with OTEL_METRICS_EXPORTER and
// OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, every OTEL_METRIC_EXPORT_INTERVAL,
// and always when opts.Prometheus is set. The sampler comes from
// OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (default: parent-based,
// always on), the resource from OTEL_SERVICE_NAME (default turnstile) and
// OTEL_RESOURCE_ATTRIBUTES, the propagators from OTEL_PROPAGATORS
// (through the contrib autoprop package; default tracecontext,baggage).
// OTEL_SDK_DISABLED=true turns everything off.
//
// With none of them set, Setup installs nothing and returns no-op
// providers: no exporter runs and nothing points at a default endpoint.
func Setup(ctx context.Context, opts Options) (*Providers, error) {
	p := &Providers{
		TracerProvider: tracenoop.NewTracerProvider(),
		MeterProvider:  metricnoop.NewMeterProvider(),
		Propagator:     propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}
	disabled := strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true")
	traces := !disabled && wanted("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	metrics := !disabled && wanted("OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
	if !traces && !metrics && !opts.Prometheus {
		return p, nil
	}
	prop, err := propagator()
	if err != nil {
		return nil, err
	}
	p.Propagator = prop
	if opts.Logger != nil {
		logger := opts.Logger
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
			logger.Warn("telemetry export failed", "error", err)
		}))
	}
	attrs := []resource.Option{resource.WithAttributes(semconv.ServiceName("turnstile"))}
	if opts.Version != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceVersion(opts.Version)))
	}
	res, err := resource.New(ctx, append(attrs, resource.WithFromEnv(), resource.WithTelemetrySDK())...)
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}

	if traces {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return nil, fmt.Errorf("telemetry: traces exporter: %w", err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(TurnIDProcessor()), sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		p.TracerProvider, p.Tracing = tp, true
		p.shutdown = append(p.shutdown, tp.Shutdown)
		otel.SetTracerProvider(tp)
		otel.SetTextMapPropagator(p.Propagator)
	}

	var readers []sdkmetric.Option
	if metrics {
		r, err := autoexport.NewMetricReader(ctx)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("telemetry: metrics exporter: %w", err), p.Shutdown(ctx))
		}
		readers = append(readers, sdkmetric.WithReader(r))
	}
	if opts.Prometheus {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		exp, err := promexporter.New(promexporter.WithRegisterer(reg))
		if err != nil {
			return nil, errors.Join(fmt.Errorf("telemetry: prometheus exporter: %w", err), p.Shutdown(ctx))
		}
		readers = append(readers, sdkmetric.WithReader(exp))
		p.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	}
	if len(readers) > 0 {
		mp := sdkmetric.NewMeterProvider(append(readers, sdkmetric.WithResource(res))...)
		p.MeterProvider, p.Metrics = mp, true
		p.shutdown = append(p.shutdown, mp.Shutdown)
		otel.SetMeterProvider(mp)
	}
	return p, nil
}

// propagator returns the propagators OTEL_PROPAGATORS names, through the
// contrib autoprop package: W3C trace context and baggage when it is
// unset; an error for a name it does not know (autoprop itself would only
// report it to OpenTelemetry's error handler and go on without it).
func propagator() (propagation.TextMapPropagator, error) {
	v := os.Getenv("OTEL_PROPAGATORS")
	if strings.TrimSpace(v) == "" {
		return autoprop.NewTextMapPropagator(), nil
	}
	var names []string
	for n := range strings.SplitSeq(v, ",") {
		names = append(names, strings.TrimSpace(n))
	}
	p, err := autoprop.TextMapPropagator(names...)
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTEL_PROPAGATORS: %w", err)
	}
	return p, nil
}

// wanted reports whether a signal is to be exported: its exporter
// variable names one other than none, or, unset, an OTLP endpoint is set
// for every signal or for this one.
func wanted(exporterVar, endpointVar string) bool {
	if v := strings.TrimSpace(os.Getenv(exporterVar)); v != "" {
		return v != "none"
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv(endpointVar) != ""
}

// Enabled reports whether anything is recorded: traces or metrics.
func (p *Providers) Enabled() bool { return p.Tracing || p.Metrics }

// ServerHandler returns the gRPC stats handler that starts the server
// span of each RPC (otelgrpc), continuing the client's W3C traceparent,
// and records the RPC metrics; nil when nothing is recorded. Health
// checks and reflection are not traced.
func (p *Providers) ServerHandler() stats.Handler {
	if !p.Enabled() {
		return nil
	}
	return otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(p.TracerProvider),
		otelgrpc.WithMeterProvider(p.MeterProvider),
		otelgrpc.WithPropagators(p.Propagator),
		otelgrpc.WithFilter(func(info *stats.RPCTagInfo) bool { return !housekeeping(info.FullMethodName) }),
	)
}

// housekeeping reports whether a gRPC method (its full name,
// /package.Service/Method) is a health check or server reflection: RPCs
// that are neither traced nor logged above DEBUG.
func housekeeping(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/grpc.health.v1.") || strings.HasPrefix(fullMethod, "/grpc.reflection.")
}

// MetricsHandler serves every instrument in the Prometheus text format;
// nil unless Setup was asked for Prometheus.
func (p *Providers) MetricsHandler() http.Handler { return p.metrics }

// Shutdown flushes what is buffered and stops the exporters.
func (p *Providers) Shutdown(ctx context.Context) error {
	var errs []error
	for _, f := range p.shutdown {
		errs = append(errs, f(ctx))
	}
	p.shutdown = nil
	return errors.Join(errs...)
}
