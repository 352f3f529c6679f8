package telemetry

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// Metric names of the turn store.
const (
	metricStoreBytes       = "turnstile.store.bytes"
	metricStoreLimit       = "turnstile.store.limit"
	metricStoreUtilization = "turnstile.store.utilization"
	metricStoreOldestAge   = "turnstile.store.oldest_age"
	metricStoreTurns       = "turnstile.store.turns"
	metricStoreEvicted     = "turnstile.store.evicted"
	metricStoreFull        = "turnstile.store.full"
)

// StoreUsage is the turn store's size, as the store last read it.
type StoreUsage struct {
	// Bytes is what the log holds.
	Bytes uint64
	// Limit is what it may hold; 0 when nothing bounds it.
	Limit uint64
	// Oldest is when the oldest record kept was written; zero when none.
	Oldest time.Time
	// Turns is how many turns the log holds.
	Turns uint64
	// Evicted counts the finished runs removed to make room.
	Evicted uint64
	// Full says the store takes no new turn now.
	Full bool
}

// RegisterStoreMetrics reports the turn store's size through mp's
// gauges, reading usage at each collection (it must not block): the bytes
// held, the limit and the share of it used, the age of the oldest record
// kept, the turns held, the runs removed to make room, and whether new
// turns are refused.
// The returned function unregisters them.
func RegisterStoreMetrics(mp metric.MeterProvider, usage func() StoreUsage, now func() time.Time) (func() error, error) {
	if now == nil {
		now = time.Now
	}
	m := mp.Meter(instrumentationURL)
	var errs []error
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	bytes := gauge(metricStoreBytes, "By", "Bytes the turn store's log holds, every run's.")
	limit := gauge(metricStoreLimit, "By", "Bytes the turn store's log may hold: store.max_bytes, or less when JetStream's storage leaves less; absent when unbounded.")
	turns := gauge(metricStoreTurns, "{turn}", "Turns the turn store's log holds, finished or running; the oldest finished ones are removed above 0.9 of store.max_turns.")
	full := gauge(metricStoreFull, "1", "1 while the turn store takes no new turn (full of running turns, or its disk is), else 0.")
	util, err := m.Float64ObservableGauge(metricStoreUtilization, metric.WithUnit("1"),
		metric.WithDescription("Share of the turn store's limit in use, 0 to 1; the store removes finished runs above 0.9."))
	errs = append(errs, err)
	oldest, err := m.Float64ObservableGauge(metricStoreOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest record the turn store keeps: the retention in effect, when the store is full."))
	errs = append(errs, err)
	evicted, err := m.Int64ObservableCounter(metricStoreEvicted, metric.WithUnit("{run}"),
		metric.WithDescription("Finished runs the turn store removed to make room, before their retention."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	reg, err := m.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
		u := usage()
		obs.ObserveInt64(bytes, int64(u.Bytes))
		if u.Limit > 0 {
			obs.ObserveInt64(limit, int64(u.Limit))
			obs.ObserveFloat64(util, float64(u.Bytes)/float64(u.Limit))
		}
		if !u.Oldest.IsZero() {
			obs.ObserveFloat64(oldest, max(0, now().Sub(u.Oldest).Seconds()))
		}
		obs.ObserveInt64(turns, int64(u.Turns))
		obs.ObserveInt64(evicted, int64(u.Evicted))
		var f int64
		if u.Full {
			f = 1
		}
		obs.ObserveInt64(full, f)
		return nil
	}, bytes, limit, util, oldest, turns, evicted, full)
	if err != nil {
		return nil, err
	}
	return reg.Unregister, nil
}
