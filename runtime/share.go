package runtime

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
)

// CooldownSharer carries the cooldowns a runner decides to the runners of
// the other replicas of a deployment, so a model that one replica found
// rate limited is skipped by all of them, not hit N times as hard. The
// other side calls [Runner.ApplyCooldown] with what it receives.
type CooldownSharer interface {
	// ShareCooldown says that alias is cooling down until until after a
	// failure of class kind. It must not block the turn.
	ShareCooldown(alias string, kind llm.Kind, until time.Time)
}

// ShareCooldowns makes the runner tell s every cooldown it decides. Call
// it before the runner's first turn; nil shares nothing (the default).
func (r *Runner) ShareCooldowns(s CooldownSharer) { r.sharer.Store(&s) }

// ApplyCooldown applies a cooldown another replica decided: new turns skip
// alias until until, as if this runner had decided it. alias names a
// model's health state: its alias, or for a model of several deployments
// alias@deployment, one deployment's. A cooldown that is already over, or
// shorter than the one in force, or of a name the runner does not know,
// changes nothing.
func (r *Runner) ApplyCooldown(alias string, kind llm.Kind, until time.Time) {
	if r.byKey[alias] == nil {
		return
	}
	if d := until.Sub(r.opts.now()); d > 0 {
		r.health.Cooldown(alias, kind, d)
	}
}

// sharerOf returns the runner's sharer, nil when none.
func (r *Runner) sharerOf() CooldownSharer {
	if p := r.sharer.Load(); p != nil {
		return *p
	}
	return nil
}

// sharerSlot holds a runner's sharer; set once, read by every turn.
type sharerSlot = atomic.Pointer[CooldownSharer]

// BudgetSharer keeps the retry budgets of a deployment's replicas in one
// place (package store keeps them in a NATS key-value bucket). A budget is
// the tokens retry outcomes added to it (negative: took) as of a time, and
// a revision that grows with every change.
type BudgetSharer interface {
	// LoadBudget returns alias's shared budget and its revision; revision
	// 0 when none is stored.
	LoadBudget(ctx context.Context, alias string) (earned float64, at time.Time, revision uint64, err error)
	// SwapBudget stores alias's budget if its revision is still revision
	// (0: none is stored), and returns the new revision; swapped is false,
	// with no error, when another replica changed it first.
	SwapBudget(ctx context.Context, alias string, earned float64, at time.Time, revision uint64) (newRevision uint64, swapped bool, err error)
	// WatchBudgets calls fn with every budget stored, then with each change,
	// until ctx is done.
	WatchBudgets(ctx context.Context, fn func(alias string, earned float64, at time.Time, revision uint64)) error
}

// maxSwaps bounds the compare-and-swap attempts of one share of a
// budget; what is left is shared at the next tick.
const maxSwaps = 5

// ShareBudgets shares the runner's retry budgets through s until ctx is
// done: each replica spends and earns its budgets locally at once, as
// without sharing, and every interval merges what its retries did into the
// shared budget with compare-and-swap; every change of a shared budget,
// its own or another replica's, is applied to the runner's. A model whose
// retries did nothing since the last share costs no round trip: calls that
// succeed at their first attempt never do. Changes left unshared when ctx
// ends are shared once more, for at most a second.
func (r *Runner) ShareBudgets(ctx context.Context, s BudgetSharer, interval time.Duration) error {
	var aliases []string // the deployments' keys (see [deploymentKey])
	for key, m := range r.byKey {
		if m.Retry.BudgetTokens > 0 {
			aliases = append(aliases, key)
		}
	}
	if len(aliases) == 0 {
		return nil
	}
	b := &budgetShare{r: r, s: s, known: map[string]knownBudget{}}
	wctx, stop := context.WithCancel(ctx)
	watched := make(chan error, 1)
	go func() {
		watched <- s.WatchBudgets(wctx, b.apply)
	}()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			for _, alias := range aliases {
				b.share(ctx, alias)
			}
		case err := <-watched:
			stop()
			if err != nil {
				return fmt.Errorf("runtime: watch shared budgets: %w", err)
			}
			return nil
		case <-ctx.Done():
			stop()
			<-watched
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			for _, alias := range aliases {
				b.share(fctx, alias)
			}
			return nil
		}
	}
}

// budgetShare moves one runner's budgets to and from a BudgetSharer.
type budgetShare struct {
	r *Runner
	s BudgetSharer

	mu    sync.Mutex
	known map[string]knownBudget // the latest shared budget seen, per alias
}

type knownBudget struct {
	budget   policy.SharedBudget
	revision uint64
}

// apply applies a shared budget that changed.
func (b *budgetShare) apply(alias string, earned float64, at time.Time, revision uint64) {
	if m := b.r.byKey[alias]; m == nil || m.Retry.BudgetTokens <= 0 {
		return
	}
	sb := policy.SharedBudget{Earned: earned, At: at}
	b.mu.Lock()
	if revision > b.known[alias].revision {
		b.known[alias] = knownBudget{budget: sb, revision: revision}
	}
	b.mu.Unlock()
	b.r.health.ApplySharedBudget(alias, sb, revision)
}

// share merges what alias's retries did here since the last share into
// the shared budget. It costs nothing when they did nothing.
func (b *budgetShare) share(ctx context.Context, alias string) {
	h := b.r.health
	c := h.TakeBudgetChange(alias)
	if c.IsZero() {
		return
	}
	b.mu.Lock()
	k := b.known[alias]
	b.mu.Unlock()
	for range maxSwaps {
		next := h.MergeBudget(alias, k.budget, c)
		rev, swapped, err := b.s.SwapBudget(ctx, alias, next.Earned, next.At, k.revision)
		if err != nil {
			b.r.opts.logger.Debug("retry budget not shared", "model", alias, "error", err)
			break
		}
		if swapped {
			b.apply(alias, next.Earned, next.At, rev)
			return
		}
		// Another replica changed it first: merge into theirs.
		earned, at, rev, err := b.s.LoadBudget(ctx, alias)
		if err != nil {
			b.r.opts.logger.Debug("retry budget not shared", "model", alias, "error", err)
			break
		}
		k = knownBudget{budget: policy.SharedBudget{Earned: earned, At: at}, revision: rev}
	}
	// The store failed or kept changing: share it at the next tick.
	h.ReturnBudgetChange(alias, c)
}
