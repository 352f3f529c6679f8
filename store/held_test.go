package store_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"runtime"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/store"
)

// TestOwnedRunsHoldNoGoroutine: a run this replica owns holds no goroutine
// of its own while it waits for its next event (a slow model's turn, held
// open for minutes): its sender runs only while it has events to store,
// its lease renewal is a timer, and its signals come through the store's
// one inbox. The signals still reach each run, in its own reply, and a
// run given up still answers none (no responders: fs.ErrNotExist).
func TestOwnedRunsHoldNoGoroutine(t *testing.T) {
	cfg := store.DefaultConfig()
	cfg.Dir = ""
	cfg.LeaseTTL = time.Minute // no renewal during the count
	s, err := store.Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := t.Context()

	own := func(id string) {
		t.Helper()
		created, _, err := s.Create(ctx, id, 1, []byte("req"), func(sig string) []byte { return []byte(id + ":" + sig) })
		if err != nil || !created {
			t.Fatalf("create %s: %v %v", id, created, err)
		}
		stored := make(chan error, 1)
		if err := s.Append(ctx, id, 1, []byte("ev"), func(err error) { stored <- err }); err != nil {
			t.Fatal(err)
		}
		if err := <-stored; err != nil {
			t.Fatalf("append %s: %v", id, err)
		}
	}
	// One run first, so that the store's pooled goroutines exist.
	own("warm")
	if err := s.Finish(ctx, "warm", 1); err != nil {
		t.Fatal(err)
	}
	const runs = 200
	before := settledGoroutines()
	for i := range runs {
		own(fmt.Sprintf("held-%d", i))
	}
	// Four per run before (the sender, one per subscription, the
	// renewal); a few may still be on their way back to the pool.
	if held := settledGoroutines() - before; held > runs/10 {
		t.Errorf("%d runs waiting for their next event hold %d more goroutines, want at most %d", runs, held, runs/10)
	}
	for _, i := range []int{0, runs / 2, runs - 1} {
		id := fmt.Sprintf("held-%d", i)
		reply, err := s.Signal(ctx, id, 1, "ping")
		if err != nil || string(reply) != id+":ping" {
			t.Errorf("signal to %s: %q, %v; want its own reply", id, reply, err)
		}
	}
	for i := range runs {
		if err := s.Finish(ctx, fmt.Sprintf("held-%d", i), 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Signal(ctx, "held-0", 1, "ping"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("signal to a run given up: %v, want fs.ErrNotExist", err)
	}
}

// settledGoroutines counts the goroutines once the count has stopped
// falling for a moment (goroutines on their way out end).
func settledGoroutines() int {
	n := runtime.NumGoroutine()
	for range 50 {
		time.Sleep(10 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m >= n {
			return m
		}
		n = m
	}
	return n
}
