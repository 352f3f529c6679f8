package policy

import (
	"math"
	"sync"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// creditHalfLife is how fast the tokens that working retries earned beyond
// a budget's size fade: half of them are gone after this long, so a model
// that was healthy a few seconds ago is not trusted for long.
const creditHalfLife = 2 * time.Second

// Health tracks, per model alias and across every turn of a process, the
// cooldowns that keep new turns off a failing model and the adaptive retry
// budget that stops retry storms. It reads time from the clock given to
// [NewHealth], so tests can drive it. It is safe for concurrent use. The
// zero value is not usable; call NewHealth.
//
// # The retry budget
//
// The budget decides from whether retries work, not from whether calls
// fail. A model's budget holds Retry.BudgetTokens tokens. Each retry (and
// each hedged call) takes one token when it is decided and holds it until
// the model answers it (its first chunk) or it fails; retries stop while
// less than one token is left. When the retried call ends, a retry that
// worked (its call succeeded) gives its token back and earns one more; one
// that failed does not give its token back; one the caller cancelled gives
// it back and earns nothing. So retries sustain themselves while at least
// half of them work, and an outage, where every retry fails, stops them
// after BudgetTokens failed retries. Spent tokens come back with time,
// Retry.BudgetRefill per second: a quiet or idle model recovers, and during
// an outage the budget, once spent, is half-open each time the refill
// brings a token back (about every 1/BudgetRefill seconds): the model's
// next call is a probe. When it succeeds — a first attempt or a retry —
// the model is answering again, and what failed retries spent is forgiven
// at once; when it fails, the token is spent again, so a model that keeps
// failing gets no retries at all. Tokens earned beyond the budget's size
// let busy models keep many retries in flight; they fade with a half-life
// of two seconds.
type Health struct {
	now    func() time.Time
	mu     sync.Mutex
	models map[string]*modelHealth
}

type modelHealth struct {
	cfg Retry
	// earned is what retry outcomes added to the budget (negative: what
	// failed retries took), as of at; pending counts the retries that hold
	// a token while they wait for an answer. The budget's level is
	// cfg.BudgetTokens + earned - pending.
	earned  float64
	at      time.Time
	pending int
	// spent is set when a retry found no token left, until a probe finds
	// the model answering or the refill makes the budget whole.
	spent bool
	// until ends the cooldown; zero when the model is healthy. since is
	// when the cooldown in force was set (or last extended).
	until time.Time
	since time.Time
	// kind is the class of failure that started the cooldown.
	kind llm.Kind
	// unshared is what retry outcomes here added to earned since they
	// were last taken to be shared with other replicas (see
	// [Health.TakeBudgetChange]); forgave is set when a probe here forgave
	// the spent budget meanwhile. version is the shared budget's version
	// last applied.
	unshared float64
	forgave  bool
	version  uint64
	// probing is set while one turn probes the model after its cooldown
	// ended (half-open); other turns keep skipping it meanwhile.
	probing bool
}

// NewHealth returns the state of the models given, each with its retry
// settings, reading time from now (time.Now when nil). Aliases it does not
// know are always admitted, never cool down and have no retry budget.
func NewHealth(models map[string]Retry, now func() time.Time) *Health {
	if now == nil {
		now = time.Now
	}
	h := &Health{now: now, models: make(map[string]*modelHealth, len(models))}
	t := now()
	for alias, r := range models {
		h.models[alias] = &modelHealth{cfg: r, at: t}
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
func (h *Health) Admit(alias string) Admission {
	now := h.now()
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
func (h *Health) Available(alias string) bool {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.models[alias]
	return m == nil || m.until.IsZero() || (!now.Before(m.until) && !m.probing)
}

// Healthy reports whether alias has no cooldown at all, ended or not: the
// model may take extra load, such as a hedged call.
func (h *Health) Healthy(alias string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.models[alias]
	return m == nil || m.until.IsZero()
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

// Success records a successful call of a turn admitted to the model at
// admitted (by the Health's clock): it ends the cooldown — unless the turn
// was admitted before the cooldown was set and its call is not the probe,
// since the failure that set the cooldown (on this replica or another) is
// newer news than the call — and a call that probes a spent retry budget
// (see [Health]) makes it whole again.
func (h *Health) Success(alias string, admitted time.Time) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.models[alias]
	if m == nil {
		return
	}
	// A call sent before the cooldown was set says nothing against it:
	// the failure that set it (here, or on another replica) is newer.
	if m.probing || m.until.IsZero() || !admitted.Before(m.since) {
		m.until, m.probing = time.Time{}, false
	}
	if m.halfOpen(now) {
		m.forgive()
	}
}

// Failure records a failed call that holds no [Ticket] (a first attempt)
// and failed with a class of kind k. It changes nothing unless the call
// probes a spent retry budget: a transient failure then spends the token
// the refill brought back, and the budget stays spent.
func (h *Health) Failure(alias string, k llm.Kind) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if m := h.models[alias]; m != nil && RuleFor(k).Transient && m.halfOpen(now) {
		m.add(-1)
	}
}

// Cooldown keeps new turns off alias for d from now, or ends a failed probe
// with a fresh cooldown. A shorter cooldown never cuts a longer one short.
func (h *Health) Cooldown(alias string, k llm.Kind, d time.Duration) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.models[alias]
	if m == nil || d <= 0 {
		return
	}
	if until := now.Add(d); until.After(m.until) {
		m.until, m.since, m.kind = until, now, k
	}
	m.probing = false
}

// Reserve takes a token of alias's retry budget for a retry or a hedged
// call about to be made, and reports whether one was left. The ticket it
// returns must be told when the call is answered and how it ended; it is
// nil (and its methods do nothing) when the model has no budget. When no
// token is left it returns nil, false and takes nothing.
func (h *Health) Reserve(alias string) (*Ticket, bool) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.models[alias]
	if m == nil || m.cfg.BudgetTokens <= 0 {
		return nil, true
	}
	if m.level(now) < 1 {
		m.spent = true
		return nil, false
	}
	m.pending++
	return &Ticket{h: h, m: m, probe: m.spent}, true
}

// level returns the budget's tokens at now, after the refill and the fading
// of earned tokens since the last update.
func (m *modelHealth) level(now time.Time) float64 {
	m.settle(now)
	return m.cfg.BudgetTokens + m.earned - float64(m.pending)
}

// settle brings earned up to now: spent tokens come back at BudgetRefill
// per second, tokens earned beyond the budget's size fade with
// creditHalfLife. A budget refilled whole is no longer spent.
func (m *modelHealth) settle(now time.Time) {
	dt := now.Sub(m.at)
	if dt <= 0 {
		return
	}
	m.at = now
	m.earned = m.cfg.settled(m.earned, dt)
	if m.earned >= 0 {
		m.spent = false
	}
}

// settled returns earned dt later: spent tokens come back at BudgetRefill
// per second, tokens earned beyond the budget's size fade with
// creditHalfLife.
func (r Retry) settled(earned float64, dt time.Duration) float64 {
	if dt <= 0 {
		return earned
	}
	switch {
	case earned < 0:
		return min(earned+r.BudgetRefill*dt.Seconds(), 0)
	case earned > 0:
		return earned * math.Exp2(-dt.Seconds()/creditHalfLife.Seconds())
	}
	return earned
}

// add records a retry outcome's tokens: earned here, and to be shared.
func (m *modelHealth) add(tokens float64) {
	m.earned += tokens
	m.unshared += tokens
}

// halfOpen reports whether the budget was spent and has refilled a token
// since: the model's next call probes it.
func (m *modelHealth) halfOpen(now time.Time) bool {
	return m.cfg.BudgetTokens > 0 && m.spent && m.level(now) >= 1
}

// forgive ends a spent budget: the model answered a probe, so what failed
// retries spent is forgiven.
func (m *modelHealth) forgive() {
	m.earned, m.spent = max(m.earned, 0), false
	// What failed here before is forgiven too; the replicas' is, once
	// shared.
	m.unshared, m.forgave = max(m.unshared, 0), true
}

// Ticket is a retry's or a hedged call's claim on a model's retry budget,
// from [Health.Reserve]. Its methods may be called from any goroutine; only
// the first that reports an outcome counts. A nil Ticket does nothing.
type Ticket struct {
	h        *Health
	m        *modelHealth
	probe    bool // the call was admitted by a spent budget's refill
	answered bool
	done     bool
}

// Answered reports that the model answered the call (its first chunk
// arrived): the call no longer holds a token while it streams.
func (t *Ticket) Answered() {
	if t == nil {
		return
	}
	t.h.mu.Lock()
	defer t.h.mu.Unlock()
	t.answer()
}

func (t *Ticket) answer() {
	if !t.answered && !t.done {
		t.answered = true
		t.m.pending--
	}
}

// Settle reports how the call ended: worked (it succeeded) earns the
// budget a token, a failure spends one. A retry admitted by a spent
// budget's refill that works is a probe that found the model answering
// again: what failed retries spent is forgiven.
func (t *Ticket) Settle(worked bool) {
	if t == nil {
		return
	}
	t.finish(func(m *modelHealth) {
		switch {
		case !worked:
			m.add(-1)
		case t.probe && m.spent:
			m.forgive()
			m.add(1)
		default:
			m.add(1)
		}
	})
}

// Cancel reports that the call ended without saying anything of the model
// (the turn was cancelled, or a hedged pair's other call won): its token
// comes back and nothing is earned.
func (t *Ticket) Cancel() {
	if t == nil {
		return
	}
	t.finish(func(*modelHealth) {})
}

func (t *Ticket) finish(apply func(*modelHealth)) {
	now := t.h.now()
	t.h.mu.Lock()
	defer t.h.mu.Unlock()
	if t.done {
		return
	}
	t.answer()
	t.done = true
	t.m.settle(now)
	apply(t.m)
}
