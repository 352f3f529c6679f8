package httpfail

import (
	"context"
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/trace"
)

// traced wraps base with OpenTelemetry's HTTP client instrumentation
// (otelhttp) for the requests of a traced call, those whose context holds
// a span context (the model call's span): each carries the trace context
// in W3C traceparent and tracestate headers, through OpenTelemetry's
// global propagator, and is recorded as an HTTP client span, a child of
// the call's, with the HTTP client metrics. A request without a span
// context (telemetry off) goes straight to base, at no cost.
//
// The span's url.full never holds the query string: a base_url may carry
// a key there. The query is taken off the request otelhttp sees and put
// back on the one sent.
func traced(base http.RoundTripper) http.RoundTripper {
	return tracedTransport{base: base, otel: otelhttp.NewTransport(restoreQuery{next: base})}
}

// tracedTransport sends traced requests through otel, the others
// through base.
type tracedTransport struct {
	base, otel http.RoundTripper
}

// queryKey carries a hidden query string to restoreQuery.
type queryKey struct{}

func (t tracedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if !trace.SpanContextFromContext(r.Context()).IsValid() {
		return t.base.RoundTrip(r)
	}
	if r.URL == nil || r.URL.RawQuery == "" {
		return t.otel.RoundTrip(r)
	}
	hidden := r.Clone(context.WithValue(r.Context(), queryKey{}, r.URL.RawQuery))
	hidden.URL.RawQuery = ""
	resp, err := t.otel.RoundTrip(hidden)
	if resp != nil {
		resp.Request = r
	}
	return resp, err
}

// restoreQuery puts back the query string tracedTransport took off.
type restoreQuery struct{ next http.RoundTripper }

func (q restoreQuery) RoundTrip(r *http.Request) (*http.Response, error) {
	if raw, ok := r.Context().Value(queryKey{}).(string); ok {
		r = r.Clone(r.Context())
		r.URL.RawQuery = raw
	}
	return q.next.RoundTrip(r)
}
