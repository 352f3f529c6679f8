package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// openEmbedded opens an embedded store, its log in files under a
// directory of the test's (the default configuration's shape) or in
// memory when dir is "".
func openEmbedded(t *testing.T, dir string) *Store {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Dir, cfg.LeaseTTL = dir, 500*time.Millisecond
	s, err := Open(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// leaseMessages returns how many messages the lease bucket's stream has
// ever taken (its last sequence: a tombstone or marker that aged out
// counts too).
func leaseMessages(t *testing.T, s *Store) uint64 {
	t.Helper()
	st, err := s.js.Stream(t.Context(), leaseStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

// TestEmbeddedTurnsPublishNoLease: with the embedded store, a run's
// ownership is held in the process (see [leases.local]): short turns
// (created, appended to, signalled, finished), a run claimed after its
// owner went away and one released publish nothing to the lease bucket,
// neither a lease, a renewal nor a tombstone: no message on its subjects,
// and its stream took none.
func TestEmbeddedTurnsPublishNoLease(t *testing.T) {
	for _, dir := range []string{"files", ""} {
		t.Run(fmt.Sprintf("dir=%q", dir), func(t *testing.T) {
			if dir != "" {
				dir = t.TempDir()
			}
			s := openEmbedded(t, dir)
			ctx := t.Context()
			sub, err := s.nc.SubscribeSync("$KV." + LeaseBucket + ".>")
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()
			if err := s.nc.Flush(); err != nil {
				t.Fatal(err)
			}

			const turns = 50
			for i := range turns {
				id := fmt.Sprintf("short-%d", i)
				created, _, err := s.Create(ctx, id, 1, []byte("req"), func(sig string) []byte { return []byte(id + ":" + sig) })
				if err != nil || !created {
					t.Fatalf("Create %s = %v, %v", id, created, err)
				}
				for e := range 3 {
					if err := s.Append(ctx, id, 1, fmt.Appendf(nil, "e%d", e), func(error) {}); err != nil {
						t.Fatal(err)
					}
				}
				if i%10 == 0 {
					if reply, err := s.Signal(ctx, id, 1, "ping"); err != nil || string(reply) != id+":ping" {
						t.Fatalf("Signal %s = %q, %v", id, reply, err)
					}
				}
				if err := s.Finish(ctx, id, 1); err != nil {
					t.Fatalf("Finish %s: %v", id, err)
				}
			}
			// A run adopted after it ended (as a watcher's adoption
			// claims it), and one released at a drain.
			nop := func(string) []byte { return nil }
			if _, _, _, err := s.Claim(ctx, "short-0", 1, nop); err != nil {
				t.Fatalf("Claim: %v", err)
			}
			if err := s.Finish(ctx, "short-0", 1); err != nil {
				t.Fatal(err)
			}
			if created, _, err := s.Create(ctx, "released", 1, []byte("req"), nop); err != nil || !created {
				t.Fatalf("Create = %v, %v", created, err)
			}
			if err := s.Release(ctx, "released", 1); err != nil {
				t.Fatal(err)
			}

			if err := s.nc.Flush(); err != nil {
				t.Fatal(err)
			}
			if m, err := sub.NextMsg(100 * time.Millisecond); !errors.Is(err, nats.ErrTimeout) {
				t.Errorf("a message on the lease bucket's subjects: %v, %v; want none", m, err)
			}
			if n := leaseMessages(t, s); n != 0 {
				t.Errorf("the lease bucket's stream took %d messages, want none", n)
			}
		})
	}
}

// TestEmbeddedReleasedRunTakenOver: with the embedded store, a run its
// owner released without ending it (a drain's hand-off) is reported to
// WatchExpired in the process at once, as its lease's purge was, and to a
// WatchExpired that starts later (within markerTTL, as the purge's marker
// was); a claim takes it over with its events. Of concurrent claims in the
// process one wins, as one wins the lease; a run the process owns or
// finished is never reported, and the owner's own claim is refused.
func TestEmbeddedReleasedRunTakenOver(t *testing.T) {
	s := openEmbedded(t, t.TempDir())
	ctx, cancel := context.WithCancel(t.Context())
	type report struct {
		watcher string
		run     runKey
	}
	reports := make(chan report, 16)
	var watches sync.WaitGroup
	defer watches.Wait()
	defer cancel()
	watch := func(name string) {
		watches.Go(func() {
			if err := s.WatchExpired(ctx, func(id string, attempt uint32) { reports <- report{name, runKey{id, attempt}} }); err != nil {
				t.Errorf("WatchExpired: %v", err)
			}
		})
	}
	watch("first")
	nop := func(string) []byte { return nil }
	for _, id := range []string{"released", "finished"} {
		if created, _, err := s.Create(ctx, id, 1, []byte("req-"+id), nop); err != nil || !created {
			t.Fatalf("Create %s = %v, %v", id, created, err)
		}
		stored := make(chan error, 1)
		if err := s.Append(ctx, id, 1, []byte("e1"), func(err error) { stored <- err }); err != nil {
			t.Fatal(err)
		}
		if err := <-stored; err != nil {
			t.Fatal(err)
		}
	}
	if _, _, _, err := s.Claim(ctx, "released", 1, nop); !errors.Is(err, ErrNotClaimed) {
		t.Fatalf("claim of a run the process owns: %v, want ErrNotClaimed", err)
	}
	if err := s.Finish(ctx, "finished", 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, "released", 1); err != nil {
		t.Fatal(err)
	}
	want := runKey{"released", 1}
	next := func() report {
		t.Helper()
		select {
		case r := <-reports:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("no run reported within 10s")
			return report{}
		}
	}
	if r := next(); r != (report{"first", want}) {
		t.Fatalf("reported %+v, want the released run to the first watcher", r)
	}
	watch("later")
	if r := next(); r != (report{"later", want}) {
		t.Fatalf("reported %+v, want the released run to the later watcher", r)
	}

	// The takeover: claims race, one wins.
	const claimers = 8
	var wins sync.WaitGroup
	var mu sync.Mutex
	var got []string
	var errs []error
	for range claimers {
		wins.Go(func() {
			record, events, claims, err := s.Claim(ctx, want.turnID, want.attempt, nop)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			got = append(got, fmt.Sprintf("%s %q %d", record, events, claims))
		})
	}
	wins.Wait()
	if len(got) != 1 || got[0] != `req-released ["e1"] 1` {
		t.Errorf("claims won: %q; want one with the run's record and events", got)
	}
	for _, err := range errs {
		if !errors.Is(err, ErrNotClaimed) {
			t.Errorf("a losing claim: %v, want ErrNotClaimed", err)
		}
	}
	if !s.leases.heldHere(want) {
		t.Error("the run taken over is not held by the process")
	}
	if err := s.Append(ctx, want.turnID, want.attempt, []byte("e2"), func(error) {}); err != nil {
		t.Fatalf("append after the takeover: %v", err)
	}
	if err := s.Finish(ctx, want.turnID, want.attempt); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-reports:
		t.Errorf("reported %+v after the takeover; want nothing more (finished runs are never reported)", r)
	case <-time.After(3 * s.cfg.LeaseTTL):
	}
	if n := leaseMessages(t, s); n != 0 {
		t.Errorf("the lease bucket's stream took %d messages, want none", n)
	}
}
