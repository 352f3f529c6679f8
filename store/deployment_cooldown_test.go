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
)

// TestDeploymentCooldownAcrossRunners: a deployment one replica found
// rate limited is skipped by another replica's turns, which keep the
// model's other deployment; a replica whose model has one deployment (as
// before deployments existed) keeps its model's state apart.
func TestDeploymentCooldownAcrossRunners(t *testing.T) {
	url := natstest.Start(t)
	type replica struct {
		runner *runtime.Runner
		d0, d1 *fake.Provider
		stop   func()
	}
	start := func(r *runtime.Runner) func() {
		s := openNATS(t, url)
		r.ShareCooldowns(s.Shared())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = s.Shared().WatchCooldowns(ctx, r.ApplyCooldown) }()
		return func() { cancel(); <-done }
	}
	newReplica := func(limited bool) replica {
		rp := replica{
			d0: fake.NewProvider(fake.Reply{Chunks: fake.Text("from d0")}),
			d1: fake.NewProvider(fake.Reply{Chunks: fake.Text("from d1")}),
		}
		if limited {
			rp.d0 = fake.NewProvider(fake.Reply{Err: &llm.Error{Kind: llm.KindRateLimited, Message: "slow down", RetryAfter: 30 * time.Second}})
		}
		var err error
		rp.runner, err = runtime.New([]*runtime.Model{{Alias: "m", Retry: policy.DefaultRetry(), Deployments: []runtime.Deployment{
			{Name: "d0", ProviderName: "k0", Provider: rp.d0, ID: "x"},
			{Name: "d1", ProviderName: "k1", Provider: rp.d1, ID: "x"},
		}}}, "m", nil)
		if err != nil {
			t.Fatal(err)
		}
		rp.stop = start(rp.runner)
		return rp
	}
	a, b := newReplica(true), newReplica(false)
	defer a.stop()
	defer b.stop()
	old, err := runtime.New([]*runtime.Model{{Alias: "m", Provider: fake.NewProvider(fake.Reply{Chunks: fake.Text("old")}), ID: "x", Retry: policy.DefaultRetry()}}, "m", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer start(old)()
	turn := func(r *runtime.Runner) {
		req := &runtime.TurnRequest{Messages: []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("hi")}}}}
		if _, err := r.Run(context.Background(), req, runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil })); err != nil {
			t.Fatal(err)
		}
	}
	turn(a.runner)
	if a.d0.Calls() != 1 || a.d1.Calls() != 1 {
		t.Fatalf("a: d0 %d calls, d1 %d; want 1 and 1 (moved after the 429)", a.d0.Calls(), a.d1.Calls())
	}
	cooling := func(r *runtime.Runner, key string) bool {
		for _, h := range r.Health() {
			if name := h.Alias + "@" + h.Deployment; h.Deployment == "" && h.Alias == key || name == key {
				return h.CooldownUntil.After(time.Now())
			}
		}
		return false
	}
	for deadline := time.Now().Add(10 * time.Second); !cooling(b.runner, "m@d0"); {
		if time.Now().After(deadline) {
			t.Fatal("b never learned d0's cooldown")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if cooling(b.runner, "m@d1") {
		t.Error("b cooled d1 down too")
	}
	for range 4 {
		turn(b.runner)
	}
	if b.d0.Calls() != 0 || b.d1.Calls() != 4 {
		t.Errorf("b: d0 %d calls, d1 %d; want 0 and 4", b.d0.Calls(), b.d1.Calls())
	}
	// The old replica got the cooldown of m@d0 too (the bucket is shared)
	// and ignored it: its model m is not cooling down.
	if cooling(old, "m") {
		t.Error("a replica without deployments took a deployment's cooldown for its model's")
	}
}

// TestDeploymentBudgetAcrossRunners: the retry budget one replica's
// failing retries spend on one deployment is spent on the other
// replica's runner too, and the model's other deployment keeps its own.
func TestDeploymentBudgetAcrossRunners(t *testing.T) {
	url := natstest.Start(t)
	newRunner := func(d0 *fake.Provider) *runtime.Runner {
		s := openNATS(t, url)
		retry := policy.DefaultRetry()
		retry.MaxRetries, retry.InitialBackoff, retry.MaxBackoff = 20, time.Millisecond, time.Millisecond
		retry.BudgetTokens, retry.BudgetRefill = 4, 0.01
		r, err := runtime.New([]*runtime.Model{{Alias: "m", Retry: retry, Deployments: []runtime.Deployment{
			{Name: "d0", ProviderName: "k0", Provider: d0, ID: "x"},
			{Name: "d1", ProviderName: "k1", Provider: fake.NewProvider(fake.Reply{Chunks: fake.Text("from d1")}), ID: "x"},
		}}}, "m", nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.ShareBudgets(ctx, s.Shared(), 10*time.Millisecond) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("ShareBudgets: %v", err)
			}
		})
		return r
	}
	failing := fake.NewProvider(fake.Reply{Err: &llm.Error{Kind: llm.KindServerError, Message: "down"}})
	a := newRunner(failing)
	b := newRunner(fake.NewProvider(fake.Reply{Chunks: fake.Text("from d0")}))
	budget := func(r *runtime.Runner, deployment string) float64 {
		for _, h := range r.Health() {
			if h.Alias == "m" && h.Deployment == deployment {
				return h.BudgetTokens
			}
		}
		return -1
	}
	// a's first turn goes to d0, whose retries fail until its budget of 4
	// is spent.
	req := &runtime.TurnRequest{Messages: []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("hi")}}}}
	if _, err := a.Run(context.Background(), req, runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil })); err == nil {
		t.Fatal("a's turn on a failing d0 succeeded")
	}
	if got := budget(a, "d0"); got >= 1 {
		t.Fatalf("a's d0 budget = %.2f after failing retries, want spent", got)
	}
	for deadline := time.Now().Add(10 * time.Second); budget(b, "d0") >= 1; {
		if time.Now().After(deadline) {
			t.Fatalf("b's d0 budget is still %.2f: a's spending never reached it", budget(b, "d0"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := budget(b, "d1"); got < 3.9 {
		t.Errorf("b's d1 budget = %.2f, want it whole (4): d0's retries spent it", got)
	}
}
