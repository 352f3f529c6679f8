package runtime_test

import (
	"context"
	"fmt"
	"maps"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
)

// deployed returns alias served by the deployments given, each a recording
// fake upstream of its own (one key, one endpoint), named dN with weight
// weights[N].
func deployed(alias string, ps []*fake.Provider, weights []int, fallbacks ...string) *runtime.Model {
	m := &runtime.Model{Alias: alias, Fallbacks: fallbacks, Retry: fastRetry()}
	for i, p := range ps {
		m.Deployments = append(m.Deployments, runtime.Deployment{
			Name: fmt.Sprintf("d%d", i), ProviderName: fmt.Sprintf("key%d", i), Provider: p, ID: alias + "-id", Weight: weights[i],
		})
	}
	return m
}

// describeDeployments renders events as describeAll does, with the
// deployment of each call and the deployment each retry moves to.
func describeDeployments(evs []runtime.Event) string {
	var out []string
	for _, ev := range evs {
		d := describe(ev)
		switch p := ev.Payload.(type) {
		case *runtime.LLMCallStarted:
			d = fmt.Sprintf("call %s@%s#%d", p.Model, p.Deployment, p.Attempt)
		case *runtime.Retry:
			if p.ToDeployment != "" {
				d += " >" + p.ToDeployment
			}
		case *runtime.Hedge:
			d += "@" + p.ToDeployment
		}
		if n := len(out); n > 0 && d == "text" && out[n-1] == d {
			continue
		}
		out = append(out, d)
	}
	return strings.Join(out, " | ")
}

// TestDeploymentWeights runs 1,000 turns on a model of three deployments
// and checks each got its weight's share, and that every call's
// LLMCallStarted names the deployment whose upstream received it.
func TestDeploymentWeights(t *testing.T) {
	for _, tc := range []struct {
		name    string
		weights []int
	}{
		{"1:2:7", []int{1, 2, 7}},
		{"equal", []int{1, 1, 1}},
		{"default weight", []int{0, 3, 0}}, // 0 is the default, 1
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps := []*fake.Provider{fake.NewProvider(fake.Reply{Chunks: fake.Text("a")}), fake.NewProvider(fake.Reply{Chunks: fake.Text("b")}), fake.NewProvider(fake.Reply{Chunks: fake.Text("c")})}
			r := newRunner(t, []*runtime.Model{deployed("chat", ps, tc.weights)}, nil)
			const turns = 1000
			named := map[string]int{}
			for i := range turns {
				evs, res, te := run(t, context.Background(), r, userTurn(fmt.Sprint("hi ", i)))
				if te != nil || res == nil {
					t.Fatalf("turn %d: %v", i, te)
				}
				for _, ev := range evs {
					if p, ok := ev.Payload.(*runtime.LLMCallStarted); ok {
						named[p.Deployment]++
						if want := "key" + strings.TrimPrefix(p.Deployment, "d"); p.Provider != want {
							t.Fatalf("deployment %s called with provider %s, want %s", p.Deployment, p.Provider, want)
						}
					}
				}
			}
			total := 0
			for _, w := range tc.weights {
				total += max(w, 1)
			}
			for i, p := range ps {
				share := float64(p.Calls()) / turns
				want := float64(max(tc.weights[i], 1)) / float64(total)
				if math.Abs(share-want) > 0.02 {
					t.Errorf("deployment d%d served %.3f of the turns, want %.3f ± 0.02", i, share, want)
				}
				t.Logf("d%d (weight %d): %d of %d turns", i, max(tc.weights[i], 1), p.Calls(), turns)
				if got := named[fmt.Sprint("d", i)]; got != p.Calls() {
					t.Errorf("deployment d%d: %d llm_call_started name it, its upstream got %d calls", i, got, p.Calls())
				}
			}
		})
	}
}

