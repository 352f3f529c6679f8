package policy_test

import (
	"math"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
)

// share takes from's change of m's budget, merges it into shared and
// applies the result, at version, to every health given (from included),
// as the runtime does through a store.
func share(from *policy.Health, shared policy.SharedBudget, version uint64, to ...*policy.Health) policy.SharedBudget {
	next := from.MergeBudget("m", shared, from.TakeBudgetChange("m"))
	for _, h := range append([]*policy.Health{from}, to...) {
		h.ApplySharedBudget("m", next, version)
	}
	return next
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// TestSharedBudget: what one replica's retries spend or earn reaches
// another once shared; the refill runs on the shared value; changes made
// while a share is in flight are kept; older versions are ignored.
func TestSharedBudget(t *testing.T) {
	tests := []struct {
		name           string
		run            func(c *clock, a, b *policy.Health)
		wantA, wantB   float64
		reserveB       bool // whether b may still retry
		wantUnshared   policy.BudgetChange
		unsharedOfWhom string
	}{
		{
			name: "an outage on a stops b's retries",
			run: func(c *clock, a, b *policy.Health) {
				for range 10 {
					retry(a, false)
				}
				share(a, policy.SharedBudget{}, 1, b)
			},
			wantA: 0, wantB: 0, reserveB: false,
		},
		{
			name: "both replicas' failures add up",
			run: func(c *clock, a, b *policy.Health) {
				for range 4 {
					retry(a, false)
					retry(b, false)
				}
				s := share(a, policy.SharedBudget{}, 1, b)
				share(b, s, 2, a)
			},
			wantA: 2, wantB: 2, reserveB: true,
		},
		{
			name: "the refill runs on the shared value",
			run: func(c *clock, a, b *policy.Health) {
				for range 6 {
					retry(a, false)
				}
				s := share(a, policy.SharedBudget{}, 1)
				c.advance(2 * time.Second) // 2 tokens back at 1/s
				b.ApplySharedBudget("m", s, 1)
			},
			wantA: 6, wantB: 6, reserveB: true,
		},
		{
			name: "a change made while a share is in flight is kept",
			run: func(c *clock, a, b *policy.Health) {
				retry(a, false)
				ch := a.TakeBudgetChange("m")
				retry(a, false) // meanwhile
				s := a.MergeBudget("m", policy.SharedBudget{}, ch)
				a.ApplySharedBudget("m", s, 1)
				b.ApplySharedBudget("m", s, 1)
			},
			wantA: 8, wantB: 9, reserveB: true,
			wantUnshared: policy.BudgetChange{Earned: -1}, unsharedOfWhom: "a",
		},
		{
			name: "a change that could not be shared is shared later",
			run: func(c *clock, a, b *policy.Health) {
				retry(a, false)
				a.ReturnBudgetChange("m", a.TakeBudgetChange("m"))
				retry(a, false)
				share(a, policy.SharedBudget{}, 1, b)
			},
			wantA: 8, wantB: 8, reserveB: true,
		},
		{
			name: "an older version changes nothing",
			run: func(c *clock, a, b *policy.Health) {
				retry(a, false)
				share(a, policy.SharedBudget{}, 2, b)
				b.ApplySharedBudget("m", policy.SharedBudget{Earned: -5, At: c.now()}, 1)
				b.ApplySharedBudget("m", policy.SharedBudget{Earned: -5, At: c.now()}, 2)
			},
			wantA: 9, wantB: 9, reserveB: true,
		},
		{
			name: "a probe that works forgives what every replica spent",
			run: func(c *clock, a, b *policy.Health) {
				for range 11 {
					retry(a, false) // the 11th finds the budget spent
				}
				s := share(a, policy.SharedBudget{}, 1, b)
				c.advance(time.Second) // a token back: half-open
				retry(a, true)         // the probe works
				share(a, s, 2, b)
			},
			// Forgiven to 0, the probe earns 1; its credit has not faded yet.
			wantA: 11, wantB: 11, reserveB: true,
		},
		{
			name: "first attempts that succeed have nothing to share",
			run: func(c *clock, a, b *policy.Health) {
				for range 100 {
					a.Success("m", c.now())
					a.Failure("m", llm.KindOverloaded) // a first attempt failing, budget not spent
				}
			},
			wantA: 10, wantB: 10, reserveB: true,
			unsharedOfWhom: "a",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			a, b := budgetHealth(c), budgetHealth(c)
			tt.run(c, a, b)
			if got := budget(a); !near(got, tt.wantA) {
				t.Errorf("a's budget %v, want %v", got, tt.wantA)
			}
			if got := budget(b); !near(got, tt.wantB) {
				t.Errorf("b's budget %v, want %v", got, tt.wantB)
			}
			if _, ok := b.Reserve("m"); ok != tt.reserveB {
				t.Errorf("b may retry: %v, want %v", ok, tt.reserveB)
			}
			if tt.unsharedOfWhom == "a" {
				if got := a.TakeBudgetChange("m"); got != tt.wantUnshared {
					t.Errorf("a's unshared change %+v, want %+v", got, tt.wantUnshared)
				}
			}
		})
	}
}
