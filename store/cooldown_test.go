package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/natstest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/store"
)

// TestSharedCooldowns: a cooldown one replica shares reaches another
// within 100ms, not the replica that shared it, and a replica that starts
// during the cooldown learns it too.
func TestSharedCooldowns(t *testing.T) {
	url := natstest.Start(t)
	openOn := func() *store.Store { return openNATS(t, url) }
	type got struct {
		alias string
		kind  llm.Kind
		until time.Time
		at    time.Time
	}
	watch := func(s *store.Store) (<-chan got, func()) {
		ch := make(chan got, 4)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = s.Shared().WatchCooldowns(ctx, func(alias string, k llm.Kind, until time.Time) { ch <- got{alias, k, until, time.Now()} })
		}()
		return ch, func() { cancel(); <-done }
	}
	a, b := openOn(), openOn()
	fromA, stopA := watch(a)
	defer stopA()
	fromB, stopB := watch(b)
	defer stopB()
	// A watcher not yet set up gets the cooldown as a value in force:
	// either way it arrives.
	until := time.Now().Add(30 * time.Second)
	shared := time.Now()
	a.Shared().ShareCooldown("fast/model.1", llm.KindRateLimited, until)
	select {
	case g := <-fromB:
		if g.alias != "fast/model.1" || g.kind != llm.KindRateLimited || !g.until.Equal(until.UTC()) {
			t.Errorf("b got %+v", g)
		}
		if d := g.at.Sub(shared); d > 100*time.Millisecond {
			t.Errorf("the cooldown took %v to reach b, want at most 100ms", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("b never learned the cooldown")
	}
	select {
	case g := <-fromA:
		t.Errorf("a got its own cooldown back: %+v", g)
	case <-time.After(100 * time.Millisecond):
	}
	c := openOn()
	fromC, stopC := watch(c)
	defer stopC()
	select {
	case g := <-fromC:
		if g.alias != "fast/model.1" {
			t.Errorf("c got %+v", g)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a replica started during the cooldown never learned it")
	}
}

// TestCooldownAcrossRunners: a model one replica's runner found rate
// limited is skipped by another replica's turns within 100ms: runners
// share their cooldowns through the store.
func TestCooldownAcrossRunners(t *testing.T) {
	url := natstest.Start(t)
	type replica struct {
		runner          *runtime.Runner
		primary, backup *fake.Provider
		stop            func()
	}
	newReplica := func(limited bool) replica {
		s := openNATS(t, url)
		rp := replica{
			primary: fake.NewProvider(fake.Reply{Chunks: fake.Text("from the primary")}),
			backup:  fake.NewProvider(fake.Reply{Chunks: fake.Text("from the backup")}),
		}
		if limited {
			rp.primary = fake.NewProvider(fake.Reply{Err: &llm.Error{Kind: llm.KindRateLimited, Message: "slow down", RetryAfter: 30 * time.Second}})
		}
		var err error
		rp.runner, err = runtime.New([]*runtime.Model{
			{Alias: "primary", Provider: rp.primary, ID: "p", Fallbacks: []string{"backup"}, Retry: policy.DefaultRetry()},
			{Alias: "backup", Provider: rp.backup, ID: "b", Retry: policy.DefaultRetry()},
		}, "primary", nil)
		if err != nil {
			t.Fatal(err)
		}
		rp.runner.ShareCooldowns(s.Shared())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = s.Shared().WatchCooldowns(ctx, rp.runner.ApplyCooldown) }()
		rp.stop = func() { cancel(); <-done }
		return rp
	}
	// a's primary is rate limited; b's answers, so only a cooldown shared
	// by a makes b skip it.
	a, b := newReplica(true), newReplica(false)
	defer a.stop()
	defer b.stop()
	turn := func(r *runtime.Runner) {
		req := &runtime.TurnRequest{Messages: []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("hi")}}}}
		if _, err := r.Run(context.Background(), req, runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil })); err != nil {
			t.Fatal(err)
		}
	}
	turn(a.runner)
	limitedAt := time.Now()
	if a.primary.Calls() != 1 || a.backup.Calls() != 1 {
		t.Fatalf("a: primary %d calls, backup %d", a.primary.Calls(), a.backup.Calls())
	}
	// b's turns skip the primary once the cooldown reached it. How fast
	// that is (the 100ms) is a figure of BENCHMARKS.md, measured
	// apart: on a shared machine a test only bounds it loosely.
	for {
		calls := b.primary.Calls()
		turn(b.runner)
		if b.primary.Calls() == calls {
			break // started on the backup: the cooldown is honoured
		}
		if time.Since(limitedAt) > 10*time.Second {
			t.Fatalf("b still called the rate-limited primary %v after a found it limited", time.Since(limitedAt))
		}
	}
	t.Logf("b honoured the cooldown after %d turn(s) on the primary, %v after a's turn", b.primary.Calls(), time.Since(limitedAt))
}
