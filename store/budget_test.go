package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/natstest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/store"
)

// budgetReplica is one replica's runner sharing its retry budget through
// its own store, as serve wires it.
type budgetReplica struct {
	runner   *runtime.Runner
	provider *fake.Provider
	store    *store.Store
	// stop ends the sharing, which shares what is left once more.
	stop func()
}

func newBudgetReplica(t *testing.T, url string, replies ...fake.Reply) budgetReplica {
	// Every 100ms, as serve shares them.
	return newBudgetReplicaWith(t, url, 20, 100*time.Millisecond, replies...)
}

func newBudgetReplicaWith(t *testing.T, url string, maxRetries int, every time.Duration, replies ...fake.Reply) budgetReplica {
	t.Helper()
	s := openNATS(t, url)
	retry := policy.DefaultRetry()
	retry.MaxRetries, retry.InitialBackoff, retry.MaxBackoff = maxRetries, time.Millisecond, time.Millisecond
	// A budget of 4 tokens that barely refills within the test.
	retry.BudgetTokens, retry.BudgetRefill = 4, 0.01
	rp := budgetReplica{provider: fake.NewProvider(replies...), store: s}
	var err error
	rp.runner, err = runtime.New([]*runtime.Model{{Alias: "m", Provider: rp.provider, ID: "m-1", Retry: retry}}, "m", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rp.runner.ShareBudgets(ctx, s.Shared(), every) }()
	var once sync.Once
	rp.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("ShareBudgets: %v", err)
			}
		})
	}
	t.Cleanup(rp.stop)
	return rp
}

func budgetOf(r *runtime.Runner) float64 {
	for _, h := range r.Health() {
		if h.Alias == "m" {
			return h.BudgetTokens
		}
	}
	return -1
}

func runTurn(r *runtime.Runner) error {
	req := &runtime.TurnRequest{Messages: []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("hi")}}}}
	_, err := r.Run(context.Background(), req, runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil }))
	return err
}

