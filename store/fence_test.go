package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/internal/natstest"
)

// TestTakeoverFencesTheOldOwner: a replica whose owner stopped renewing
// its lease (a paused process) is taken over by another, which sees every
// event stored; the old owner, when it wakes up, can append nothing more.
func TestTakeoverFencesTheOldOwner(t *testing.T) {
	url := natstest.Start(t)
	openOn := func() *Store {
		cfg := DefaultConfig()
		cfg.Mode, cfg.NATS.URL, cfg.LeaseTTL = ModeNATS, url, 500*time.Millisecond
		s, err := Open(context.Background(), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := openOn(), openOn()
	defer a.Close()
	defer b.Close()
	ctx := context.Background()

	expired := make(chan string, 4)
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan error, 1)
	go func() {
		watched <- b.WatchExpired(wctx, func(id string, attempt uint32) { expired <- fmt.Sprintf("%s/%d", id, attempt) })
	}()

	if _, _, err := a.Create(ctx, "t.1", 2, []byte("req"), func(string) []byte { return nil }); err != nil {
		t.Fatal(err)
	}
	for _, e := range []string{"e1", "e2"} {
		if err := a.Append(ctx, "t.1", 2, []byte(e), func(error) {}); err != nil {
			t.Fatal(err)
		}
	}
	// a stops renewing, as a paused process would.
	w, _ := a.writer("t.1", 2)
	close(w.stop)
	w.renew.Wait()
	w.stop = make(chan struct{}) // Finish closes it again

	// While a's lease lasts (its first write is not waited for), a claim
	// fails.
	for _, err := b.leases.Get(ctx, runKey{"t.1", 2}.lease()); err != nil; _, err = b.leases.Get(ctx, runKey{"t.1", 2}.lease()) {
		time.Sleep(time.Millisecond)
	}
	if _, _, _, err := b.Claim(ctx, "t.1", 2, func(string) []byte { return nil }); !errors.Is(err, ErrNotClaimed) {
		t.Fatalf("claim of a run whose lease is held: %v", err)
	}
	select {
	case got := <-expired:
		if got != "t.1/2" {
			t.Fatalf("expired %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the expired lease was not seen")
	}
	rec, evs, claims, err := b.Claim(ctx, "t.1", 2, func(string) []byte { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if claims != 1 {
		t.Errorf("the run's first claim counts %d claims, want 1", claims)
	}
	if string(rec) != "req" || fmt.Sprintf("%q", evs) != `["e1" "e2"]` {
		t.Fatalf("claimed %q with %q", rec, evs)
	}
	if err := b.Append(ctx, "t.1", 2, []byte("e3"), func(error) {}); err != nil {
		t.Fatal(err)
	}
	// The old owner wakes up: its append is refused.
	failed := make(chan error, 1)
	if err := a.Append(ctx, "t.1", 2, []byte("zombie"), func(err error) { failed <- err }); err != nil {
		t.Fatal(err)
	}
	if err := <-failed; !errors.Is(err, ErrLost) {
		t.Fatalf("zombie append: %v, want ErrLost", err)
	}
	if err := a.Finish(ctx, "t.1", 2); !errors.Is(err, ErrLost) {
		t.Errorf("zombie Finish: %v", err)
	}
	if err := b.Finish(ctx, "t.1", 2); err != nil {
		t.Fatal(err)
	}
	all, err := b.readAll(ctx, runKey{"t.1", 2})
	if err != nil || fmt.Sprintf("%q", all) != `["e1" "e2" "e3"]` {
		t.Fatalf("log = %q, %v", all, err)
	}
	stopWatch()
	if err := <-watched; err != nil {
		t.Fatal(err)
	}
}
