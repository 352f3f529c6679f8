package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/internal/natstest"
)

// TestCounters: a shared counter is created once, changed only at the
// revision it was read at (a stale swap loses, with no error), and every
// change reaches the replicas' watches with its window and total.
func TestCounters(t *testing.T) {
	url := natstest.Start(t)
	a, b := openNATS(t, url), openNATS(t, url)
	ctx := t.Context()

	type seen struct {
		window string
		total  int64
	}
	got := make(chan seen, 16)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- b.Shared().WatchCounters(wctx, func(name, window string, total int64, at time.Time, _ uint64) {
			if name == "team\x1fcost_per_day" && !at.IsZero() {
				got <- seen{window, total}
			}
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchCounters: %v", err)
		}
	}()

	const name = "team\x1fcost_per_day"
	if w, total, _, rev, err := a.Shared().LoadCounter(ctx, name); err != nil || w != "" || total != 0 || rev != 0 {
		t.Fatalf("an unknown counter: %q %d rev %d, %v", w, total, rev, err)
	}
	rev1, ok, err := a.Shared().SwapCounter(ctx, name, "2026-11-25", 18_750_000, 0)
	if err != nil || !ok {
		t.Fatalf("create: %v %v", ok, err)
	}
	if _, ok, err := b.Shared().SwapCounter(ctx, name, "2026-11-25", 1, 0); ok || err != nil {
		t.Errorf("a second create: swapped %v, %v; want a lost swap", ok, err)
	}
	rev2, ok, err := b.Shared().SwapCounter(ctx, name, "2026-11-25", 37_500_000, rev1)
	if err != nil || !ok {
		t.Fatalf("update: %v %v", ok, err)
	}
	if _, ok, err := a.Shared().SwapCounter(ctx, name, "2026-11-25", 1, rev1); ok || err != nil {
		t.Errorf("a stale update: swapped %v, %v; want a lost swap", ok, err)
	}
	w, total, at, rev, err := a.Shared().LoadCounter(ctx, name)
	if err != nil || w != "2026-11-25" || total != 37_500_000 || rev != rev2 || time.Since(at) > time.Minute {
		t.Errorf("load: %q %d %v rev %d (want %d), %v", w, total, at, rev, rev2, err)
	}
	// The watch may start after the first write: it sees the latest value,
	// and then each change.
	for {
		select {
		case s := <-got:
			if s.window != "2026-11-25" || s.total != 18_750_000 && s.total != 37_500_000 {
				t.Fatalf("watched %+v", s)
			}
			if s.total == 37_500_000 {
				return
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the watch did not see the last value")
		}
	}
}

// TestGaugeExpires: a replica's gauge is watched by the others and is gone
// from the store once its TTL passed without a refresh.
func TestGaugeExpires(t *testing.T) {
	url := natstest.Start(t)
	a, b := openNATS(t, url), openNATS(t, url)
	const name = "team\x1frunning\x1fa"
	seen := make(chan int64, 4)
	wctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- b.Shared().WatchCounters(wctx, func(n, _ string, total int64, _ time.Time, _ uint64) {
			if n == name {
				seen <- total
			}
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchCounters: %v", err)
		}
	}()
	a.Shared().PutGauge(name, 3, time.Second)
	select {
	case n := <-seen:
		if n != 3 {
			t.Errorf("watched %d, want 3", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watch did not see the gauge")
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, total, _, rev, err := b.Shared().LoadCounter(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		if rev == 0 && total == 0 {
			return // expired
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gauge is still stored (%d) after its TTL", total)
		}
	}
}
