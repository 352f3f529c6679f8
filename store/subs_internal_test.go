package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnstile-dev/turnstile/internal/natstest"
)

// TestOwnedRunsHoldNoSubscription: the runs a replica owns add no NATS
// subscription, on the client's side or the server's: the store's inbox
// takes the signals and liveness questions of every run on subscriptions
// made at Open. Each run still gets its own signals, and a run given up
// answers none.
func TestOwnedRunsHoldNoSubscription(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Dir = ""
	cfg.LeaseTTL = time.Minute // no renewal during the count
	s, err := Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := t.Context()
	create := func(id string) {
		t.Helper()
		created, _, err := s.Create(ctx, id, 1, []byte("req"), func(sig string) []byte { return []byte(id + ":" + sig) })
		if err != nil || !created {
			t.Fatalf("create %s: %v %v", id, created, err)
		}
	}
	// One run first, so that what the connection makes once exists (the
	// replies' subscriptions of requests and asynchronous publishes).
	create("warm")
	if _, err := s.Signal(ctx, "warm", 1, "ping"); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, "warm", 1); err != nil {
		t.Fatal(err)
	}
	subs := func() (client int, server uint32) {
		t.Helper()
		if err := s.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		return s.nc.NumSubscriptions(), s.srv.NumSubscriptions()
	}
	client, server := subs()
	const runs = 100
	for i := range runs {
		create(fmt.Sprintf("held-%d", i))
	}
	if c, sv := subs(); c != client || sv != server {
		t.Errorf("%d owned runs: %d subscriptions on the connection, %d on the server; want %d and %d, as before them", runs, c, sv, client, server)
	}
	for _, i := range []int{0, runs / 2, runs - 1} {
		id := fmt.Sprintf("held-%d", i)
		if reply, err := s.Signal(ctx, id, 1, "ping"); err != nil || string(reply) != id+":ping" {
			t.Errorf("signal to %s: %q, %v; want its own reply", id, reply, err)
		}
		if !s.leases.ownerRenewing(ctx, runKey{id, 1}) {
			t.Errorf("%s: its owner does not say it renews its lease", id)
		}
	}
	for i := range runs {
		if err := s.Finish(ctx, fmt.Sprintf("held-%d", i), 1); err != nil {
			t.Fatal(err)
		}
	}
	if c, sv := subs(); c != client || sv != server {
		t.Errorf("runs given up: %d subscriptions on the connection, %d on the server; want %d and %d", c, sv, client, server)
	}
	if _, err := s.Signal(ctx, "held-0", 1, "ping"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("signal to a run given up: %v, want fs.ErrNotExist", err)
	}
	if s.leases.ownerRenewing(ctx, runKey{"held-0", 1}) {
		t.Error("a run given up says it renews its lease")
	}
}