// TestDeploymentLeastOutstanding checks that a deployment holding calls in
// flight gets no new turn while another of the same weight is idle.
func TestDeploymentLeastOutstanding(t *testing.T) {
	slow := fake.NewProvider(fake.Reply{Chunks: fake.Text("slow")[:1], Hang: true})
	fast := fake.NewProvider(fake.Reply{Chunks: fake.Text("fast")})
	m := deployed("chat", []*fake.Provider{slow, fast}, []int{1, 1})
	m.FirstTokenTimeout, m.IdleTimeout = 0, 0
	r := newRunner(t, []*runtime.Model{m}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	started := make(chan struct{})
	go func() {
		defer wg.Done()
		rec := &recorder{}
		close(started)
		_, _ = r.Run(ctx, userTurn("held"), rec)
	}()
	<-started
	for slow.Calls() == 0 && fast.Calls() == 0 {
		time.Sleep(time.Millisecond)
	}
	if slow.Calls() != 1 {
		t.Fatalf("the first turn went to the fast deployment; want the slow one (round-robin starts at d0)")
	}
	for i := range 10 {
		if _, _, te := run(t, context.Background(), r, userTurn(fmt.Sprint("hi ", i))); te != nil {
			t.Fatalf("turn %d: %v", i, te)
		}
	}
	cancel()
	wg.Wait()
	if slow.Calls() != 1 || fast.Calls() != 10 {
		t.Errorf("slow got %d calls, fast %d; want 1 and 10: a deployment with a call in flight takes no turn while its peer is idle", slow.Calls(), fast.Calls())
	}
}

// TestDeploymentMove checks that a failure of one key moves the call to
// another deployment of the same model, with a retry event naming it and
// no fallback, and that other failures do not move.
func TestDeploymentMove(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first []fake.Reply // d0's replies; d1 always answers
		want  string
		d0    int // calls d0 receives
	}{
		{
			name:  "rate limited",
			first: []fake.Reply{{Err: providerErr(llm.KindRateLimited, 0)}},
			want:  "start | call chat@d0#1 | failed RATE_LIMITED | retry 2/4 RATE_LIMITED >d1 | call chat@d1#2 | text | finished | usage | commit assistant | completed end_turn",
			d0:    1,
		},
		{
			name:  "quota exhausted",
			first: []fake.Reply{{Err: providerErr(llm.KindQuotaExhausted, 0)}},
			want:  "start | call chat@d0#1 | failed QUOTA_EXHAUSTED | retry 2/4 QUOTA_EXHAUSTED >d1 | call chat@d1#2 | text | finished | usage | commit assistant | completed end_turn",
			d0:    1,
		},
		{
			name:  "auth",
			first: []fake.Reply{{Err: providerErr(llm.KindAuth, 0)}},
			want:  "start | call chat@d0#1 | failed AUTH | retry 2/4 AUTH >d1 | call chat@d1#2 | text | finished | usage | commit assistant | completed end_turn",
			d0:    1,
		},
		{
			name:  "overloaded",
			first: []fake.Reply{{Err: providerErr(llm.KindOverloaded, 0)}},
			want:  "start | call chat@d0#1 | failed OVERLOADED | retry 2/4 OVERLOADED >d1 | call chat@d1#2 | text | finished | usage | commit assistant | completed end_turn",
			d0:    1,
		},
		{
			name:  "rate limited after output: the partial reply is discarded",
			first: []fake.Reply{{Chunks: fake.Text("par")[:1], Err: providerErr(llm.KindRateLimited, 0)}},
			want:  "start | call chat@d0#1 | text | failed RATE_LIMITED | retry 2/4 RATE_LIMITED discard >d1 | call chat@d1#2 | text | finished | usage | commit assistant | completed end_turn",
			d0:    1,
		},
		{
			name:  "server error: retried on the same deployment",
			first: []fake.Reply{{Err: providerErr(llm.KindServerError, 0)}, {Chunks: fake.Text("ok")}},
			want:  "start | call chat@d0#1 | failed SERVER_ERROR | retry 2/3 SERVER_ERROR | call chat@d0#2 | text | finished | usage | commit assistant | completed end_turn",
			d0:    2,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d0 := fake.NewProvider(tc.first...)
			d1 := fake.NewProvider(fake.Reply{Chunks: fake.Text("ok")})
			other := fake.NewProvider(fake.Reply{Chunks: fake.Text("fallback")})
			r := newRunner(t, []*runtime.Model{deployed("chat", []*fake.Provider{d0, d1}, []int{1, 1}, "other"), model("other", other)}, nil)
			evs, _, te := run(t, context.Background(), r, userTurn("hi"))
			if te != nil {
				t.Fatalf("turn failed: %v", te)
			}
			if got := describeDeployments(evs); got != tc.want {
				t.Errorf("events:\n got %s\nwant %s", got, tc.want)
			}
			if d0.Calls() != tc.d0 || other.Calls() != 0 {
				t.Errorf("d0 got %d calls, the fallback %d; want %d and 0", d0.Calls(), other.Calls(), tc.d0)
			}
		})
	}
}

