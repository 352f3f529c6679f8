package policy

import "time"

// The retry budget of a model can be shared by the replicas of a
// deployment, so that N replicas stop retrying an outage after the budget's
// tokens, not N times as many. Health keeps the budget as it always does,
// spending and earning locally at once (a decision never waits for other
// replicas); what retry outcomes did to it is taken in batches
// ([Health.TakeBudgetChange]), merged into the shared value
// ([Health.MergeBudget]), which some store swaps in with compare-and-swap,
// and the shared value, this replica's or another's, is applied back
// ([Health.ApplySharedBudget]). The package does no I/O: the runtime moves
// the values.
//
// A call that succeeds on its first attempt changes no budget (unless it
// probes a spent one), so it has nothing to share.

// SharedBudget is a model's retry budget as replicas share it: what retry
// outcomes added to it (negative: what failed retries took) as of At. Its
// level is the budget's size plus Earned, brought up to date by the refill
// and the fading of credit since At.
type SharedBudget struct {
	Earned float64
	At     time.Time
}

// BudgetChange is what this replica's retry outcomes did to a model's
// budget since it was last taken: Earned tokens added (negative: taken),
// after the spent budget was forgiven when Forgave is set.
type BudgetChange struct {
	Earned  float64
	Forgave bool
}

// IsZero reports whether c changes nothing.
func (c BudgetChange) IsZero() bool { return c.Earned == 0 && !c.Forgave }

// TakeBudgetChange returns what happened to alias's retry budget here
// since the last call, and clears it: the caller shares it, or gives it
// back with [Health.ReturnBudgetChange] when it could not.
func (h *Health) TakeBudgetChange(alias string) BudgetChange {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.models[alias]
	if m == nil {
		return BudgetChange{}
	}
	c := BudgetChange{Earned: m.unshared, Forgave: m.forgave}
	m.unshared, m.forgave = 0, false
	return c
}

// ReturnBudgetChange gives back a change taken by
// [Health.TakeBudgetChange] that could not be shared, to be taken again
// with what happens meanwhile.
func (h *Health) ReturnBudgetChange(alias string, c BudgetChange) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m := h.models[alias]; m != nil {
		if c.Forgave {
			m.unshared, m.forgave = max(m.unshared, 0), true
		}
		m.unshared += c.Earned
	}
}

// MergeBudget returns the shared budget of alias with c applied, as of
// now: the value to store in place of shared (zero: none stored yet).
func (h *Health) MergeBudget(alias string, shared SharedBudget, c BudgetChange) SharedBudget {
	now := h.now()
	h.mu.Lock()
	m := h.models[alias]
	h.mu.Unlock()
	if m == nil {
		return shared
	}
	e := shared.Earned
	if !shared.At.IsZero() {
		e = m.cfg.settled(e, now.Sub(shared.At))
	}
	if c.Forgave {
		e = max(e, 0)
	}
	return SharedBudget{Earned: e + c.Earned, At: now}
}

// ApplySharedBudget makes alias's budget the shared one, at version (which
// grows with every change of the shared value; an older or the same
// version changes nothing), plus what happened here since the last
// [Health.TakeBudgetChange]. Retries in flight here still hold their
// tokens.
func (h *Health) ApplySharedBudget(alias string, shared SharedBudget, version uint64) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.models[alias]
	if m == nil || m.cfg.BudgetTokens <= 0 || version <= m.version {
		return
	}
	m.version = version
	e := shared.Earned
	if !shared.At.IsZero() {
		e = m.cfg.settled(e, now.Sub(shared.At))
	}
	if m.forgave {
		e = max(e, 0)
	}
	m.earned, m.at = e+m.unshared, now
	if m.earned >= 0 {
		m.spent = false
	}
}