// TestBudgetAcrossRunners: the retry budget one replica's runner spends
// on an outage is spent for another replica's runner too, whose turns then
// stop retrying; turns that succeed at their first attempt cost the
// shared budget no write at all.
func TestBudgetAcrossRunners(t *testing.T) {
	url := natstest.Start(t)
	overloaded := fake.Reply{Err: &llm.Error{Kind: llm.KindOverloaded, Message: "overloaded"}}
	// a's model is down; b's fails once, then answers: only a budget
	// shared by a keeps b from retrying.
	a := newBudgetReplica(t, url, overloaded)
	b := newBudgetReplica(t, url, fake.Reply{Chunks: fake.Text("fine")}, overloaded, fake.Reply{Chunks: fake.Text("fine")})

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	writes := func() uint64 {
		s, err := js.Stream(t.Context(), "KV_"+store.BudgetBucket)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().State.LastSeq
	}

	// b's first turn succeeds at once: nothing to share.
	if err := runTurn(b.runner); err != nil {
		t.Fatal(err)
	}
	var te *runtime.TurnError
	if err := runTurn(a.runner); !errors.As(err, &te) || te.Kind != llm.KindOverloaded {
		t.Fatalf("a's turn: %v, want OVERLOADED", err)
	}
	// One first attempt, then a retry per token.
	spent := time.Now()
	if n := a.provider.Calls(); n != 5 {
		t.Fatalf("a's model got %d calls, want 5 (the first and 4 retries)", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for budgetOf(b.runner) >= 1 {
		if time.Now().After(deadline) {
			t.Fatalf("b's budget is still %v: a's spending never reached it", budgetOf(b.runner))
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, with a deadline
	}
	t.Logf("a's spent budget reached b %v after a's turn", time.Since(spent))
	// b's model fails once: the spent budget gives it no retry.
	if err := runTurn(b.runner); !errors.As(err, &te) || te.Kind != llm.KindOverloaded {
		t.Fatalf("b's turn: %v, want OVERLOADED without a retry", err)
	}
	if n := b.provider.Calls(); n != 2 {
		t.Errorf("b's model got %d calls, want 2 (no retry)", n)
	}

	// Turns that succeed at their first attempt write nothing.
	c := newBudgetReplica(t, url, fake.Reply{Chunks: fake.Text("fine")})
	before := writes()
	for range 200 {
		if err := runTurn(c.runner); err != nil {
			t.Fatal(err)
		}
	}
	if got := writes(); got != before {
		t.Errorf("200 successful turns wrote the shared budget %d times, want 0", got-before)
	}
}

// TestSwapBudget: a budget is created once, and changed only by whoever
// holds its latest revision.
func TestSwapBudget(t *testing.T) {
	url := natstest.Start(t)
	a, b := openNATS(t, url), openNATS(t, url)
	ctx := t.Context()
	at := time.Date(2026, 11, 23, 16, 0, 0, 0, time.UTC)
	if _, _, rev, err := a.Shared().LoadBudget(ctx, "m"); err != nil || rev != 0 {
		t.Fatalf("no budget yet: revision %d, %v", rev, err)
	}
	r1, ok, err := a.Shared().SwapBudget(ctx, "m", -1, at, 0)
	if err != nil || !ok || r1 == 0 {
		t.Fatalf("create: %d %v %v", r1, ok, err)
	}
	steps := []struct {
		name     string
		s        *store.Store
		earned   float64
		revision uint64
		swapped  bool
	}{
		{"a second create loses", b, -2, 0, false},
		{"the latest revision wins", b, -2, r1, true},
		{"a stale revision loses", a, -3, r1, false},
	}
	want := -1.0
	for _, st := range steps {
		_, ok, err := st.s.Shared().SwapBudget(ctx, "m", st.earned, at, st.revision)
		if err != nil || ok != st.swapped {
			t.Errorf("%s: swapped %v (%v), want %v", st.name, ok, err, st.swapped)
		}
		if ok {
			want = st.earned
		}
		earned, gotAt, _, err := a.Shared().LoadBudget(ctx, "m")
		if err != nil || earned != want || !gotAt.Equal(at) {
			t.Errorf("%s: stored %v at %v (%v), want %v", st.name, earned, gotAt, err, want)
		}
	}
}

// TestBudgetSpendsAddUp: two replicas that share their spending at the
// same moment, each unaware of the other's, both count: the second one's
// compare-and-swap fails, and it merges into the first's value rather than
// writing over it.
func TestBudgetSpendsAddUp(t *testing.T) {
	url := natstest.Start(t)
	overloaded := fake.Reply{Err: &llm.Error{Kind: llm.KindOverloaded, Message: "overloaded"}}
	// Two retries a turn, of a budget of 4; no share before the end, when
	// both share at once, from the same empty view.
	a := newBudgetReplicaWith(t, url, 2, time.Hour, overloaded)
	b := newBudgetReplicaWith(t, url, 2, time.Hour, overloaded)
	for _, r := range []budgetReplica{a, b} {
		if err := runTurn(r.runner); err == nil {
			t.Fatal("a turn on a model that is down succeeded")
		}
	}
	if a.provider.Calls() != 3 || b.provider.Calls() != 3 {
		t.Fatalf("calls: a %d, b %d; want 3 each (two retries)", a.provider.Calls(), b.provider.Calls())
	}
	var wg sync.WaitGroup
	for _, r := range []budgetReplica{a, b} {
		wg.Go(r.stop)
	}
	wg.Wait()
	earned, _, rev, err := a.store.Shared().LoadBudget(t.Context(), "m")
	if err != nil || rev == 0 {
		t.Fatalf("LoadBudget: revision %d, %v", rev, err)
	}
	// 4 failed retries, less the refill of a moment (0.01 a second).
	if earned > -3.9 || earned < -4 {
		t.Errorf("the shared budget holds %v, want -4: a replica's spending was written over", earned)
	}
}
