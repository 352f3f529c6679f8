package store_test

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestFinishedRunNeverExpires: a run that ended and gave its lease up is
// not a run whose owner died. Its lease's tombstone ages out of the lease
// bucket like any entry, and nothing may read that as an expiry: every
// replica would claim the finished run, read its log and give it up again,
// which leaves a new tombstone, forever, for every turn ever run.
func TestFinishedRunNeverExpires(t *testing.T) {
	s := open(t, "")
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var expired []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.WatchExpired(ctx, func(id string, _ uint32) {
			mu.Lock()
			expired = append(expired, id)
			mu.Unlock()
		})
	}()
	defer func() { cancel(); <-done }()

	if created, _, err := s.Create(ctx, "finished", 1, []byte("req"), func(string) []byte { return nil }); err != nil || !created {
		t.Fatalf("Create = %v, %v", created, err)
	}
	if err := s.Append(ctx, "finished", 1, []byte("e1"), func(error) {}); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, "finished", 1); err != nil {
		t.Fatal(err)
	}
	// Several lease TTLs (open sets 500ms): the tombstone has aged out by
	// then, and an expired lease would have been reported well before.
	time.Sleep(2500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(expired) != 0 {
		t.Errorf("a finished run was reported expired %d times: %v", len(expired), expired)
	}
}
