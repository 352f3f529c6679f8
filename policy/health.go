package policy

import (
	"sync"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// Health tracks, per model alias and across every turn of a process, the
// cooldowns that keep new turns off a failing model and the retry budget
// that stops retry storms (in the spirit of gRPC's retryThrottling). It is
// safe for concurrent use. The zero value is not usable; call [NewHealth].
type Health struct {
	mu     sync.Mutex
	models map[string]*modelHealth
}

type modelHealth struct {
	cfg Retry
	// tokens is the retry budget; retries are allowed while it is above
	// half of cfg.BudgetTokens.
	tokens float64
	// until ends the cooldown; zero when the model is healthy.
	until time.Time
	// kind is the class of failure that started the cooldown.
	kind llm.Kind
	// probing is set while one turn probes the model after its cooldown
	// ended (half-open); other turns keep skipping it meanwhile.
	probing bool
}

// NewHealth returns the state of the models given, each with its retry
// settings. Aliases it does not know are always admitted and never cool
// down.
func NewHealth(models map[string]Retry) *Health {
	h := &Health{models: make(map[string]*modelHealth, len(models))}
	for alias, r := range models {
		h.models[alias] = &modelHealth{cfg: r, tokens: r.BudgetTokens}
	}
	return h
}

// Admission is a turn's permission to call a model.
type Admission struct {
	// OK reports that the turn may call the model.
	OK bool
	// Probe is set when the turn is the one probing the model after a
	// cooldown; it must report the outcome through Success or Cooldown, or
	// call Release.
	Probe bool
	// Until and Kind describe the cooldown that refused the turn.
	Until time.Time
	Kind  llm.Kind
}

// Admit reports whether a turn may call alias now. After a cooldown ends,
// the first turn admitted probes the model; others are refused until the
// probe reports.
func (h *Health) Admit(alias string, now time.Time) Admission {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.models[alias]
	switch {
	case m == nil || m.until.IsZero():
		return Admission{OK: true}
	case now.Before(m.until) || m.probing:
		return Admission{Until: m.until, Kind: m.kind}
	}
	m.probing = true
	return Admission{OK: true, Probe: true}
}

// Available reports whether a turn could call alias now, without claiming
// a probe.
func (h *Health) Available(alias string, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.models[alias]
	return m == nil || m.until.IsZero() || (!now.Before(m.until) && !m.probing)
}

// Release ends a probe whose outcome says nothing of the model's health
// (for example the turn was cancelled).
func (h *Health) Release(alias string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m := h.models[alias]; m != nil {
		m.probing = false
	}
}

// Success records a successful call: it ends any cooldown and earns back
// part of the retry budget.
func (h *Health) Success(alias string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.models[alias]
	if m == nil {
		return
	}
	m.until, m.probing = time.Time{}, false
	m.tokens = min(m.tokens+m.cfg.BudgetRatio, m.cfg.BudgetTokens)
}

// Failure records a failed call of class k, spending a budget token when
// the class is transient ([Rule.Transient]), and reports whether the
// budget now forbids retries. A model without a budget never exhausts it.
func (h *Health) Failure(alias string, k llm.Kind) (exhausted bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.models[alias]
	if m == nil || m.cfg.BudgetTokens <= 0 {
		return false
	}
	if RuleFor(k).Transient {
		m.tokens = max(m.tokens-1, 0)
	}
	return m.tokens <= m.cfg.BudgetTokens/2
}

// Cooldown keeps new turns off alias until now+d, or ends a failed probe
// with a fresh cooldown. A shorter cooldown never cuts a longer one short.
func (h *Health) Cooldown(alias string, k llm.Kind, now time.Time, d time.Duration) {
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
