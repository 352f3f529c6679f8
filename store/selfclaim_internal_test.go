package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestNoClaimOfOwnRun: a replica whose own run's lease expired because its
// renewal stalled (a loaded process) does not take the run over from
// itself, which would fence its own turn out of the log.
func TestNoClaimOfOwnRun(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Dir, cfg.LeaseTTL = "", 500*time.Millisecond
	s, err := Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	if created, _, err := s.Create(ctx, "t", 1, []byte("req"), func(string) []byte { return nil }); err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	k := runKey{"t", 1}
	s.leases.mu.Lock()
	w := s.leases.runs[k]
	s.leases.mu.Unlock()
	// The renewal stalls: no beat, and the lease goes as an expired one
	// would.
	close(w.stop)
	w.renew.Wait()
	w.stop = make(chan struct{}) // Finish closes it again
	w.beatAt.Store(time.Now().Add(-time.Hour).UnixNano())
	if err := s.leases.dropLease(ctx, k); err != nil {
		t.Fatal(err)
	}
	_, _, _, err = s.Claim(ctx, "t", 1, func(string) []byte { return nil })
	if !errors.Is(err, ErrNotClaimed) {
		t.Fatalf("claim of this replica's own run: %v, want ErrNotClaimed", err)
	}
	if err := s.Append(ctx, "t", 1, []byte("still mine"), func(error) {}); err != nil {
		t.Fatalf("append after the refused claim: %v", err)
	}
	w.renew.Add(1) // giveUp waits for the renewal it stopped above
	w.renew.Done()
	if err := s.Finish(ctx, "t", 1); err != nil {
		t.Fatalf("finish: %v", err)
	}
}
