package store

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/turnstile-dev/turnstile/internal/natstest"
)

// leaseOps counts the requests the stores make on one key of the lease
// bucket, as a NATS subscriber to every subject sees them, in the order
// the server took them: publishes to the key (writes, refused or not) and
// reads of it (direct gets).
type leaseOps struct {
	mu            sync.Mutex
	writes, reads int
	written       chan struct{} // one per write
}

// watchLeaseOps counts the lease bucket's traffic of key on the server at
// url until the test ends.
func watchLeaseOps(t *testing.T, url, key string) *leaseOps {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ops := &leaseOps{written: make(chan struct{}, 1<<16)}
	subject := "$KV." + LeaseBucket + "." + key
	// One subscription: its messages come in one order.
	_, err = nc.Subscribe(">", func(m *nats.Msg) {
		ops.mu.Lock()
		defer ops.mu.Unlock()
		switch {
		case strings.HasPrefix(m.Reply, "$JS.ACK."):
			// A copy for a consumer (a watcher of the bucket), not a request.
		case m.Subject == subject:
			ops.writes++
			ops.written <- struct{}{}
		case strings.HasPrefix(m.Subject, "$JS.API.DIRECT.GET.KV_"+LeaseBucket+".") && strings.HasSuffix(m.Subject, subject):
			ops.reads++
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return ops
}

func (o *leaseOps) counts() (writes, reads int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.writes, o.reads
}

// waitWrites waits for n more writes of the lease.
func (o *leaseOps) waitWrites(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-o.written:
		case <-time.After(10 * time.Second):
			t.Fatal("the lease was not written")
		}
	}
}

// drain forgets the writes not waited for yet.
func (o *leaseOps) drain() {
	for {
		select {
		case <-o.written:
		default:
			return
		}
	}
}

// watchExpired returns the runs whose lease s sees expire, until the test
// ends.
func watchExpired(t *testing.T, s *Store) <-chan runKey {
	t.Helper()
	expired := make(chan runKey, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- s.WatchExpired(ctx, func(id string, attempt uint32) { expired <- runKey{id, attempt} })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return expired
}

func waitExpired(t *testing.T, expired <-chan runKey, k runKey) {
	t.Helper()
	for {
		select {
		case got := <-expired:
			if got == k {
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the lease of %v did not expire", k)
		}
	}
}

func openTestReplica(t *testing.T, url string, ttl time.Duration) *Store {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Mode, cfg.NATS.URL, cfg.LeaseTTL = ModeNATS, url, ttl
	s, err := Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// pauseRenewal stops the renewal of w's lease, as a paused process would,
// and returns what resumes it.
func pauseRenewal(w *writer) (resume func()) {
	close(w.stop)
	w.renew.Wait()
	w.stop = make(chan struct{})
	return func() {
		w.renew.Add(1)
		go w.renewLoop()
	}
}

// TestLeaseRenewalIsOneWrite: an owner renews its lease with one write
// per renewal, against the revision it wrote last, reading nothing, both
// for a run it created (the first write's revision comes from its
// acknowledgement) and for one it claimed.
func TestLeaseRenewalIsOneWrite(t *testing.T) {
	url := natstest.Start(t)
	ctx := context.Background()
	a := openTestReplica(t, url, 500*time.Millisecond)
	b := openTestReplica(t, url, 500*time.Millisecond)
	k := runKey{"renewed", 1}
	ops := watchLeaseOps(t, url, k.lease())
	expired := watchExpired(t, b)

	if _, _, err := a.Create(ctx, k.turnID, k.attempt, []byte("req"), func(string) []byte { return nil }); err != nil {
		t.Fatal(err)
	}
	ops.waitWrites(t, 1+5) // the first write and five renewals
	w, r := ops.counts()
	t.Logf("created run: the first lease write and %d renewals: %d requests on the lease (%d writes, %d reads)", w-1, w+r, w, r)
	if r != 0 {
		t.Fatalf("created run: %d lease writes came with %d reads, want none", w, r)
	}

	// a pauses; b claims the run once the lease expired, then renews it.
	wa, _ := a.leases.writer(k.turnID, k.attempt)
	pauseRenewal(wa)
	waitExpired(t, expired, k)
	if _, _, _, err := b.Claim(ctx, k.turnID, k.attempt, func(string) []byte { return nil }); err != nil {
		t.Fatal(err)
	}
	// The claim's write may be among the next two; four renewals follow.
	ops.drain()
	ops.waitWrites(t, 2)
	_, readsBefore := ops.counts()
	ops.waitWrites(t, 4)
	if _, r := ops.counts(); r != readsBefore {
		t.Fatalf("claimed run: four renewals made %d reads, want none", r-readsBefore)
	}
	if err := b.Finish(ctx, k.turnID, k.attempt); err != nil {
		t.Fatal(err)
	}
	_ = a.Finish(ctx, k.turnID, k.attempt)
}

// TestLeaseRenewalAfterAPause: an owner whose lease expired while it was
// paused finds its update refused; it takes the lease again when nobody
// holds it, and stops the run (SignalLost, appends failing with ErrLost)
// when another replica does.
func TestLeaseRenewalAfterAPause(t *testing.T) {
	url := natstest.Start(t)
	ctx := context.Background()
	const ttl = 500 * time.Millisecond
	a := openTestReplica(t, url, ttl)
	b := openTestReplica(t, url, ttl)
	k := runKey{"paused", 1}
	ops := watchLeaseOps(t, url, k.lease())
	expired := watchExpired(t, b)

	signals := make(chan string, 4)
	onSignal := func(sig string) []byte { signals <- sig; return nil }
	if _, _, err := a.Create(ctx, k.turnID, k.attempt, []byte("req"), onSignal); err != nil {
		t.Fatal(err)
	}
	ops.waitWrites(t, 2) // the first write and a renewal: its revision is known
	w, _ := a.leases.writer(k.turnID, k.attempt)
	resume := pauseRenewal(w)
	waitExpired(t, expired, k)

	// Nobody took it: the owner's update is refused, and it takes the
	// lease again.
	resume()
	for {
		ops.waitWrites(t, 1)
		if e, err := a.leases.kv.Get(ctx, k.lease()); err == nil {
			if string(e.Value()) != a.ReplicaID() {
				t.Fatalf("lease after the pause held by %s", e.Value())
			}
			break
		}
	}
	if _, _, _, err := b.Claim(ctx, k.turnID, k.attempt, onSignal); !errors.Is(err, ErrNotClaimed) {
		t.Fatalf("claim of a renewed lease: %v", err)
	}
	select {
	case sig := <-signals:
		t.Fatalf("signal %q to an owner that kept its run", sig)
	default:
	}

	// Paused again; this time b claims the run before a wakes up.
	resume = pauseRenewal(w)
	waitExpired(t, expired, k)
	if _, _, _, err := b.Claim(ctx, k.turnID, k.attempt, func(string) []byte { return nil }); err != nil {
		t.Fatal(err)
	}
	resume()
	select {
	case sig := <-signals:
		if sig != SignalLost {
			t.Fatalf("signal %q, want %q", sig, SignalLost)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the owner did not learn it lost the run")
	}
	if err := a.Append(ctx, k.turnID, k.attempt, []byte("zombie"), func(error) {}); !errors.Is(err, ErrLost) {
		t.Fatalf("append after the run was lost: %v, want ErrLost", err)
	}
	if err := a.Finish(ctx, k.turnID, k.attempt); !errors.Is(err, ErrLost) {
		t.Fatalf("Finish of the lost run: %v", err)
	}
	if err := b.Finish(ctx, k.turnID, k.attempt); err != nil {
		t.Fatal(err)
	}
	if e, err := b.leases.kv.Get(ctx, k.lease()); err == nil {
		t.Fatalf("lease left after Finish: %s", e.Value())
	}
}

// TestLiveOwnerKeepsItsRun: a lease that expires while its owner is alive
// and renewing, as every lease of a bucket does when its leader is lost
// for longer than the TTL, is not taken over: the claim waits until the
// owner has written its lease again and fails with ErrNotClaimed, the
// owner is told nothing and goes on appending. Once the owner stops
// renewing, a claim succeeds.
func TestLiveOwnerKeepsItsRun(t *testing.T) {
	url := natstest.Start(t)
	ctx := context.Background()
	const ttl = 500 * time.Millisecond
	a := openTestReplica(t, url, ttl)
	b := openTestReplica(t, url, ttl)
	k := runKey{"alive", 1}
	ops := watchLeaseOps(t, url, k.lease())
	expired := watchExpired(t, b)

	signals := make(chan string, 4)
	onSignal := func(sig string) []byte { signals <- sig; return nil }
	if _, _, err := a.Create(ctx, k.turnID, k.attempt, []byte("req"), onSignal); err != nil {
		t.Fatal(err)
	}
	ops.waitWrites(t, 2)
	// The lease expires under its live owner: what a bucket that was
	// without a leader for longer than the TTL does, a purge marker.
	if err := b.leases.kv.Purge(ctx, k.lease()); err != nil {
		t.Fatal(err)
	}
	waitExpired(t, expired, k)
	if _, _, _, err := b.Claim(ctx, k.turnID, k.attempt, onSignal); !errors.Is(err, ErrNotClaimed) {
		t.Fatalf("claim of a run whose owner is alive: %v, want ErrNotClaimed", err)
	}
	if e, err := b.leases.kv.Get(ctx, k.lease()); err != nil || string(e.Value()) != a.ReplicaID() {
		t.Fatalf("lease after the claim: %v, err %v; want held by the owner %s", e, err, a.ReplicaID())
	}
	select {
	case sig := <-signals:
		t.Fatalf("signal %q to an owner that kept its run", sig)
	default:
	}
	stored := make(chan error, 1)
	if err := a.Append(ctx, k.turnID, k.attempt, []byte("e1"), func(err error) { stored <- err }); err != nil {
		t.Fatal(err)
	}
	if err := <-stored; err != nil {
		t.Fatalf("the owner's append: %v", err)
	}

	// Paused, it no longer says it renews: the run is taken over.
	w, _ := a.leases.writer(k.turnID, k.attempt)
	resume := pauseRenewal(w)
	waitExpired(t, expired, k)
	if _, evs, _, err := b.Claim(ctx, k.turnID, k.attempt, func(string) []byte { return nil }); err != nil || len(evs) != 1 {
		t.Fatalf("claim of a run whose owner stopped renewing: %d events, %v", len(evs), err)
	}
	resume()
	if err := b.Finish(ctx, k.turnID, k.attempt); err != nil {
		t.Fatal(err)
	}
	_ = a.Finish(ctx, k.turnID, k.attempt)
}
