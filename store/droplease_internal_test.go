package store

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnstile-dev/turnstile/internal/natstest"
)

// TestDroppedLeaseTombstone: a finished run's lease is given up by a
// tombstone (see dropLease), with the lease bucket in files (a NATS
// server, where a replica on another connection reads it). The key reads
// as deleted; another replica's claim of the run creates the lease over
// it; and once the tombstone aged out of the bucket the key's subject
// holds nothing, no marker: no replica's watcher reported the run expired
// at any point. The embedded store writes no lease (see [leases.local]):
// there the same holds of the process's hold on the run, and the lease's
// subject never holds a message.
func TestDroppedLeaseTombstone(t *testing.T) {
	const ttl = 500 * time.Millisecond
	for _, mode := range []string{ModeEmbedded, ModeNATS} {
		t.Run(mode, func(t *testing.T) {
			var a, b *Store
			if mode == ModeEmbedded {
				cfg := DefaultConfig()
				cfg.Dir, cfg.LeaseTTL = t.TempDir(), ttl // the log in files, the leases in memory
				var err error
				if a, err = Open(t.Context(), cfg, nil); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(a.Close)
				b = a
			} else {
				url := natstest.Start(t)
				a, b = openTestReplica(t, url, ttl), openTestReplica(t, url, ttl)
			}
			ctx, cancel := context.WithCancel(t.Context())
			var mu sync.Mutex
			var expired []string
			var watches sync.WaitGroup
			for _, s := range []*Store{a, b} {
				watches.Go(func() {
					_ = s.WatchExpired(ctx, func(id string, _ uint32) {
						mu.Lock()
						expired = append(expired, id)
						mu.Unlock()
					})
				})
			}
			defer watches.Wait()
			defer cancel()

			nop := func(string) []byte { return nil }
			k := runKey{"dropped", 1}
			if created, _, err := a.Create(ctx, k.turnID, k.attempt, []byte("req"), nop); err != nil || !created {
				t.Fatalf("Create = %v, %v", created, err)
			}
			if err := a.Finish(ctx, k.turnID, k.attempt); err != nil {
				t.Fatal(err)
			}
			if _, err := b.leases.kv.Get(ctx, k.lease()); !errors.Is(err, jetstream.ErrKeyNotFound) {
				t.Fatalf("the dropped lease: %v, want ErrKeyNotFound", err)
			}
			if mode == ModeEmbedded && a.leases.heldHere(k) {
				t.Fatal("the finished run is still held by the process")
			}
			// A claim now (an adoption of the ended run, as a WatchTurn
			// makes) takes the lease over the tombstone.
			if _, _, _, err := b.Claim(ctx, k.turnID, k.attempt, nop); err != nil {
				t.Fatalf("Claim over the tombstone: %v", err)
			}
			if mode == ModeEmbedded {
				if !b.leases.heldHere(k) {
					t.Fatal("the claimed run is not held by the process")
				}
			} else if e, err := a.leases.kv.Get(ctx, k.lease()); err != nil || string(e.Value()) != b.id {
				t.Fatalf("the claimed lease: %v; want the claimer's", err)
			}
			if err := b.Finish(ctx, k.turnID, k.attempt); err != nil {
				t.Fatal(err)
			}
			if mode == ModeEmbedded && b.leases.heldHere(k) {
				t.Fatal("the run finished after its claim is still held by the process")
			}
			// Several lease TTLs: the tombstone ages out, and a marker in
			// its place would have been reported well before.
			subj := "$KV." + LeaseBucket + "." + k.lease()
			leaseLog, err := a.js.Stream(ctx, leaseStream)
			if err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * ttl)
			for {
				info, err := leaseLog.Info(ctx, jetstream.WithSubjectFilter(subj))
				if err != nil {
					t.Fatal(err)
				}
				if info.State.Subjects[subj] == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the lease's subject still holds %d messages", info.State.Subjects[subj])
				}
				time.Sleep(ttl / 5)
			}
			time.Sleep(2 * ttl)
			info, err := leaseLog.Info(ctx, jetstream.WithSubjectFilter(subj))
			if err != nil {
				t.Fatal(err)
			}
			if n := info.State.Subjects[subj]; n != 0 {
				t.Errorf("%d messages on the lease's subject after the tombstone aged out, want none", n)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(expired) != 0 {
				t.Errorf("a finished run was reported expired %d times: %v", len(expired), expired)
			}
		})
	}
}
