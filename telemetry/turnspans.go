package telemetry

import (
	"context"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// turnKey carries a turn's id in the context [Observer.TurnStart] returns,
// which reaches every span started within the turn.
type turnKey struct{}

// TurnIDProcessor returns a span processor that puts turnstile.turn.id on
// every span started within a turn (from a context that
// [Observer.TurnStart] returned, or one derived from it): the spans
// turnstile starts carry it anyway, and so, through this processor, do
// those other instrumentation starts beneath them, such as the provider
// HTTP requests' otelhttp spans. [Setup] installs it; a tracer provider
// built another way needs it for those spans to carry the turn id.
func TurnIDProcessor() sdktrace.SpanProcessor { return turnIDProcessor{} }

type turnIDProcessor struct{}

// OnStart implements [sdktrace.SpanProcessor].
func (turnIDProcessor) OnStart(parent context.Context, s sdktrace.ReadWriteSpan) {
	if id, ok := parent.Value(turnKey{}).(string); ok {
		s.SetAttributes(keyTurnID.String(id))
	}
}

// OnEnd implements [sdktrace.SpanProcessor].
func (turnIDProcessor) OnEnd(sdktrace.ReadOnlySpan) {}

// Shutdown implements [sdktrace.SpanProcessor].
func (turnIDProcessor) Shutdown(context.Context) error { return nil }

// ForceFlush implements [sdktrace.SpanProcessor].
func (turnIDProcessor) ForceFlush(context.Context) error { return nil }
