package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// Triggers of a compaction, the values of turnstile.compaction.trigger:
// the wire's CompactionTrigger in lower case.
const (
	triggerNearWindow = "near_window"
	triggerOverflow   = "overflow"
)

// Compaction adds the compaction to the turn's span as an event and counts
// it by model, strategy and trigger, whichever the trigger: before a call
// (the conversation neared the model's window) or after an overflow. A
// summary call's tokens and cost go on the event, and its cost on the
// cost counter under the summarizing model, as a model call's do.
func (o *Observer) Compaction(ctx context.Context, c runtime.CompactionInfo) {
	trigger := triggerOverflow
	if c.BeforeCall {
		trigger = triggerNearWindow
	}
	model, strategy, trig := keyModel.String(c.Model), keyCompactionStrategy.String(c.Strategy), keyCompactionTrigger.String(trigger)
	o.m.compactions.Add(ctx, 1, metric.WithAttributes(model, strategy, trig))
	ev := []attribute.KeyValue{model, strategy, trig,
		keyCompactionMessagesBefore.Int(c.MessagesBefore), keyCompactionMessagesAfter.Int(c.MessagesAfter)}
	if !c.BeforeCall {
		ev = append(ev, keyErrorType.String(llm.KindContextOverflow.String()), keyAttempt.Int(c.Attempt))
	}
	if c.SummaryModel != "" {
		ev = append(ev, keyCompactionSummaryModel.String(c.SummaryModel))
		ev = append(ev, usageAttrs(c.SummaryUsage)...)
		ev = append(ev, costAttrs(c.SummaryUsage.Cost)...)
		if c.SummaryError != "" {
			// The error's text is in the Compaction event; a span gets
			// only that the summary failed.
			ev = append(ev, keyCompactionSummaryFailed.Bool(true))
		}
	}
	trace.SpanFromContext(ctx).AddEvent(eventCompaction, trace.WithAttributes(ev...))
	if cost := c.SummaryUsage.Cost; cost.Priced {
		set := []attribute.KeyValue{keyModel.String(c.SummaryModel), keyProvider.String(c.SummaryProvider), keyCostCurrency.String(cost.Currency)}
		if client, ok := ctx.Value(clientKey{}).(string); ok {
			set = append(set, keyClient.String(client))
		}
		o.m.cost.Add(ctx, units(cost.Nanos), metric.WithAttributes(set...))
	}
}
