package store

import (
	"context"
	"errors"
	"io/fs"
	"testing"
	"time"
)

// TestSignalToARunGivenUpMeanwhile: a signal the inbox received for a run
// that was given up before the inbox's goroutine reached it is answered as
// "no owner", at once, instead of being dropped, which left its sender
// waiting for a reply that never came (an ApproveToolCall routed to a turn
// that had just ended hung).
func TestSignalToARunGivenUpMeanwhile(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Dir = ""
	s, err := Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	created, _, err := s.Create(t.Context(), "r", 1, []byte("req"), func(sig string) []byte { return []byte("ok:" + sig) })
	if err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	if reply, err := s.Signal(t.Context(), "r", 1, "ping"); err != nil || string(reply) != "ok:ping" {
		t.Fatalf("signal to the owned run: %q, %v", reply, err)
	}
	w, err := s.leases.writer("r", 1)
	if err != nil {
		t.Fatal(err)
	}
	// The window of a run being given up: still subscribed, no longer
	// known to the inbox.
	s.inbox.forget(w)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := s.Signal(ctx, "r", 1, "ping"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("signal to a run given up meanwhile: %v, want fs.ErrNotExist", err)
	}
	if s.leases.ownerRenewing(ctx, runKey{"r", 1}) {
		t.Error("a run given up meanwhile says it renews its lease")
	}
}