// TestDeploymentMoveThenFallback checks that a model whose every
// deployment is rate limited falls back only after trying each once.
func TestDeploymentMoveThenFallback(t *testing.T) {
	d0 := fake.NewProvider(fake.Reply{Err: providerErr(llm.KindRateLimited, 0)})
	d1 := fake.NewProvider(fake.Reply{Err: providerErr(llm.KindRateLimited, 0)})
	other := fake.NewProvider(fake.Reply{Chunks: fake.Text("fallback")})
	r := newRunner(t, []*runtime.Model{deployed("chat", []*fake.Provider{d0, d1}, []int{1, 1}, "other"), model("other", other)}, nil)
	evs, _, te := run(t, context.Background(), r, userTurn("hi"))
	if te != nil {
		t.Fatalf("turn failed: %v", te)
	}
	want := "start | call chat@d0#1 | failed RATE_LIMITED | retry 2/4 RATE_LIMITED >d1 | call chat@d1#2 | failed RATE_LIMITED | fallback chat>other RATE_LIMITED | call other@fake#1 | text | finished | usage | commit assistant | completed end_turn"
	if got := describeDeployments(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	// Both keys cool down: the next turn goes straight to the fallback.
	evs, _, te = run(t, context.Background(), r, userTurn("again"))
	if te != nil {
		t.Fatalf("second turn failed: %v", te)
	}
	if got, want := describeDeployments(evs), "start | call other@fake#1 | text | finished | usage | commit assistant | completed end_turn"; got != want {
		t.Errorf("second turn's events:\n got %s\nwant %s", got, want)
	}
}

// TestDeploymentCooldownProbe checks that a dead deployment cools down
// alone (its model's other deployment takes every turn), and that once
// its cooldown ends one turn probes it (half-open) while the others keep
// off it until the probe reports.
func TestDeploymentCooldownProbe(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	dead := fake.NewProvider(fake.Reply{Err: providerErr(llm.KindOverloaded, 0)})
	live := fake.NewProvider(fake.Reply{Chunks: fake.Text("ok")})
	m := deployed("chat", []*fake.Provider{dead, live}, []int{1, 1})
	r := newRunner(t, []*runtime.Model{m}, nil, runtime.WithClock(clock))

	if _, _, te := run(t, context.Background(), r, userTurn("first")); te != nil {
		t.Fatalf("first turn: %v", te)
	}
	if dead.Calls() != 1 {
		t.Fatalf("dead got %d calls, want 1", dead.Calls())
	}
	cooling := healthOf(t, r, "chat@d0")
	if want := clock().Add(fastRetry().Cooldown); !cooling.CooldownUntil.Equal(want) || cooling.CooldownKind != llm.KindOverloaded {
		t.Fatalf("d0's cooldown: until %v kind %v; want %v OVERLOADED", cooling.CooldownUntil, cooling.CooldownKind, want)
	}
	if h := healthOf(t, r, "chat@d1"); !h.CooldownUntil.IsZero() {
		t.Fatalf("d1 cooled down too: %+v", h)
	}
	for i := range 5 {
		if _, _, te := run(t, context.Background(), r, userTurn(fmt.Sprint("cool ", i))); te != nil {
			t.Fatalf("turn %d: %v", i, te)
		}
	}
	if dead.Calls() != 1 || live.Calls() != 6 {
		t.Fatalf("during the cooldown dead got %d calls, live %d; want 1 and 6", dead.Calls(), live.Calls())
	}

	// The cooldown ends: the next turn probes d0. It fails again, moves to
	// d1, and d0 cools down afresh.
	mu.Lock()
	now = now.Add(fastRetry().Cooldown + time.Second)
	mu.Unlock()
	d0Calls := 0
	for i := range 4 {
		evs, _, te := run(t, context.Background(), r, userTurn(fmt.Sprint("after ", i)))
		if te != nil {
			t.Fatalf("turn %d: %v", i, te)
		}
		if strings.HasPrefix(describeDeployments(evs), "start | call chat@d0#1") {
			d0Calls++
			want := "start | call chat@d0#1 | failed OVERLOADED | retry 2/4 OVERLOADED >d1 | call chat@d1#2 | text | finished | usage | commit assistant | completed end_turn"
			if got := describeDeployments(evs); got != want {
				t.Errorf("probe turn:\n got %s\nwant %s", got, want)
			}
		}
	}
	if d0Calls != 1 || dead.Calls() != 2 {
		t.Errorf("after the cooldown d0 was probed by %d turns (%d calls in all); want 1 probe", d0Calls, dead.Calls())
	}
	if h := healthOf(t, r, "chat@d0"); !h.CooldownUntil.After(clock()) || h.Probing {
		t.Errorf("after the failed probe d0 is %+v; want a fresh cooldown, no probe", h)
	}
}

// TestDeploymentProbeHolds checks the half-open state itself: while one
// turn probes a deployment whose cooldown ended, no other turn is sent to
// it; a probe that succeeds ends the cooldown.
func TestDeploymentProbeHolds(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	d0 := fake.NewProvider(fake.Reply{Err: providerErr(llm.KindRateLimited, 0)}, fake.Reply{Chunks: fake.Text("slow")[:1], Hang: true}, fake.Reply{Chunks: fake.Text("ok")})
	d1 := fake.NewProvider(fake.Reply{Chunks: fake.Text("ok")})
	m := deployed("chat", []*fake.Provider{d0, d1}, []int{1, 1})
	m.FirstTokenTimeout, m.IdleTimeout = 0, 0
	r := newRunner(t, []*runtime.Model{m}, nil, runtime.WithClock(clock))
	if _, _, te := run(t, context.Background(), r, userTurn("cool it")); te != nil {
		t.Fatalf("first turn: %v", te)
	}
	mu.Lock()
	now = now.Add(time.Hour)
	mu.Unlock()
	// The probe: its call hangs until the turn is cancelled. Round-robin
	// may send a turn or two to d1 first; they finish at once.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	for d0.Calls() < 2 {
		turn := make(chan struct{})
		go func() {
			defer close(turn)
			_, _ = r.Run(ctx, userTurn("probe"), &recorder{})
		}()
		for d0.Calls() < 2 {
			select {
			case <-turn:
			case <-time.After(time.Millisecond):
				continue
			}
			break
		}
		if d0.Calls() == 2 {
			go func() { <-turn; close(done) }()
		}
	}
	if h := healthOf(t, r, "chat@d0"); !h.Probing {
		t.Fatalf("d0 is %+v while a turn probes it; want probing", h)
	}
	for i := range 4 {
		if _, _, te := run(t, context.Background(), r, userTurn(fmt.Sprint("during ", i))); te != nil {
			t.Fatalf("turn %d: %v", i, te)
		}
	}
	if d0.Calls() != 2 {
		t.Errorf("d0 got %d calls while probed; want no more than the probe's", d0.Calls())
	}
	cancel()
	<-done
	// A cancelled probe says nothing of d0: the next turn probes it again,
	// and its success ends the cooldown.
	for i := 0; i < 4 && d0.Calls() < 3; i++ {
		if _, _, te := run(t, context.Background(), r, userTurn("probe again")); te != nil {
			t.Fatalf("second probe: %v", te)
		}
	}
	if h := healthOf(t, r, "chat@d0"); d0.Calls() != 3 || !h.CooldownUntil.IsZero() || h.Probing {
		t.Errorf("after a probe that worked d0 has %d calls and is %+v; want 3 and healthy", d0.Calls(), h)
	}
}