// TestSignalsOfTheVersionBefore: during a rolling upgrade a replica of the
// version before sends signals and liveness questions on the run's own
// subjects (controlRoot.<turn>.<attempt>, and .alive), by hand here as it
// does: the owner of this version answers them, and the other replicas of
// this version stay silent, so the sender of a question no replica owns
// waits for its own timeout instead of getting "no responders". The
// replies of this version's signals are unchanged: a replica that gave the
// run up says "no owner", and so does NATS for one that is gone.
func TestSignalsOfTheVersionBefore(t *testing.T) {
	url := natstest.Start(t)
	ctx := t.Context()
	a := openTestReplica(t, url, time.Minute)
	b := openTestReplica(t, url, time.Minute)
	old, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(old.Close)

	k := runKey{"upgrade", 1}
	signals := make(chan string, 4)
	onSignal := func(sig string) []byte { signals <- sig; return []byte("a:" + sig) }
	if _, _, err := a.Create(ctx, k.turnID, k.attempt, []byte("req"), onSignal); err != nil {
		t.Fatal(err)
	}
	// An answer comes at once; silence is a request that waits until
	// its deadline.
	request := func(subject string, wait time.Duration) (*nats.Msg, error) {
		rctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		return old.RequestWithContext(rctx, subject, []byte("ping"))
	}
	const answered, silent = 10 * time.Second, 300 * time.Millisecond
	if m, err := request(k.control(), answered); err != nil || string(m.Data) != "a:ping" {
		t.Errorf("old-style signal to the owner: %v; want the owner's reply", err)
	}
	if m, err := request(k.alive(), answered); err != nil || string(m.Data) != aliveReply {
		t.Errorf("old-style liveness question to the owner: %v; want %q", err, aliveReply)
	}
	if got := <-signals; got != "ping" {
		t.Fatalf("owner got %q", got)
	}
	if err := old.Publish(k.control(), []byte("watch")); err != nil {
		t.Fatal(err)
	}
	if got := <-signals; got != "watch" {
		t.Errorf("old-style notification: the owner got %q", got)
	}
	// And this version's, from the other replica.
	if reply, err := b.Signal(ctx, k.turnID, k.attempt, "ping"); err != nil || string(reply) != "a:ping" {
		t.Errorf("signal from b: %q, %v; want a's reply", reply, err)
	}
	if !b.leases.ownerRenewing(ctx, k) {
		t.Error("b: the owner does not say it renews its lease")
	}

	// A run no replica owns: both stay silent on its own subjects.
	nobody := runKey{"nobody", 1}
	for _, subj := range []string{nobody.control(), nobody.alive()} {
		if _, err := request(subj, silent); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("old-style request on %s, owned by no replica: %v; want no reply (a timeout)", subj, err)
		}
	}

	// Given up by a: a says so, to both versions' senders.
	if err := a.Finish(ctx, k.turnID, k.attempt); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Signal(ctx, k.turnID, k.attempt, "ping"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("signal to a run given up: %v, want fs.ErrNotExist", err)
	}
	if b.leases.ownerRenewing(ctx, k) {
		t.Error("a run given up says it renews its lease")
	}
	if _, err := request(k.alive(), silent); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("old-style question after the run was given up: %v; want no reply", err)
	}

	// Owned by a replica that is gone: NATS says "no responders".
	k2 := runKey{"gone", 1}
	if _, _, err := a.Create(ctx, k2.turnID, k2.attempt, []byte("req"), onSignal); err != nil {
		t.Fatal(err)
	}
	a.Close()
	// Once the NATS server has dropped the closed connection's interest:
	// until then a request may still be routed to it and time out, as a
	// signal sent the moment a replica dies does.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = b.Signal(sctx, k2.turnID, k2.attempt, "ping")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || time.Now().After(deadline) {
			break
		}
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("signal to a run whose owner is gone: %v, want fs.ErrNotExist", err)
	}
	if b.leases.ownerRenewing(ctx, k2) {
		t.Error("a replica that is gone says it renews its lease")
	}
}

// TestSignalToAnOwnerOfTheVersionBefore: a run whose last owner record
// names no replica was created or claimed by a replica of the version
// before, which listens on the run's own subjects: this version's signals,
// notifications and liveness questions go there while the run holds a
// lease, and a run without one has no owner (no question is asked: this
// version's replicas would not answer it).
func TestSignalToAnOwnerOfTheVersionBefore(t *testing.T) {
	url := natstest.Start(t)
	ctx := t.Context()
	b := openTestReplica(t, url, time.Minute)
	old, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(old.Close)
	js, err := jetstream.New(old)
	if err != nil {
		t.Fatal(err)
	}
	leases, err := js.KeyValue(ctx, LeaseBucket)
	if err != nil {
		t.Fatal(err)
	}

	// The old version's Create, by hand: a record with no owner header,
	// the lease, and subscriptions to the run's own subjects.
	k := runKey{"old-owner", 1}
	if _, err := js.Publish(ctx, k.own(), []byte("req"), jetstream.WithExpectLastSequencePerSubject(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := leases.Put(ctx, k.lease(), []byte("0ld0ld0ld0ld")); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 4)
	ctl, err := old.Subscribe(k.control(), func(m *nats.Msg) {
		got <- string(m.Data)
		if m.Reply != "" {
			_ = m.Respond([]byte("old:" + string(m.Data)))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	alive, err := old.Subscribe(k.alive(), func(m *nats.Msg) { _ = m.Respond([]byte(aliveReply)) })
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Flush(); err != nil {
		t.Fatal(err)
	}

	if reply, err := b.Signal(ctx, k.turnID, k.attempt, "ping"); err != nil || string(reply) != "old:ping" {
		t.Errorf("signal to an owner of the version before: %q, %v; want its reply", reply, err)
	}
	<-got
	b.Notify(k.turnID, k.attempt, "watch")
	if sig := <-got; sig != "watch" {
		t.Errorf("notification to an owner of the version before: it got %q", sig)
	}
	if !b.leases.ownerRenewing(ctx, k) {
		t.Error("an owner of the version before that answers is not taken as renewing")
	}

	// Its Finish: the lease purged, the subscriptions gone.
	_ = ctl.Unsubscribe()
	_ = alive.Unsubscribe()
	if err := leases.Purge(ctx, k.lease()); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := b.Signal(sctx, k.turnID, k.attempt, "ping"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("signal to a run of the version before with no lease: %v, want fs.ErrNotExist", err)
	}
	if _, err := b.Signal(sctx, "never", 1, "ping"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("signal to a run that does not exist: %v, want fs.ErrNotExist", err)
	}
}
