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
	// Alias is the model's alias.
	Alias string
	// BudgetTokens is what is left of the model's retry budget, out of
	// BudgetMax ([Retry.BudgetTokens]; 0 is no budget). Turns do not retry
	// the model while BudgetTokens is half of BudgetMax or less.
	BudgetTokens float64
	BudgetMax    float64
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
	h.mu.Lock()
	out := make([]ModelHealth, 0, len(h.models))
	for alias, m := range h.models {
		out = append(out, ModelHealth{
			Alias: alias, BudgetTokens: m.tokens, BudgetMax: m.cfg.BudgetTokens,
			CooldownUntil: m.until, CooldownKind: m.kind, Probing: m.probing,
		})
	}
	h.mu.Unlock()
	slices.SortFunc(out, func(a, b ModelHealth) int { return strings.Compare(a.Alias, b.Alias) })
	return out
}
