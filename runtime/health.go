package runtime

import (
	"sync"
	"time"
)

// health tracks, per model alias and across every turn of a process, the
// cooldowns that keep new turns off a failing model and the retry budget
// that stops retry storms (in the spirit of gRPC's retryThrottling).
type health struct {
	mu     sync.Mutex
	models map[string]*modelHealth
}

type modelHealth struct {
	cfg RetryConfig
	// tokens is the retry budget; retries are allowed while it is above
	// half of cfg.BudgetTokens.
	tokens float64
	// until ends the cooldown; zero when the model is healthy.
	until time.Time
	// kind is the class of failure that started the cooldown.
	kind Kind
	// probing is set while one turn probes the model after its cooldown
	// ended (half-open); other turns keep skipping it meanwhile.
	probing bool
}

func newHealth(models map[string]*Model) *health {
	h := &health{models: make(map[string]*modelHealth, len(models))}
	for alias, m := range models {
		h.models[alias] = &modelHealth{cfg: m.Retry, tokens: m.Retry.BudgetTokens}
	}
	return h
}

// admission is a turn's permission to call a model.
type admission struct {
	ok bool
	// probe is set when the turn is the one probing the model after a
	// cooldown; it must report the outcome through success or failure, or
	// release.
	probe bool
	// until and kind describe the cooldown that refused the turn.
	until time.Time
	kind  Kind
}

// admit reports whether a turn may call alias now.
func (h *health) admit(alias string, now time.Time) admission {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.models[alias]
	switch {
	case m == nil || m.until.IsZero():
		return admission{ok: true}
	case now.Before(m.until) || m.probing:
		return admission{until: m.until, kind: m.kind}
	}
	m.probing = true
	return admission{ok: true, probe: true}
}

// available reports whether a turn could call alias now, without claiming
// a probe.
func (h *health) available(alias string, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.models[alias]
	return m == nil || m.until.IsZero() || (!now.Before(m.until) && !m.probing)
}

// release ends a probe whose outcome says nothing of the model's health
// (for example the turn was cancelled).
func (h *health) release(alias string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m := h.models[alias]; m != nil {
		m.probing = false
	}
}

// success records a successful call: it ends any cooldown and earns back
// part of the retry budget.
func (h *health) success(alias string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.models[alias]
	if m == nil {
		return
	}
	m.until, m.probing = time.Time{}, false
	m.tokens = min(m.tokens+m.cfg.BudgetRatio, m.cfg.BudgetTokens)
}

// failure records a failed call of kind k, spending a budget token when the
// failure is transient, and reports whether the budget now forbids retries.
func (h *health) failure(alias string, k Kind) (exhausted bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.models[alias]
	if m == nil || m.cfg.BudgetTokens <= 0 {
		return false
	}
	if Transient(k) {
		m.tokens = max(m.tokens-1, 0)
	}
	return m.tokens <= m.cfg.BudgetTokens/2
}

// cooldown keeps new turns off alias until now+d, or ends a failed probe
// with a fresh cooldown. A shorter cooldown never cuts a longer one short.
func (h *health) cooldown(alias string, k Kind, now time.Time, d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.models[alias]
	if m == nil || d <= 0 {
		return
	}
	if until := now.Add(d); until.After(m.until) {
		m.until, m.kind = until, k
	}
	m.probing = false
}
