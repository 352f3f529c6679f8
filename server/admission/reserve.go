package admission

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/time/rate"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// What this file keeps: a key's limits and budgets hold under concurrency
// because each running turn holds, before each of its model calls, what
// that call may use at most (its bound: the prompt's estimate and the
// call's output limit, priced), until the call reports what it used. A
// turn starts only when the key's token buckets and budgets cover its
// first call's hold beyond what its running turns hold; a running turn's
// next call is made only when its budgets still cover it. Without holds,
// 50 turns started together each saw the whole budget.

// DefaultReserveOutputTokens is what a call's hold counts of output when
// neither the request nor the model sets an output limit, and the key
// sets no reserve_output_tokens.
const DefaultReserveOutputTokens = 4096

// hold is what a turn holds of its key's limits for its next model call.
type hold struct {
	tokens int64 // of tokens_per_minute and tokens_per_day
	nanos  int64 // of cost_per_day and cost_per_month
}

// bound describes a call's hold in a refusal's message.
type bound struct {
	runtime.CallBound
	output int64
}

// holdOf returns what a call of bound b holds of the key's limits: its
// prompt and its output, by default its output limit (reserve_output_tokens
// replaces it), at its price; none of a limit the key does not have.
func (k *keyLimiter) holdOf(b runtime.CallBound) (hold, bound) {
	out := b.MaxOutputTokens
	if out <= 0 {
		out = DefaultReserveOutputTokens
	}
	if r := k.limits.ReserveOutputTokens; r != nil {
		out = *r
	}
	var h hold
	if k.tokMin != nil || k.tokDay != nil {
		h.tokens = max(b.PromptTokens(), 0) + out
	}
	if c := b.Cost(out); c.Priced && len(k.budgets) > 0 {
		h.nanos = c.Nanos
	}
	return h, bound{b, out}
}

// heldBeside returns what the key's running turns hold here, less own
// (the turn asking, which replaces its hold), and with remote what they
// hold on the other replicas. k.mu is held.
func (k *keyLimiter) heldBeside(now time.Time, own hold, remote bool) hold {
	h := hold{tokens: k.held.tokens - own.tokens, nanos: k.held.nanos - own.nanos}
	if remote {
		o := k.share.othersHeld(now)
		h.tokens, h.nanos = h.tokens+o.tokens, h.nanos+o.nanos
	}
	return h
}

// holdRefusal returns why the key may not hold h for a call of bound b,
// while its running turns hold beside, nil when it may: a budget whose
// remainder does not cover the hold (BUDGET_EXHAUSTED until the window
// resets when it never will today, else LIMIT_EXCEEDED while the running
// turns hold it), or, when tokens is set (a turn not started yet), a token
// bucket that does not hold it. A hold larger than a limit counts as the
// whole limit: such a call runs when nothing else holds or used it. first
// says the call is the turn's first (for the message). k.mu is held.
func (k *keyLimiter) holdRefusal(now time.Time, h hold, b bound, beside hold, tokens, first bool) *Refusal {
	which := "next model call"
	if first {
		which = "first model call"
	}
	for _, w := range k.budgets {
		if r := w.exhausted(k.name, now); r != nil {
			return r
		}
		need := min(h.nanos, w.max)
		if need == 0 {
			continue
		}
		what := fmt.Sprintf("the turn's %s may cost up to %s (its prompt of about %d tokens and %d output tokens at the model's prices)",
			which, llm.FormatMoney(need), b.PromptTokens(), b.output)
		switch {
		case w.spent+need > w.max:
			end := windowEnd(w.period, w.start)
			wait := ceilSecond(end.Sub(now))
			return &Refusal{Reason: reasonBudgetExhausted, Limit: w.limit, RetryAfter: wait,
				Message: fmt.Sprintf("client key %q has %s left of its budget for this %s (%s: %s), and %s (a lower max_output_tokens holds less); it resets at %s, in %s",
					k.name, llm.FormatMoney(w.max-w.spent), w.period, w.limit, llm.FormatMoney(w.max), what, end.Format(time.RFC3339), wait)}
		case w.spent+beside.nanos+need > w.max:
			r := &Refusal{Limit: w.limit, RetryAfter: busyRetry,
				Message: fmt.Sprintf("client key %q has %s left of its budget for this %s (%s: %s), of which its other running turns hold %s for their model calls, and %s",
					k.name, llm.FormatMoney(w.max-w.spent), w.period, w.limit, llm.FormatMoney(w.max), llm.FormatMoney(min(beside.nanos, w.max-w.spent)), what)}
			if first {
				r.Message += "; retry when one has ended"
			}
			return r
		}
	}
	if !tokens || h.tokens == 0 {
		return nil
	}
	for _, lim := range []*rate.Limiter{k.tokMin, k.tokDay} {
		if lim == nil {
			continue
		}
		need := float64(min(h.tokens, int64(lim.Burst())))
		left := lim.TokensAt(now) - float64(beside.tokens)
		if left >= need {
			continue
		}
		r := &Refusal{Limit: "tokens_per_" + k.periodOf[lim],
			Message: fmt.Sprintf("client key %q has %.0f of its tokens per %s (%d) left beyond what its running turns hold for their model calls (%d), and the turn's first model call may use %.0f (its prompt of about %d tokens and %d output tokens)",
				k.name, max(left, 0), k.periodOf[lim], lim.Burst(), beside.tokens, need, b.PromptTokens(), b.output)}
		if lim.Limit() > 0 {
			r.RetryAfter = ceilSecond(time.Duration((need - left) / float64(lim.Limit()) * float64(time.Second)))
			r.Message += fmt.Sprintf("; retry in %s", r.RetryAfter)
		}
		return r
	}
	return nil
}

