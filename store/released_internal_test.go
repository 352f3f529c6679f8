package store

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

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
