package policy

import (
	"slices"
	"strings"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// ModelHealth is a copy of one model's shared state, read for gauges and
// status pages; changing it changes nothing.
type ModelHealth struct {
	// Alias is the model's alias: the name its state is kept under in
	// [Health] (the runtime keeps one per deployment of a model of several,
	// and names it in Deployment when it reads them).
	Alias string
	// Deployment is the deployment of Alias the state is of; empty for a
	// model of one deployment.
	Deployment string
	// BudgetTokens is what is left of the model's retry budget now, out of
	// BudgetMax ([Retry.BudgetTokens]; 0 is no budget). Turns do not retry
	// the model while less than one token is left. It may exceed BudgetMax
	// while retries that worked have earned credit, and is lowered by
	// PendingRetries, the retries and hedged calls holding a token while
	// they wait for the model's answer.
	BudgetTokens   float64
	BudgetMax      float64
	PendingRetries int
	// CooldownUntil ends the model's cooldown; zero when it has none.
	// CooldownKind is the class of failure that started it.
	CooldownUntil time.Time
	CooldownKind  llm.Kind
	// Probing is set while one turn probes the model after its cooldown
	// ended (half-open).
	Probing bool
}

// CoolingDown reports whether new turns skip the model at now: its
// cooldown has not ended, or a turn is probing it.
func (m ModelHealth) CoolingDown(now time.Time) bool {
	return !m.CooldownUntil.IsZero() && (now.Before(m.CooldownUntil) || m.Probing)
}

// Snapshot returns the state of every model h tracks, sorted by alias.
func (h *Health) Snapshot() []ModelHealth {
	now := h.now()
	h.mu.Lock()
	out := make([]ModelHealth, 0, len(h.models))
	for alias, m := range h.models {
		s := ModelHealth{
			Alias: alias, PendingRetries: m.pending,
			CooldownUntil: m.until, CooldownKind: m.kind, Probing: m.probing,
		}
		if m.cfg.BudgetTokens > 0 {
			s.BudgetTokens, s.BudgetMax = m.level(now), m.cfg.BudgetTokens
		}
		out = append(out, s)
	}
	h.mu.Unlock()
	slices.SortFunc(out, func(a, b ModelHealth) int { return strings.Compare(a.Alias, b.Alias) })
	return out
}
