package admission

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// TestBudgetWindows: a key's budgets are spent per UTC day and calendar
// month: refused with the wait to the window's end, and open again once
// it rolled; the day resets at midnight while the month stays spent.
func TestBudgetWindows(t *testing.T) {
	day, month := llm.Money(10), llm.Money(15)
	now := time.Date(2026, 2, 27, 23, 59, 30, 0, time.UTC)
	k := newKeyLimiter("team", KeyLimits{CostPerDay: &day, CostPerMonth: &month}, func() time.Time { return now })
	admit := func() *Refusal {
		t.Helper()
		end, r := k.admit()
		if end != nil {
			end()
		}
		return r
	}
	if r := admit(); r != nil {
		t.Fatalf("a fresh key refused: %v", r.Message)
	}
	k.spend(10)
	r := admit()
	if r == nil || r.Reason != "BUDGET_EXHAUSTED" || r.Limit != "cost_per_day" || r.RetryAfter != 30*time.Second {
		t.Fatalf("after the day's budget: %+v", r)
	}
	var e *llm.Error
	if err := (&Charger{k: k}).Budget(context.Background(), runtime.CallBound{}); !errors.As(err, &e) || e.Kind != llm.KindBudgetExhausted {
		t.Errorf("a running turn's check: %v", err)
	}
	now = now.Add(31 * time.Second) // 2026-02-28 00:00:01, a new day of the same month
	if r := admit(); r != nil {
		t.Fatalf("the next day: %v", r.Message)
	}
	k.spend(5)
	r = admit()
	// Both are spent now (5 of 10 today, 15 of 15 this month): the month
	// says when.
	if r == nil || r.Limit != "cost_per_month" || r.RetryAfter != 24*time.Hour-time.Second {
		t.Fatalf("after the month's budget: %+v", r)
	}
	now = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	if r := admit(); r != nil || (&Charger{k: k}).Budget(context.Background(), runtime.CallBound{}) != nil {
		t.Fatalf("a new month: %+v", r)
	}
}
