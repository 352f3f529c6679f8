package telemetry_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/telemetry"
)

// TestStoreMetrics: the store's gauges report what its usage says at
// each collection, and stop once unregistered.
func TestStoreMetrics(t *testing.T) {
	p := newPipeline(t)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	usage := telemetry.StoreUsage{Bytes: 750, Limit: 1000, Oldest: now.Add(-90 * time.Minute), Turns: 7, Evicted: 3, Full: true}
	unregister, err := telemetry.RegisterStoreMetrics(p.mp, func() telemetry.StoreUsage { return usage }, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"turnstile.store.bytes":       "[ 750]",
		"turnstile.store.limit":       "[ 1000]",
		"turnstile.store.utilization": "[ 0.75]",
		"turnstile.store.oldest_age":  "[ 5400]",
		"turnstile.store.turns":       "[ 7]",
		"turnstile.store.evicted":     "[ 3]",
		"turnstile.store.full":        "[ 1]",
	}
	got := p.metrics(t)
	for name, w := range want {
		if g := fmt.Sprint(points(t, got[name])); g != w {
			t.Errorf("%s = %s, want %s", name, g, w)
		}
	}
	// Unbounded and empty: no limit, utilization or age.
	usage = telemetry.StoreUsage{Bytes: 10}
	got = p.metrics(t)
	for _, name := range []string{"turnstile.store.limit", "turnstile.store.utilization", "turnstile.store.oldest_age"} {
		if m, ok := got[name]; ok && len(points(t, m)) != 0 {
			t.Errorf("%s = %v with no bound and no record", name, points(t, m))
		}
	}
	if g := fmt.Sprint(points(t, got["turnstile.store.full"])); g != "[ 0]" {
		t.Errorf("full = %s", g)
	}
	if err := unregister(); err != nil {
		t.Fatal(err)
	}
	if m, ok := p.metrics(t)["turnstile.store.bytes"]; ok && len(points(t, m)) != 0 {
		t.Error("gauges reported after unregister")
	}
}