// TestDeploymentSharedCooldown checks that a deployment's cooldown decided
// by one replica keeps the other replica's turns off that deployment only,
// under a name a replica that knows no deployments ignores.
func TestDeploymentSharedCooldown(t *testing.T) {
	mk := func() (*runtime.Runner, *fake.Provider, *fake.Provider) {
		d0 := fake.NewProvider(fake.Reply{Err: providerErr(llm.KindRateLimited, 0)})
		d1 := fake.NewProvider(fake.Reply{Chunks: fake.Text("ok")})
		return newRunner(t, []*runtime.Model{deployed("chat", []*fake.Provider{d0, d1}, []int{1, 1})}, nil), d0, d1
	}
	a, _, _ := mk()
	b, bd0, bd1 := mk()
	old := newRunner(t, []*runtime.Model{model("chat", fake.NewProvider(fake.Reply{Chunks: fake.Text("ok")}))}, nil)
	shared := &sharedCooldowns{to: []*runtime.Runner{b, old}}
	a.ShareCooldowns(shared)
	if _, _, te := run(t, context.Background(), a, userTurn("hi")); te != nil {
		t.Fatalf("turn on a: %v", te)
	}
	if got := shared.keys(); len(got) != 1 || got[0] != "chat@d0" {
		t.Fatalf("a shared cooldowns %v; want [chat@d0]", got)
	}
	for i := range 4 {
		if _, _, te := run(t, context.Background(), b, userTurn(fmt.Sprint("b ", i))); te != nil {
			t.Fatalf("turn %d on b: %v", i, te)
		}
	}
	if bd0.Calls() != 0 || bd1.Calls() != 4 {
		t.Errorf("on b, d0 got %d calls and d1 %d; want 0 and 4", bd0.Calls(), bd1.Calls())
	}
	if h := old.Health(); len(h) != 1 || !h[0].CooldownUntil.IsZero() {
		t.Errorf("a replica without deployments took the deployment's cooldown: %+v", h)
	}
}

