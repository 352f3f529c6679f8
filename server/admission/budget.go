package admission

import (
	"fmt"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// reasonBudgetExhausted is the ErrorInfo reason of a turn refused, or
// ended, because its key spent a budget.
var reasonBudgetExhausted = llm.KindBudgetExhausted.String()

// budgetWindow is one of a key's budgets: what its turns may cost within a
// UTC calendar period (a day or a month), and what they cost so far in the
// current one. It is kept under its keyLimiter's mutex.
type budgetWindow struct {
	limit  string // the limit's name: cost_per_day or cost_per_month
	period string // day or month
	max    int64  // nanos
	start  time.Time
	spent  int64 // nanos spent since start
}

// windowStart returns the start of the UTC day or month t is in.
func windowStart(period string, t time.Time) time.Time {
	t = t.UTC()
	if period == "month" {
		return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	}
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
}

// windowEnd returns when the window that starts at start resets.
func windowEnd(period string, start time.Time) time.Time {
	if period == "month" {
		return start.AddDate(0, 1, 0)
	}
	return start.AddDate(0, 0, 1)
}

// roll starts a new window when now is past the current one.
func (w *budgetWindow) roll(now time.Time) {
	if s := windowStart(w.period, now); !s.Equal(w.start) {
		w.start, w.spent = s, 0
	}
}

// exhausted returns the refusal of a key whose window w has no money left
// at now, nil while it has.
func (w *budgetWindow) exhausted(key string, now time.Time) *Refusal {
	w.roll(now)
	if w.spent < w.max {
		return nil
	}
	wait := ceilSecond(windowEnd(w.period, w.start).Sub(now))
	return &Refusal{
		Reason: reasonBudgetExhausted, Limit: w.limit, RetryAfter: wait,
		Message: fmt.Sprintf("client key %q spent its budget for this %s (%s: %s, spent %s); it resets at %s, in %s",
			key, w.period, w.limit, llm.FormatMoney(w.max), llm.FormatMoney(w.spent), windowEnd(w.period, w.start).Format(time.RFC3339), wait),
	}
}

// newBudgets returns the key's budget windows, none when it has no cost
// limits.
func newBudgets(l KeyLimits, now time.Time) []*budgetWindow {
	var out []*budgetWindow
	if l.CostPerDay != nil {
		out = append(out, &budgetWindow{limit: "cost_per_day", period: "day", max: int64(*l.CostPerDay), start: windowStart("day", now)})
	}
	if l.CostPerMonth != nil {
		out = append(out, &budgetWindow{limit: "cost_per_month", period: "month", max: int64(*l.CostPerMonth), start: windowStart("month", now)})
	}
	return out
}

// budgetRefusal returns why the key may not start a turn (or make another
// model call) now: a budget it spent. k.mu must be held.
func (k *keyLimiter) budgetRefusal(now time.Time) *Refusal {
	for _, w := range k.budgets {
		if r := w.exhausted(k.name, now); r != nil {
			return r
		}
	}
	return nil
}

// spend charges nanos a call of the key's turns cost to its budgets.
func (k *keyLimiter) spend(nanos int64) {
	if nanos <= 0 || len(k.budgets) == 0 {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.now()
	for _, w := range k.budgets {
		w.roll(now)
		w.spent += nanos
		if c := k.share.counter(w.limit); c != nil {
			c.add(now, nanos, c.windowAt(now))
		}
	}
}