// reserve makes h the hold of the turn c for its next call, of bound b,
// unless the key's limits do not cover it (see holdRefusal); first says
// the turn has not started: then its token buckets must cover it too.
func (k *keyLimiter) reserve(c *Charger, b runtime.CallBound, first bool) *Refusal {
	h, bd := k.holdOf(b)
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.now()
	if r := k.holdRefusal(now, h, bd, k.heldBeside(now, c.held, true), first, first); r != nil {
		return r
	}
	k.setHold(now, c, h)
	return nil
}

// setHold replaces the hold of the turn c with h, and wakes the turns
// waiting for a hold to drop when it did. k.mu is held.
func (k *keyLimiter) setHold(now time.Time, c *Charger, h hold) {
	k.held.tokens += h.tokens - c.held.tokens
	k.held.nanos += h.nanos - c.held.nanos
	dropped := h.tokens < c.held.tokens || h.nanos < c.held.nanos
	c.held = h
	k.share.heldChanged(now, k)
	if dropped && k.dropped != nil {
		close(k.dropped)
		k.dropped = nil
	}
}

// Reserve holds what the first model call of the turn may use, bound b,
// against its key's token limits and budgets, or fails with the *Refusal
// that says which of them does not cover it: the turn must not start.
// Unreserve drops the hold; the turn's calls replace it (Budget) and its
// usage events settle it. A nil charger reserves nothing.
func (c *Charger) Reserve(b runtime.CallBound) error {
	if c == nil || c.k == nil || !c.k.holds() {
		return nil
	}
	if r := c.k.reserve(c, b, true); r != nil {
		return r
	}
	return nil
}

// Budget is the turn's runtime.TurnRequest.Budget: before each model call
// it replaces the turn's hold with what that call may use, bound b, or
// fails with an *llm.Error of [llm.KindBudgetExhausted] when a budget of
// the key is spent or what is left of it does not cover the call: the
// turn ends before it. While what the key's other running turns on this
// replica hold stands in the way, it waits, holding nothing, until one of
// them settles (each holds for a call under way, which ends) or ctx is
// done. What turns on other replicas hold counts when a turn starts, not
// before its later calls: the replicas would otherwise wait on holds that
// are themselves waiting. Token limits never end a turn that started: its
// calls hold their tokens whatever the buckets hold, and new turns wait.
func (c *Charger) Budget(ctx context.Context, b runtime.CallBound) error {
	if c == nil || c.k == nil || !c.k.holds() {
		return nil
	}
	k := c.k
	h, bd := k.holdOf(b)
	for {
		k.mu.Lock()
		now := k.now()
		r := k.holdRefusal(now, h, bd, k.heldBeside(now, c.held, false), false, false)
		if r == nil {
			k.setHold(now, c, h)
			k.mu.Unlock()
			return nil
		}
		k.setHold(now, c, hold{})
		if r.Reason != "" {
			k.mu.Unlock()
			return &llm.Error{Kind: llm.KindBudgetExhausted, Message: r.Message + "; the turn ended before that call"}
		}
		if k.dropped == nil {
			k.dropped = make(chan struct{})
		}
		dropped := k.dropped
		k.mu.Unlock()
		select {
		case <-dropped:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// BudgetHook returns c.Budget for runtime.TurnRequest.Budget; nil when the
// key holds nothing for its calls (no token limit, no budget).
func (c *Charger) BudgetHook() func(context.Context, runtime.CallBound) error {
	if c == nil || c.k == nil || !c.k.holds() {
		return nil
	}
	return c.Budget
}

// Unreserve drops the turn's hold: its call ended without usage to
// settle, or the turn ended (the slots of a RunTurn call free it).
func (c *Charger) Unreserve() {
	if c == nil || c.k == nil || !c.k.holds() {
		return
	}
	c.k.mu.Lock()
	defer c.k.mu.Unlock()
	if c.held != (hold{}) {
		c.k.setHold(c.k.now(), c, hold{})
	}
	c.settling = false
}

// holds reports whether the key holds anything for its turns' calls: it
// has a token limit or a budget.
func (k *keyLimiter) holds() bool {
	return k.tokMin != nil || k.tokDay != nil || len(k.budgets) > 0
}

// chargerContext is the context key of a RunTurn call's *Charger.
type chargerContext struct{}

// WithCharger returns ctx carrying the charger of the call's turn, which
// holds its first call's reservation.
func WithCharger(ctx context.Context, c *Charger) context.Context {
	return context.WithValue(ctx, chargerContext{}, c)
}

// ChargerFrom returns the charger WithCharger put in ctx, else a new
// charger of the caller's key (nil without keys).
func ChargerFrom(ctx context.Context) *Charger {
	if c, ok := ctx.Value(chargerContext{}).(*Charger); ok {
		return c
	}
	return FromContext(ctx).Charger()
}