// sharedCooldowns hands each cooldown shared to other runners, as the
// store's bucket does between replicas.
type sharedCooldowns struct {
	mu   sync.Mutex
	to   []*runtime.Runner
	seen []string
}

func (s *sharedCooldowns) ShareCooldown(alias string, kind llm.Kind, until time.Time) {
	s.mu.Lock()
	s.seen = append(s.seen, alias)
	s.mu.Unlock()
	for _, r := range s.to {
		r.ApplyCooldown(alias, kind, until)
	}
}

func (s *sharedCooldowns) keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.seen...)
}

// TestDeploymentHedge checks hedge.to: deployment: a slow call is raced
// by a call to the model's other deployment, which wins.
func TestDeploymentHedge(t *testing.T) {
	slow := fake.NewProvider(fake.Reply{Hang: true})
	fast := fake.NewProvider(fake.Reply{Chunks: fake.Text("fast")})
	m := deployed("chat", []*fake.Provider{slow, fast}, []int{1, 1})
	m.Hedge = &runtime.HedgeConfig{After: runtime.HedgeAfter(time.Millisecond), To: runtime.HedgeDeployment}
	r := newRunner(t, []*runtime.Model{m}, nil)
	evs, _, te := run(t, context.Background(), r, userTurn("hi"))
	if te != nil {
		t.Fatalf("turn failed: %v", te)
	}
	want := "start | call chat@d0#1 | hedge chat>chat@d1 | call chat@d1#2 | failed CANCELLED | text | finished | usage | commit assistant | completed end_turn"
	if got := describeDeployments(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
}

// TestDeploymentProblems checks the runner refuses deployments it cannot
// route.
func TestDeploymentProblems(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: fake.Text("ok")})
	for _, tc := range []struct {
		name string
		deps []runtime.Deployment
		want string
	}{
		{"no provider", []runtime.Deployment{{Name: "a", Provider: p}, {Name: "b"}}, `model "chat": deployments[1]: provider is required`},
		{"twice", []runtime.Deployment{{Name: "a", Provider: p}, {Name: "a", Provider: p}}, `model "chat": deployments[1]: name "a" used twice`},
		{"negative weight", []runtime.Deployment{{Name: "a", Provider: p, Weight: -1}, {Name: "b", Provider: p}}, `model "chat": deployments[0]: weight -1 is negative`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runtime.New([]*runtime.Model{{Alias: "chat", Deployments: tc.deps, Retry: fastRetry()}}, "chat", nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: %v; want %s", err, tc.want)
			}
		})
	}
}

// healthOf returns the health state named key, alias@deployment.
func healthOf(t *testing.T, r *runtime.Runner, key string) policy.ModelHealth {
	t.Helper()
	for _, h := range r.Health() {
		if h.Alias+"@"+h.Deployment == key {
			return h
		}
	}
	t.Fatalf("no health state %q in %+v", key, r.Health())
	return policy.ModelHealth{}
}

// TestDeploymentWeightsConcurrent runs 1,000 turns eight at a time over
// deployments of weights 1 and 3 that answer alike, each call taking 3 ms
// (so that calls in flight come from the calls, not from how the machine
// schedules goroutines): least-outstanding-within-the-weight keeps each
// deployment's share near its weight's.
func TestDeploymentWeightsConcurrent(t *testing.T) {
	const took = 3 * time.Millisecond
	ps := []*fake.Provider{
		fake.NewProvider(fake.Reply{Chunks: fake.Text("a"), Delay: took}),
		fake.NewProvider(fake.Reply{Chunks: fake.Text("b"), Delay: took}),
	}
	r := newRunner(t, []*runtime.Model{deployed("chat", ps, []int{1, 3})}, nil)
	const turns, workers = 1000, 8
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if _, err := r.Run(context.Background(), userTurn(fmt.Sprint("hi ", i)), &recorder{}); err != nil {
					t.Errorf("turn %d: %v", i, err)
				}
			}
		}()
	}
	for i := range turns {
		next <- i
	}
	close(next)
	wg.Wait()
	share := float64(ps[1].Calls()) / turns
	t.Logf("weights 1:3, %d turns %d at a time: %d and %d", turns, workers, ps[0].Calls(), ps[1].Calls())
	if math.Abs(share-0.75) > 0.03 {
		t.Errorf("the weight-3 deployment served %.3f of the turns, want 0.75 ± 0.03", share)
	}
}

