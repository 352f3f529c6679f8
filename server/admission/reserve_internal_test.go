package admission

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// callOf is the bound of a call with no prompt whose output limit costs
// nanos at 1 USD a million tokens (1,000 nanos a token).
func callOf(nanos int64) runtime.CallBound {
	return runtime.CallBound{MaxOutputTokens: nanos / 1000, Price: &llm.Price{Currency: "USD", Input: 1_000_000_000, Output: 1_000_000_000}}
}

// TestHolds: a turn starts only when the budget covers its call's hold
// beyond the running turns' (LIMIT_EXCEEDED, retry in 1s, while they hold
// it; BUDGET_EXHAUSTED until the reset when what is left never covers
// it); a running turn's next call waits for the other holds to settle,
// holding nothing meanwhile, and ends BUDGET_EXHAUSTED when what is left
// does not cover it; a call's usage settles its hold.
func TestHolds(t *testing.T) {
	day := llm.Money(10_000)
	now := time.Date(2026, 3, 1, 23, 0, 0, 0, time.UTC)
	k := newKeyLimiter("team", KeyLimits{CostPerDay: &day}, func() time.Time { return now })
	a, b := &Charger{k: k}, &Charger{k: k}
	if err := a.Reserve(callOf(6000)); err != nil {
		t.Fatal(err)
	}
	var r *Refusal
	if err := b.Reserve(callOf(6000)); !errors.As(err, &r) || r.Reason != "" || r.Limit != "cost_per_day" || r.RetryAfter != time.Second {
		t.Fatalf("a turn whose hold the running turns' leave no room for: %v, want LIMIT_EXCEEDED in 1s", err)
	}
	if err := b.Reserve(callOf(4000)); err != nil {
		t.Fatalf("a turn whose hold fits beside: %v", err)
	}
	// b's next call needs 6000 while a holds 6000: it waits, holding nothing.
	done := make(chan error, 1)
	go func() { done <- b.Budget(context.Background(), callOf(6000)) }()
	waitHeld(t, k, 6000)
	// a's call reports 3000: its hold goes with the running totals.
	a.Event(runtime.Event{Payload: &runtime.LLMCallFinished{Usage: llm.Usage{OutputTokens: 3}}})
	a.Event(runtime.Event{Payload: &runtime.UsageUpdated{Total: llm.Usage{OutputTokens: 3, Cost: llm.Cost{Currency: "USD", Nanos: 3000, Priced: true}}}})
	if err := <-done; err != nil {
		t.Fatalf("the waiting call once a's settled: %v", err)
	}
	if k.held.nanos != 6000 || k.budgets[0].spent != 3000 {
		t.Fatalf("held %d, spent %d; want b's 6000 and a's 3000", k.held.nanos, k.budgets[0].spent)
	}
	// 7000 is left: a's next call of 8000 never fits today.
	var e *llm.Error
	if err := a.Budget(context.Background(), callOf(8000)); !errors.As(err, &e) || e.Kind != llm.KindBudgetExhausted {
		t.Fatalf("a's next call: %v, want BUDGET_EXHAUSTED", err)
	}
	// Nor a turn's: refused until midnight.
	c := &Charger{k: k}
	if err := c.Reserve(callOf(8000)); !errors.As(err, &r) || r.Reason != "BUDGET_EXHAUSTED" || r.RetryAfter != time.Hour {
		t.Fatalf("a turn that never fits today: %v, want BUDGET_EXHAUSTED in 1h", err)
	}
	// A call of 2000 would fit but for b's hold: it waits, until its
	// turn ends.
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() { done <- c.Budget(ctx, callOf(2000)) }()
	waitHeld(t, k, 6000)
	stop := errors.New("cancelled")
	cancel(stop)
	if err := <-done; !errors.Is(err, stop) {
		t.Errorf("a wait whose turn was cancelled: %v", err)
	}
	b.Release()
	if k.held != (hold{}) {
		t.Errorf("held %+v after every turn ended", k.held)
	}
}

// waitHeld waits until the key holds nanos and a turn waits for a hold
// to drop.
func waitHeld(t *testing.T, k *keyLimiter, nanos int64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		k.mu.Lock()
		ok := k.held.nanos == nanos && k.dropped != nil
		k.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no turn waits")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestHoldsOfOtherReplicas: what another replica's turns hold counts
// when a turn starts here, until that replica's value goes stale.
func TestHoldsOfOtherReplicas(t *testing.T) {
	day := llm.Money(10_000)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	k := newKeyLimiter("team", KeyLimits{CostPerDay: &day}, func() time.Time { return now })
	k.share = newKeyShare(k, "here", make(chan struct{}, 1))
	k.share.othersHeldBy["there"] = replicaHeld{hold: hold{nanos: 8000}, costAt: now}
	var r *Refusal
	if err := (&Charger{k: k}).Reserve(callOf(3000)); !errors.As(err, &r) || r.Limit != "cost_per_day" || r.RetryAfter != time.Second {
		t.Fatalf("beside another replica's 8000: %v, want LIMIT_EXCEEDED", err)
	}
	now = now.Add(runningStale)
	if err := (&Charger{k: k}).Reserve(callOf(3000)); err != nil {
		t.Errorf("once the other replica's value is stale: %v", err)
	}
}
