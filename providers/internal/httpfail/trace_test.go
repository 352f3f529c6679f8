package httpfail

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestTracedRequests sends requests through NewClient's client to a
// server that records what it receives: a request outside a traced call
// is sent as it is, even with OpenTelemetry set up; one inside carries
// the caller's trace context and is a child span of the caller's, whose
// url.full leaves out the query string the server still receives.
func TestTracedRequests(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []*http.Request
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Clone(r.Context()))
		mu.Unlock()
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	c := NewClient(0)
	get := func(req *http.Request) *http.Request {
		t.Helper()
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.Request != req {
			t.Error("the response does not point at the caller's request")
		}
		mu.Lock()
		defer mu.Unlock()
		return seen[len(seen)-1]
	}

	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/v1/x?key=s3cret&alt=sse", nil)
	if got := get(req); got.Header.Get("traceparent") != "" || got.URL.RawQuery != "key=s3cret&alt=sse" {
		t.Errorf("untraced request: traceparent %q, query %q", got.Header.Get("traceparent"), got.URL.RawQuery)
	}

	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(t.Context())
	req, _ = http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/v1/x", nil)
	if got := get(req); got.Header.Get("traceparent") != "" || len(rec.Ended()) != 0 {
		t.Errorf("a request outside a traced call: traceparent %q, %d spans", got.Header.Get("traceparent"), len(rec.Ended()))
	}
	ctx, parent := tp.Tracer("test").Start(t.Context(), "chat m")
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/x?key=s3cret&alt=sse", strings.NewReader("{}"))
	got := get(req)
	parent.End()

	if got.URL.RawQuery != "key=s3cret&alt=sse" {
		t.Errorf("the server got query %q", got.URL.RawQuery)
	}
	if req.URL.RawQuery != "key=s3cret&alt=sse" {
		t.Errorf("the caller's request was changed: query %q", req.URL.RawQuery)
	}
	sent := got.Header.Get("traceparent")
	if !strings.HasPrefix(sent, "00-"+parent.SpanContext().TraceID().String()+"-") {
		t.Fatalf("traceparent = %q, want the caller's trace %s", sent, parent.SpanContext().TraceID())
	}
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want the HTTP span and its parent", len(spans))
	}
	httpSpan := spans[0]
	if httpSpan.Parent().SpanID() != parent.SpanContext().SpanID() || !strings.Contains(sent, httpSpan.SpanContext().SpanID().String()) {
		t.Errorf("HTTP span %s (parent %s) is not the child of the caller's span %s sent in traceparent %s",
			httpSpan.SpanContext().SpanID(), httpSpan.Parent().SpanID(), parent.SpanContext().SpanID(), sent)
	}
	for _, kv := range httpSpan.Attributes() {
		if strings.Contains(kv.Value.Emit(), "s3cret") {
			t.Errorf("span attribute %s = %q holds the query's key", kv.Key, kv.Value.Emit())
		}
		if kv.Key == "url.full" && kv.Value.AsString() != srv.URL+"/v1/x" {
			t.Errorf("url.full = %q, want %q", kv.Value.AsString(), srv.URL+"/v1/x")
		}
	}
}
