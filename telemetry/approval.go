package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/turnstile-dev/turnstile/runtime"
)

// Outcomes of a decision on a tool call that waited for approval.
const (
	outcomeApproved = "approved"
	outcomeDenied   = "denied"
	outcomeTimedOut = "timed_out"
)

// Approval adds the decision to the turn's span as an event, and records
// how long the call waited and the decision's outcome.
func (o *Observer) Approval(ctx context.Context, a runtime.ApprovalInfo) {
	outcome := outcomeDenied
	switch {
	case a.TimedOut:
		outcome = outcomeTimedOut
	case a.Approved:
		outcome = outcomeApproved
	}
	attrs := metric.WithAttributes(keyToolName.String(a.Name), keyOutcome.String(outcome))
	o.m.approvals.Add(ctx, 1, attrs)
	o.m.approvalWait.Record(ctx, a.Waited.Seconds(), attrs)
	ev := []attribute.KeyValue{keyToolName.String(a.Name), keyToolCallID.String(a.CallID), keyOutcome.String(outcome), keyApprovalW.Float64(a.Waited.Seconds())}
	if a.DecidedBy != "" {
		ev = append(ev, keyDecidedBy.String(a.DecidedBy))
	}
	trace.SpanFromContext(ctx).AddEvent(eventApproval, trace.WithAttributes(ev...))
}

// Steer adds a steering message to the turn's span as an event (its size,
// never its text), and counts it.
func (o *Observer) Steer(ctx context.Context, s runtime.SteerInfo) {
	o.m.steered.Add(ctx, 1)
	trace.SpanFromContext(ctx).AddEvent(eventSteer, trace.WithAttributes(keySteerSize.Int(s.Bytes)))
}

// toolError is error.type for a tool call whose result is an error, and
// hedgeLost for a model call cancelled because the other call of its
// hedged pair answered first.
const (
	toolError = "tool_error"
	hedgeLost = "hedge_lost"
)
