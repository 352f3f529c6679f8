package httpfail

import (
	"context"
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
)

// traced wraps base with OpenTelemetry's HTTP client instrumentation
// (otelhttp): each request carries the caller's trace context in W3C
// traceparent and tracestate headers, through OpenTelemetry's global
// propagator, and is recorded as an HTTP client span, a child of the span
// in the request's context (the model call's), with the HTTP metrics.
// With OpenTelemetry's no-op globals it adds no header and records
// nothing.
//
// The span's url.full never holds the query string: a base_url may carry
// a key there. The query is taken off the request otelhttp sees and put
// back on the one sent.
func traced(base http.RoundTripper) http.RoundTripper {
	return hideQuery{next: otelhttp.NewTransport(restoreQuery{next: base})}
}

// queryKey carries a hidden query string from hideQuery to restoreQuery.
type queryKey struct{}

// hideQuery passes the request on without its query string, which it
// keeps in the request's context.
type hideQuery struct{ next http.RoundTripper }

func (h hideQuery) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL == nil || r.URL.RawQuery == "" {
		return h.next.RoundTrip(r)
	}
	hidden := r.Clone(context.WithValue(r.Context(), queryKey{}, r.URL.RawQuery))
	hidden.URL.RawQuery = ""
	resp, err := h.next.RoundTrip(hidden)
	if resp != nil {
		resp.Request = r
	}
	return resp, err
}

// restoreQuery puts back the query string hideQuery kept.
type restoreQuery struct{ next http.RoundTripper }

func (q restoreQuery) RoundTrip(r *http.Request) (*http.Response, error) {
	if raw, ok := r.Context().Value(queryKey{}).(string); ok {
		r = r.Clone(r.Context())
		r.URL.RawQuery = raw
	}
	return q.next.RoundTrip(r)
}
