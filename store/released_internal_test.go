package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnstile-dev/turnstile/internal/natstest"
)

// TestReleasedLeaseNeedsNoQuestion (issue 37, row 4): a claim of a run
// whose owner released it ([Store.Release], as a replica does when it
// stops) does not ask the owner whether it still renews the lease; a claim
// of a run whose lease expired does. The owner here is one that is exiting:
// its inbox's subject is still subscribed but nobody answers there, as
// between a store's close and its connection's, so each question would
// wait its whole timeout (a second). The test listens on that subject and
// counts the questions each run got.
func TestReleasedLeaseNeedsNoQuestion(t *testing.T) {
	const ttl = 500 * time.Millisecond
	url := natstest.Start(t)
	a, b := openTestReplica(t, url, ttl), openTestReplica(t, url, ttl)
	ctx := t.Context()
	nop := func(string) []byte { return nil }
	released, expired := runKey{"released", 1}, runKey{"expired", 1}
	for _, k := range []runKey{released, expired} {
		if created, _, err := a.Create(ctx, k.turnID, k.attempt, []byte("req"), nop); err != nil || !created {
			t.Fatalf("Create(%s) = %v, %v", k.turnID, created, err)
		}
	}

	// The exiting owner's inbox: subscribed, silent.
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	questions := make(chan *nats.Msg, 16)
	if _, err := nc.ChanSubscribe(replicaRoot+"."+a.id+".>", questions); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	reported := make(chan string, 16)
	go func() {
		_ = b.WatchExpired(wctx, func(id string, _ uint32) { reported <- id })
	}()
	if err := a.Release(ctx, released.turnID, released.attempt); err != nil {
		t.Fatal(err)
	}
	a.Close() // the expired run's lease is left to expire
	asked := func() map[string]int {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		n := map[string]int{}
		for {
			select {
			case m := <-questions:
				n[m.Subject]++
			default:
				return n
			}
		}
	}
	for seen := map[string]bool{}; len(seen) < 2; {
		var id string
		select {
		case id = <-reported:
		case <-time.After(time.Minute):
			t.Fatalf("WatchExpired reported only %v", seen)
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		k := runKey{id, 1}
		if _, _, _, err := b.Claim(ctx, k.turnID, k.attempt, nop); err != nil {
			t.Fatalf("Claim(%s): %v", id, err)
		}
		q := asked()[k.aliveAt(a.id)]
		switch {
		case k == released && q != 0:
			t.Errorf("the released run's owner was asked %d times whether it renews", q)
		case k == expired && q == 0:
			t.Error("the expired run's owner was not asked whether it renews")
		}
		if err := b.Finish(ctx, k.turnID, k.attempt); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFailedClaimHandsTheRunBack: a claim that took a run's lease and then
// failed because its replica stopped (here its context ends as soon as its
// fence is stored) gives the run back so that the other replicas are told:
// another replica's WatchExpired reports the run again, and its claim
// takes it over with every event stored. Before, the failed claim dropped
// the lease with a tombstone that no watcher reports: the other replicas,
// which had lost the lease to it, never tried again, and the run stayed
// orphaned until a client watched it.
func TestFailedClaimHandsTheRunBack(t *testing.T) {
	const ttl = 500 * time.Millisecond
	url := natstest.Start(t)
	owner, b, c := openTestReplica(t, url, ttl), openTestReplica(t, url, ttl), openTestReplica(t, url, ttl)
	ctx := t.Context()
	nop := func(string) []byte { return nil }

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	reported := make(chan string, 64)
	go func() {
		_ = c.WatchExpired(wctx, func(id string, _ uint32) { reported <- id })
	}()
	next := func(want string) bool {
		for {
			select {
			case id := <-reported:
				if id == want {
					return true
				}
			case <-time.After(10 * time.Second):
				return false
			}
		}
	}

	// The claim may get through before its context ends (its last
	// requests are quick): then the test goes again with another run.
	for try := 0; ; try++ {
		if try == 5 {
			t.Skip("each claim got through before its context ended")
		}
		k := runKey{fmt.Sprintf("handed-back-%d", try), 1}
		if created, _, err := owner.Create(ctx, k.turnID, k.attempt, []byte("req"), nop); err != nil || !created {
			t.Fatalf("Create = %v, %v", created, err)
		}
		done := make(chan error, 1)
		if err := owner.Append(ctx, k.turnID, k.attempt, []byte("e1"), func(err error) { done <- err }); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err := owner.Release(ctx, k.turnID, k.attempt); err != nil {
			t.Fatal(err)
		}
		if !next(k.turnID) {
			t.Fatal("the release was not reported")
		}

		// b's claim: its context ends once its fence is stored.
		fenced := make(chan *nats.Msg, 4)
		sub, err := nc.ChanSubscribe(k.own(), fenced)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		// The watch of the fence ends with the claim: a claim that got
		// through may return before its fence is delivered here, and the
		// unsubscribed channel is never closed.
		claimed := make(chan struct{})
		go func() {
			for {
				select {
				case m := <-fenced:
					if string(m.Data) == "claimed by "+b.id {
						cancel()
						return
					}
				case <-claimed:
					return
				}
			}
		}()
		_, _, _, err = b.Claim(cctx, k.turnID, k.attempt, nop)
		close(claimed)
		cancel()
		_ = sub.Unsubscribe()
		if err == nil {
			if err := b.Finish(ctx, k.turnID, k.attempt); err != nil {
				t.Fatal(err)
			}
			continue
		}
		t.Logf("b's claim failed: %v", err)
		if !next(k.turnID) {
			t.Fatal("the run b's failed claim gave up was not reported to the other replicas")
		}
		_, events, claims, err := c.Claim(ctx, k.turnID, k.attempt, nop)
		if err != nil {
			t.Fatalf("c's claim: %v", err)
		}
		if len(events) != 1 || string(events[0]) != "e1" || claims != 2 {
			t.Errorf("c's claim read %q, claims %d; want [e1], 2", events, claims)
		}
		if err := c.Finish(ctx, k.turnID, k.attempt); err != nil {
			t.Fatal(err)
		}
		return
	}
}

// TestClaimOfAGoneOwnersLiveLease: a claim made while the lease of a run
// whose owner went away has not expired yet (a CancelTurn or a watch that
// finds the owner gone at once, or a claim told of an expiry after which
// the stopping owner's last renewal wrote the lease again) waits for the
// lease to expire and takes the run over, rather than fail with
// ErrNotClaimed while no replica is left to be told of the expiry. A
// lease held by a claimer that won it is not waited for.
func TestClaimOfAGoneOwnersLiveLease(t *testing.T) {
	const ttl = time.Second
	url := natstest.Start(t)
	owner, b, c := openTestReplica(t, url, ttl), openTestReplica(t, url, ttl), openTestReplica(t, url, ttl)
	ctx := t.Context()
	nop := func(string) []byte { return nil }
	k := runKey{"gone", 1}
	if created, _, err := owner.Create(ctx, k.turnID, k.attempt, []byte("req"), nop); err != nil || !created {
		t.Fatalf("Create = %v, %v", created, err)
	}
	// The lease's first write is not waited for by Create: the owner goes
	// once it is stored.
	leases, err := b.leases.kv.Watch(ctx, k.lease())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = leases.Stop() }()
	for e := range leases.Updates() {
		if e != nil && e.Operation() == jetstream.KeyValuePut && string(e.Value()) == owner.id {
			break
		}
	}
	owner.Close() // its lease is left to expire
	if _, err := b.leases.kv.Get(ctx, k.lease()); err != nil {
		t.Fatalf("the gone owner's lease: %v, want it held still", err)
	}
	if _, _, claims, err := b.Claim(ctx, k.turnID, k.attempt, nop); err != nil || claims != 1 {
		t.Fatalf("claim of the gone owner's run: %d claims, %v; want 1, nil", claims, err)
	}
	// c's claim finds b's lease (b owns the run and renews): it fails.
	if _, _, _, err := c.Claim(ctx, k.turnID, k.attempt, nop); !errors.Is(err, ErrNotClaimed) {
		t.Fatalf("claim of b's run: %v, want ErrNotClaimed", err)
	}
	if err := b.Finish(ctx, k.turnID, k.attempt); err != nil {
		t.Fatal(err)
	}
}

// TestReleasedRunClaimedOnce: of the replicas that claim a released run at
// once, each writing the lease over the release, exactly one takes it;
// the others fail with ErrNotClaimed.
func TestReleasedRunClaimedOnce(t *testing.T) {
	const ttl = time.Second
	url := natstest.Start(t)
	owner := openTestReplica(t, url, ttl)
	claimers := []*Store{openTestReplica(t, url, ttl), openTestReplica(t, url, ttl), openTestReplica(t, url, ttl)}
	ctx := t.Context()
	nop := func(string) []byte { return nil }
	for i := range 5 {
		id := fmt.Sprintf("once-%d", i)
		if created, _, err := owner.Create(ctx, id, 1, []byte("req"), nop); err != nil || !created {
			t.Fatalf("Create = %v, %v", created, err)
		}
		if err := owner.Release(ctx, id, 1); err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, len(claimers))
		for _, c := range claimers {
			go func() {
				_, _, _, err := c.Claim(ctx, id, 1, nop)
				errs <- err
			}()
		}
		won := 0
		for range claimers {
			switch err := <-errs; {
			case err == nil:
				won++
			case !errors.Is(err, ErrNotClaimed):
				t.Errorf("run %s: a claim failed with %v, want ErrNotClaimed", id, err)
			}
		}
		if won != 1 {
			t.Fatalf("run %s: %d claims won, want 1", id, won)
		}
		for _, c := range claimers {
			if c.leases.heldHere(runKey{id, 1}) {
				if err := c.Finish(ctx, id, 1); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}
