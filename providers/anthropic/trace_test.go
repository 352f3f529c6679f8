package anthropic

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestOneSpanPerCall streams a reply inside a traced model call, with
// OpenTelemetry's globals set as `turnstile serve` sets them: the SDK's
// own anthropic.messages.create span (a second GenAI chat span with the
// call's usage) is not made, and the HTTP request is the only span under
// the call's, whose trace context it still carries.
func TestOneSpanPerCall(t *testing.T) {
	body, err := os.ReadFile("testdata/anthropic_ok.sse")
	if err != nil {
		t.Fatal(err)
	}
	var traceparent string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		traceparent = r.Header.Get("traceparent")
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(body)
	}))
	defer srv.Close()

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(t.Context())
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() {
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
	})

	p := newProvider(t, srv.URL, nil)
	ctx, call := tp.Tracer("test").Start(t.Context(), "chat claude-sonnet-4-5")
	for _, err := range p.Stream(ctx, simpleRequest) {
		if err != nil {
			t.Fatal(err)
		}
	}
	call.End()

	spans := rec.Ended()
	var names []string
	for _, s := range spans {
		names = append(names, s.Name())
	}
	if len(spans) != 2 {
		t.Fatalf("spans %q, want the HTTP request's and the call's", names)
	}
	httpSpan := spans[0]
	if httpSpan.Name() != "HTTP POST" || httpSpan.Parent().SpanID() != call.SpanContext().SpanID() {
		t.Errorf("span %q with parent %s, want the HTTP POST under the call's span %s", httpSpan.Name(), httpSpan.Parent().SpanID(), call.SpanContext().SpanID())
	}
	if want := "00-" + call.SpanContext().TraceID().String() + "-" + httpSpan.SpanContext().SpanID().String() + "-01"; traceparent != want {
		t.Errorf("traceparent %q, want %q", traceparent, want)
	}
}