// TestDeploymentMoveNeedsBudget checks that a per-key failure does not
// move to a deployment whose retry budget is spent: the call's own rule
// applies (here, a fallback), and the target's half-open probe, claimed
// while choosing it, is given back.
func TestDeploymentMoveNeedsBudget(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	d0 := fake.NewProvider(fake.Reply{Err: providerErr(llm.KindRateLimited, 0)})
	d1 := fake.NewProvider(fake.Reply{Err: providerErr(llm.KindServerError, 0)})
	other := fake.NewProvider(fake.Reply{Chunks: fake.Text("fallback")})
	// Weights 3:1 make round-robin propose d0 to both turns.
	m := deployed("chat", []*fake.Provider{d0, d1}, []int{3, 1}, "other")
	m.Retry.BudgetTokens, m.Retry.BudgetRefill = 1, 0.001
	r := newRunner(t, []*runtime.Model{m, model("other", other)}, nil, runtime.WithClock(clock))
	// The move spends d1's one token on a call that fails: its budget is
	// spent, and it cools down with it.
	evs, _, te := run(t, context.Background(), r, userTurn("first"))
	if te != nil {
		t.Fatalf("first turn: %v", te)
	}
	want := "start | call chat@d0#1 | failed RATE_LIMITED | retry 2/4 RATE_LIMITED >d1 | call chat@d1#2 | failed SERVER_ERROR | fallback chat>other SERVER_ERROR | call other@fake#1 | text | finished | usage | commit assistant | completed end_turn"
	if got := describeDeployments(evs); got != want {
		t.Fatalf("first turn:\n got %s\nwant %s", got, want)
	}
	// Both cooldowns end; d1's budget has refilled a tenth of a token.
	mu.Lock()
	now = now.Add(100 * time.Second)
	mu.Unlock()
	evs, _, te = run(t, context.Background(), r, userTurn("second"))
	if te != nil {
		t.Fatalf("second turn: %v", te)
	}
	want = "start | call chat@d0#1 | failed RATE_LIMITED | fallback chat>other RATE_LIMITED | call other@fake#1 | text | finished | usage | commit assistant | completed end_turn"
	if got := describeDeployments(evs); got != want {
		t.Errorf("second turn:\n got %s\nwant %s", got, want)
	}
	if h := healthOf(t, r, "chat@d1"); h.Probing || d1.Calls() != 1 {
		t.Errorf("d1 after a move it could not take: %+v, %d calls; want no probe held, 1 call", h, d1.Calls())
	}
}

// TestDeploymentPrices prices each call at its deployment's own price when
// it has one, else at the model's: two deployments of weights 1:1 take
// turns, the first priced like the model, the second at its own price.
func TestDeploymentPrices(t *testing.T) {
	ps := []*fake.Provider{fake.NewProvider(fake.Reply{Chunks: fake.Text("a")}), fake.NewProvider(fake.Reply{Chunks: fake.Text("b")})}
	m := deployed("chat", ps, []int{1, 1})
	m.Price = &llm.Price{Currency: "EUR", Input: 2_000_000_000, Output: 10_000_000_000}
	m.Deployments[1].Price = &llm.Price{Currency: "EUR", Input: 1_000_000_000, Output: 4_000_000_000}
	r := newRunner(t, []*runtime.Model{m}, nil)
	got := map[string]int64{}
	for i := range 2 {
		evs, _, terr := run(t, t.Context(), r, userTurn(fmt.Sprint("hi ", i)))
		if terr != nil {
			t.Fatal(terr)
		}
		var dep string
		for _, ev := range evs {
			switch p := ev.Payload.(type) {
			case *runtime.LLMCallStarted:
				dep = p.Deployment
			case *runtime.LLMCallFinished:
				got[dep] = p.Usage.Cost.Nanos
			}
		}
	}
	// 10 input and 5 output tokens: 10 × 2 + 5 × 10 = 70 per million at
	// the model's price, 10 × 1 + 5 × 4 = 30 at d1's.
	if want := map[string]int64{"d0": 70_000, "d1": 30_000}; !maps.Equal(got, want) {
		t.Errorf("cost by deployment %v, want %v", got, want)
	}
}
