package telemetry

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/turnstile-dev/turnstile/policy"
)

// instruments are the Observer's metric instruments.
type instruments struct {
	operationDuration metric.Float64Histogram
	tokenUsage        metric.Int64Histogram
	timeToFirstChunk  metric.Float64Histogram
	toolDuration      metric.Float64Histogram
	agentDuration     metric.Float64Histogram
	attempts          metric.Int64Counter
	retries           metric.Int64Counter
	fallbacks         metric.Int64Counter
	cooldowns         metric.Int64Counter
	hedges            metric.Int64Counter
	turns             metric.Int64Counter
	active            metric.Int64UpDownCounter
	turnWait          metric.Float64Histogram
	turnTokens        metric.Int64Counter
	cost              metric.Float64Counter
	approvals         metric.Int64Counter
	approvalWait      metric.Float64Histogram
	steered           metric.Int64Counter
	compactions       metric.Int64Counter
}

// Bucket boundaries the GenAI conventions give.
var (
	secondsBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	tokenBuckets   = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
	agentBuckets   = []float64{0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 51.2, 102.4, 204.8, 409.6}
)

func newInstruments(m metric.Meter, health func() []policy.ModelHealth, clock func() time.Time) (instruments, error) {
	var (
		in   instruments
		errs []error
	)
	f64 := func(name, desc string, buckets []float64) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(buckets...))
		errs = append(errs, err)
		return h
	}
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	in.operationDuration = f64(metricOperationDuration, "Duration of a model call, failed ones included.", secondsBuckets)
	in.timeToFirstChunk = f64(metricTimeToFirstChunk, "Time from a model call's start to its first streamed chunk.", secondsBuckets)
	in.toolDuration = f64(metricToolDuration, "Duration of a server-side tool call.", secondsBuckets)
	in.agentDuration = f64(metricAgentDuration, "Duration of a turn, from its start to its last event.", agentBuckets)
	in.turnWait = f64(metricTurnWait, "Time a turn spent waiting in backoff before retries.", secondsBuckets)
	in.approvalWait = f64(metricApprovalWait, "Time a tool call waited for approval, by tool and outcome.", agentBuckets)
	var err error
	in.cost, err = m.Float64Counter(metricCost, metric.WithUnit("{currency}"),
		metric.WithDescription("What model calls cost at the configured prices, in units of turnstile.cost.currency, by model, provider, deployment and client; calls of models without a price are not counted."))
	errs = append(errs, err)
	in.tokenUsage, err = m.Int64Histogram(metricTokenUsage, metric.WithUnit("{token}"),
		metric.WithDescription("Tokens used by a model call, by type (input includes cached input)."),
		metric.WithExplicitBucketBoundaries(tokenBuckets...))
	errs = append(errs, err)
	in.attempts = counter(metricAttempts, "{attempt}", "Model calls made, by model and, for failed ones, error class.")
	in.retries = counter(metricRetries, "{retry}", "Retries on the same model, by model and error class.")
	in.fallbacks = counter(metricFallbacks, "{fallback}", "Moves to the next model of a chain, by model, target and error class.")
	in.cooldowns = counter(metricCooldowns, "{cooldown}", "Cooldowns started on a model, by model and error class.")
	in.hedges = counter(metricHedges, "{call}", "Hedged calls started, by the slow call's model and the hedge's.")
	in.turns = counter(metricTurns, "{turn}", "Turns ended, by model asked, end reason or error code, and client.")
	in.turnTokens = counter(metricTurnTokens, "{token}", "Tokens used by turns, by model asked, type and client.")
	in.approvals = counter(metricApprovals, "{decision}", "Decisions on tool calls that waited for approval, by tool and outcome (approved, denied, timed_out).")
	in.steered = counter(metricSteered, "{message}", "Steering messages turns committed.")
	in.compactions = counter(metricCompactions, "{compaction}", "Compactions of turns' conversations, by model, strategy and trigger (near_window before a call, overflow after one).")
	in.active, err = m.Int64UpDownCounter(metricTurnsActive, metric.WithUnit("{turn}"), metric.WithDescription("Turns in flight, by model asked."))
	errs = append(errs, err)
	if health != nil {
		budget, err := m.Float64ObservableGauge(metricRetryBudget, metric.WithUnit("{token}"),
			metric.WithDescription("Retry budget left per model; retries stop while less than one token is left."))
		errs = append(errs, err)
		// {model}: summed over the models, it counts those cooling down
		// (and Prometheus keeps the name, which "1" would suffix _ratio).
		cooling, err := m.Int64ObservableGauge(metricCoolingDown, metric.WithUnit("{model}"),
			metric.WithDescription("1 while new turns skip the model (cooldown or half-open probe), else 0."))
		errs = append(errs, err)
		if err := errors.Join(errs...); err != nil {
			return in, err
		}
		_, err = m.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
			now := clock()
			for _, h := range health() {
				attrs := metric.WithAttributes(keyModel.String(h.Alias))
				if h.Deployment != "" {
					attrs = metric.WithAttributes(keyModel.String(h.Alias), keyDeployment.String(h.Deployment))
				}
				if h.BudgetMax > 0 {
					obs.ObserveFloat64(budget, h.BudgetTokens, attrs)
				}
				state := int64(0)
				if h.CoolingDown(now) {
					state = 1
				}
				obs.ObserveInt64(cooling, state, attrs)
			}
			return nil
		}, budget, cooling)
		errs = append(errs, err)
	}
	return in, errors.Join(errs...)
}
