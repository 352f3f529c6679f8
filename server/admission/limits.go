package admission

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// KeyLimits bound what one client key may use. A limit left unset (nil)
// is no limit; 0 allows nothing, which suspends the key. Each replica
// keeps them at once; with a store, Server.ShareLimits shares them with
// the other replicas (shared.go), which can then go over a limit together
// only by what they start while the last use travels. The yaml names are
// the configuration file's keys (an auth key's limits block).
type KeyLimits struct {
	// ConcurrentTurns bounds the key's turns running at once.
	ConcurrentTurns *int `yaml:"concurrent_turns"`
	// TurnsPerMinute bounds the turns the key starts per minute (a token
	// bucket of that size, refilled evenly over the minute).
	TurnsPerMinute *int `yaml:"turns_per_minute"`
	// TokensPerMinute and TokensPerDay bound the tokens (input, output and
	// cached, of every model call, failed ones included) the key's turns
	// use, as buckets refilled evenly over the period. A turn starts only
	// when both buckets hold what its first model call may use (its
	// prompt and output: see reserve_output_tokens; the whole bucket at
	// most) beyond what the key's running turns hold for theirs; what it
	// uses is taken as it is reported, so a bucket may go into debt by
	// what running turns use beyond their calls' holds, and new turns wait
	// until it is paid back.
	TokensPerMinute *int64 `yaml:"tokens_per_minute"`
	TokensPerDay    *int64 `yaml:"tokens_per_day"`
	// StoredBytes bounds the bytes the key's running turns hold in the
	// turn store at once (their requests and events as stored): what the
	// store may not remove to make room while they run. A turn that would
	// go over it ends with QUOTA_EXHAUSTED, and a turn is not started
	// while the key's running turns hold it. Only with a store; the
	// configuration gives a key that leaves it out a quarter of
	// store.max_bytes.
	StoredBytes *int64 `yaml:"stored_bytes"`
	// CostPerDay and CostPerMonth are the key's budgets, in
	// pricing.currency: what its turns may cost per UTC day and per UTC
	// calendar month. A turn starts only when both cover what its first
	// model call may cost (its prompt and output at the model's prices:
	// see reserve_output_tokens; the whole budget at most) beyond what the
	// key's running turns hold for theirs, and a running turn makes a call
	// only when they cover what it may cost, else it ends with
	// BUDGET_EXHAUSTED. The key may use only models with a price.
	CostPerDay   *llm.Money `yaml:"cost_per_day"`
	CostPerMonth *llm.Money `yaml:"cost_per_month"`
	// ReserveOutputTokens is the output a model call of the key's turns
	// holds of its token limits and budgets until it reports what it used:
	// a turn starts only when they cover its first call's hold (its
	// prompt, estimated, and this output, at the model's prices) beyond
	// what its running turns hold, and a running turn's call is made only
	// when its budgets still cover it. Unset: the call's output limit (the
	// request's max_output_tokens, else the model's), or 4096 when neither
	// is set. 0 holds the prompt alone, and lets running turns go over
	// by their replies. Only with a token limit or a budget.
	ReserveOutputTokens *int64 `yaml:"reserve_output_tokens"`
}

// Problems lists every limit that is out of range; none when l is valid.
func (l KeyLimits) Problems() []llm.Problem {
	var out []llm.Problem
	neg := func(field string, set bool, v int64) {
		if set && v < 0 {
			out = append(out, llm.Problem{Field: field, Message: "must not be negative (0 allows nothing; leave it out for no limit)"})
		}
	}
	neg("concurrent_turns", l.ConcurrentTurns != nil, int64(deref(l.ConcurrentTurns)))
	neg("turns_per_minute", l.TurnsPerMinute != nil, int64(deref(l.TurnsPerMinute)))
	neg("tokens_per_minute", l.TokensPerMinute != nil, deref(l.TokensPerMinute))
	neg("tokens_per_day", l.TokensPerDay != nil, deref(l.TokensPerDay))
	neg("stored_bytes", l.StoredBytes != nil, deref(l.StoredBytes))
	neg("cost_per_day", l.CostPerDay != nil, int64(deref(l.CostPerDay)))
	neg("cost_per_month", l.CostPerMonth != nil, int64(deref(l.CostPerMonth)))
	if l.ReserveOutputTokens != nil && *l.ReserveOutputTokens < 0 {
		out = append(out, llm.Problem{Field: "reserve_output_tokens", Message: "must not be negative (0 holds the prompt alone)"})
	}
	return out
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// busyRetry is the wait a client is advised when it reached a limit of
// turns running at once: when one ends is not known in advance.
const busyRetry = time.Second

// Refusal is why a turn may not start, or a limit it reached: an error
// whose message says so to the client.
type Refusal struct {
	// Message says what was reached, and when to retry if waiting helps.
	Message string
	// Limit names the limit (concurrent_turns, cost_per_day, ...).
	Limit string
	// RetryAfter is the advised wait; zero when waiting never helps.
	RetryAfter time.Duration
	// Reason is the reason to report, BUDGET_EXHAUSTED for a budget
	// spent; empty for any other limit (LIMIT_EXCEEDED).
	Reason string
}

// Error implements error.
func (r *Refusal) Error() string { return r.Message }

// keyLimiter keeps one key's limits.
type keyLimiter struct {
	name     string
	limits   KeyLimits
	turns    *rate.Limiter // nil: no limit
	tokMin   *rate.Limiter
	tokDay   *rate.Limiter
	mu       sync.Mutex
	running  int
	stored   int64 // the bytes the key's running turns hold in the store
	now      func() time.Time
	periodOf map[*rate.Limiter]string
	budgets  []*budgetWindow // cost_per_day, cost_per_month (budget.go)
	share    *keyShare       // nil: the limits are this replica's alone (shared.go)
	// held is what the key's running turns here hold of its limits for
	// their next model calls (reserve.go); dropped, when not nil, is
	// closed when a hold drops, for the turns that wait for one.
	held    hold
	dropped chan struct{}
}

func newKeyLimiter(name string, l KeyLimits, now func() time.Time) *keyLimiter {
	k := &keyLimiter{name: name, limits: l, now: now, periodOf: map[*rate.Limiter]string{}, budgets: newBudgets(l, now())}
	if l.TurnsPerMinute != nil {
		k.turns = bucket(int64(*l.TurnsPerMinute), time.Minute, now())
	}
	if l.TokensPerMinute != nil {
		k.tokMin = bucket(*l.TokensPerMinute, time.Minute, now())
		k.periodOf[k.tokMin] = "minute"
	}
	if l.TokensPerDay != nil {
		k.tokDay = bucket(*l.TokensPerDay, 24*time.Hour, now())
		k.periodOf[k.tokDay] = "day"
	}
	return k
}

// bucket returns a full token bucket of size n refilled evenly over
// period.
func bucket(n int64, period time.Duration, now time.Time) *rate.Limiter {
	lim := rate.NewLimiter(rate.Limit(float64(n)/period.Seconds()), int(min(n, int64(^uint(0)>>1))))
	lim.SetBurstAt(now, lim.Burst()) // starts full at now
	return lim
}

// admit starts a turn of the key, or says why it may not start. The
// returned function ends the turn.
func (k *keyLimiter) admit() (func(), *Refusal) {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.now()
	l := k.limits
	if running := k.running + k.share.othersRunning(now); l.ConcurrentTurns != nil && running >= *l.ConcurrentTurns {
		r := &Refusal{Limit: "concurrent_turns", RetryAfter: busyRetry,
			Message: fmt.Sprintf("client key %q already runs %d turns, its limit; retry when one has ended", k.name, running)}
		if *l.ConcurrentTurns == 0 {
			r.Message, r.RetryAfter = fmt.Sprintf("client key %q may run no turns (concurrent_turns: 0)", k.name), 0
		}
		return nil, r
	}
	for _, lim := range []*rate.Limiter{k.tokMin, k.tokDay} {
		if lim == nil {
			continue
		}
		if tokens := lim.TokensAt(now); tokens < 1 {
			r := &Refusal{Limit: "tokens_per_" + k.periodOf[lim],
				Message: fmt.Sprintf("client key %q used its tokens per %s (%d)", k.name, k.periodOf[lim], lim.Burst())}
			if lim.Limit() > 0 {
				r.RetryAfter = ceilSecond(time.Duration((1 - tokens) / float64(lim.Limit()) * float64(time.Second)))
				r.Message += fmt.Sprintf("; retry in %s", r.RetryAfter)
			}
			return nil, r
		}
	}
	if r := k.budgetRefusal(now); r != nil {
		return nil, r
	}
	if k.turns != nil {
		res := k.turns.ReserveN(now, 1)
		if !res.OK() {
			return nil, &Refusal{Limit: "turns_per_minute", Message: fmt.Sprintf("client key %q may start no turns (turns_per_minute: 0)", k.name)}
		}
		if d := res.DelayFrom(now); d > 0 {
			res.CancelAt(now)
			d = ceilSecond(d)
			return nil, &Refusal{Limit: "turns_per_minute", RetryAfter: d,
				Message: fmt.Sprintf("client key %q started its %d turns per minute; retry in %s", k.name, k.turns.Burst(), d)}
		}
		if c := k.share.counter("turns"); c != nil {
			c.add(now, 1, "")
		}
	}
	k.running++
	var once sync.Once
	return func() {
		once.Do(func() {
			k.mu.Lock()
			k.running--
			k.mu.Unlock()
		})
	}, nil
}

// charge takes n used tokens from the key's token buckets, into debt if
// need be.
func (k *keyLimiter) charge(n int64) {
	if n <= 0 || k.tokMin == nil && k.tokDay == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.now()
	takeAt(k.tokMin, now, n)
	takeAt(k.tokDay, now, n)
	if c := k.share.counter("tokens"); c != nil {
		c.add(now, n, "")
	}
}

// ceilSecond rounds d up to a whole second, at least one: clients see
// waits in seconds.
func ceilSecond(d time.Duration) time.Duration {
	return max(time.Second, (d+time.Second-1)/time.Second*time.Second)
}

// Gate bounds the turns the server runs at once
// (server.max_concurrent_turns).
type Gate struct {
	mu      sync.Mutex
	max     int
	running int
}

// NewGate returns the gate of max turns at once.
func NewGate(max int) *Gate { return &Gate{max: max} }

// Enter starts a turn, or fails with the *Refusal that says the server
// runs max turns. The returned function ends the turn (once).
func (g *Gate) Enter() (func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.running >= g.max {
		return nil, &Refusal{Limit: "max_concurrent_turns", RetryAfter: busyRetry,
			Message: fmt.Sprintf("the server runs %d turns, its limit (server.max_concurrent_turns); retry shortly or on another replica", g.running)}
	}
	g.running++
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			g.running--
			g.mu.Unlock()
		})
	}, nil
}

// Admit starts a turn of the key, or fails with the *Refusal that says
// which of its limits or budgets it reached. The returned function ends
// the turn (once). A nil key admits every turn.
func (k *Client) Admit() (func(), error) {
	if k == nil {
		return func() {}, nil
	}
	end, r := k.limiter.admit()
	if r != nil {
		return nil, r
	}
	return end, nil
}

// Slots are the server's and the key's turn slots a RunTurn call was
// admitted with. The call frees them when it ends, unless a turn that
// outlives it (a durable turn) kept them: then the turn frees them when it
// ends, so a client that disconnects does not free its key's slot while
// its turn still runs.
type Slots struct {
	mu   sync.Mutex
	free []func()
	kept bool
}

// NewSlots returns the slots that free frees, in order.
func NewSlots(free ...func()) *Slots { return &Slots{free: free} }

// Add adds a slot that free frees; on nil slots (a call that was not
// admitted) it does nothing.
func (h *Slots) Add(free func()) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.free = append(h.free, free)
}

// Keep hands the slots to a turn that outlives the call: the returned
// function frees them (once). On nil slots (a call that was not
// admitted, as in tests of the service alone) it returns a no-op.
func (h *Slots) Keep() (release func()) {
	if h == nil {
		return func() {}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.kept = true
	var once sync.Once
	return func() { once.Do(h.release) }
}

// CallEnded frees the slots when the call ends, unless a turn kept them.
func (h *Slots) CallEnded() {
	if h == nil {
		return
	}
	h.mu.Lock()
	kept := h.kept
	h.kept = true // freed once, here or by the turn
	h.mu.Unlock()
	if !kept {
		h.release()
	}
}

func (h *Slots) release() {
	for _, f := range h.free {
		f()
	}
}

// slotsContext is the context key of a RunTurn call's *Slots.
type slotsContext struct{}

// WithSlots returns ctx carrying the call's slots.
func WithSlots(ctx context.Context, h *Slots) context.Context {
	return context.WithValue(ctx, slotsContext{}, h)
}

// SlotsFrom returns the call's slots; nil when it was not admitted.
func SlotsFrom(ctx context.Context) *Slots {
	h, _ := ctx.Value(slotsContext{}).(*Slots)
	return h
}

// Hold counts a turn of the key that is already running and must go on
// whatever the key's limits say now: a turn taken over from a replica that
// went away, admitted there. While it runs the key's count may exceed
// concurrent_turns, and its new turns wait until it is back under. The
// returned function ends the turn. A nil key holds nothing.
func (k *Client) Hold() func() {
	if k == nil {
		return func() {}
	}
	return k.limiter.hold()
}

// hold is [Client.Hold].
func (k *keyLimiter) hold() func() {
	k.mu.Lock()
	k.running++
	k.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			k.mu.Lock()
			k.running--
			k.mu.Unlock()
		})
	}
}

// Charger charges a turn's tokens and cost to its key as the running
// totals arrive, and the bytes the turn stores to the key's stored_bytes;
// it holds what the turn's next model call may use (reserve.go) until the
// call's usage is charged. A nil *Charger (no keys) charges nothing.
type Charger struct {
	k        *keyLimiter
	last     int64
	lastCost int64 // the nanos of the turn's cost charged so far
	stored   int64 // the bytes this turn stored
	// estimates are the estimates of the turn's cut calls seen in their
	// LLMCallFinished; est and estCost are what of them was charged.
	estimates    llm.Usage
	est, estCost int64
	// held is what the turn holds for its next call; settling says its
	// call finished and the usage that settles the hold comes next. Both
	// are guarded by the key's mutex.
	held     hold
	settling bool
}

// Charger returns the charger of a new turn of the key; nil for a nil
// key.
func (k *Client) Charger() *Charger {
	if k == nil {
		return nil
	}
	return &Charger{k: k.limiter}
}

// ResumedCharger returns the charger of a turn of the key taken over from
// a replica that went away, whose use so far, u (its running totals), was
// charged where it was used; nil for a nil key.
func (k *Client) ResumedCharger(u llm.Usage) *Charger {
	if k == nil {
		return nil
	}
	return &Charger{k: k.limiter, last: u.Tokens(), lastCost: u.Cost.Nanos}
}

// Event charges what ev tells of the turn's use so far: the running totals
// of a UsageUpdated, the estimate of a call cut with no usage reported in
// its LLMCallFinished, or the whole turn's of its TurnError, which counts a
// call the turn's end cut short (a client that cancels each turn mid-call
// pays for what the provider reported of it, or for the estimate of its
// prompt when the provider reported nothing).
func (c *Charger) Event(ev runtime.Event) {
	if c == nil || c.k == nil {
		return
	}
	switch p := ev.Payload.(type) {
	case *runtime.UsageUpdated:
		c.total(p.Total)
		c.settled(false)
	case *runtime.LLMCallFinished:
		if !p.Estimated.IsZero() {
			c.estimates = c.estimates.Add(p.Estimated)
			c.estimated(c.estimates)
		}
		// The call's hold goes once its use is charged: now, or with the
		// running totals that follow a call that reported usage.
		c.settled(!p.Usage.IsZero())
	case *runtime.TurnError:
		c.Ended(p)
	}
}

// settled drops the turn's hold once its call's use is charged; pending
// says the usage that charges it comes next (UsageUpdated).
func (c *Charger) settled(pending bool) {
	if c == nil || c.k == nil || !c.k.holds() {
		return
	}
	k := c.k
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case pending:
		c.settling = true
	case c.settling || c.held != (hold{}):
		c.settling = false
		k.setHold(k.now(), c, hold{})
	}
}

// Ended charges the whole use of a turn that ended with te: what its
// providers reported and the estimates of its calls cut with none; the
// turn holds nothing more.
func (c *Charger) Ended(te *runtime.TurnError) {
	c.total(te.Usage)
	c.estimated(te.Estimated)
	c.Unreserve()
}

// estimated charges the turn's running total u of the estimates of its
// calls cut with no usage reported: what it adds to those charged before.
func (c *Charger) estimated(u llm.Usage) {
	if c == nil || c.k == nil {
		return
	}
	n := u.Tokens()
	c.k.charge(n - c.est)
	c.est = max(c.est, n)
	c.k.spend(u.Cost.Nanos - c.estCost)
	c.estCost = max(c.estCost, u.Cost.Nanos)
}

// total charges the turn's running totals u: what they add to those
// charged before.
func (c *Charger) total(u llm.Usage) {
	if c == nil || c.k == nil {
		return
	}
	n := u.Tokens()
	c.k.charge(n - c.last)
	c.last = max(c.last, n)
	c.k.spend(u.Cost.Nanos - c.lastCost)
	c.lastCost = max(c.lastCost, u.Cost.Nanos)
}

// Store counts n more bytes the turn stores; it fails with an *llm.Error
// of [llm.KindQuotaExhausted], counting none, when they would take the
// key's running turns over its stored_bytes.
func (c *Charger) Store(n int) error {
	if c == nil || c.k == nil {
		return nil
	}
	k := c.k
	k.mu.Lock()
	defer k.mu.Unlock()
	if lim := k.limits.StoredBytes; lim != nil && k.stored+int64(n) > *lim {
		return &llm.Error{
			Kind: llm.KindQuotaExhausted,
			Message: fmt.Sprintf("the turns client key %q runs hold %d bytes in the turn store, and this turn's next event of %d bytes would take them over the key's limit (stored_bytes: %d); the turn was ended",
				k.name, k.stored, n, *lim),
		}
	}
	k.stored += int64(n)
	c.stored += int64(n)
	return nil
}

// Release gives back the bytes the turn stored, and what it held for a
// model call: it ended, and the store may remove them when it needs room.
func (c *Charger) Release() {
	if c == nil || c.k == nil {
		return
	}
	c.k.mu.Lock()
	c.k.stored -= c.stored
	c.k.mu.Unlock()
	c.stored = 0
	c.Unreserve()
}

// StoredRefusal returns the *Refusal of a turn whose request is n bytes,
// which may not start under the key's stored_bytes: its running turns hold
// too much; nil when it may (always for a nil key).
func (k *Client) StoredRefusal(n int) error {
	if k == nil {
		return nil
	}
	if r := k.limiter.storedRefusal(n); r != nil {
		return r
	}
	return nil
}

// storedRefusal is [Client.StoredRefusal].
func (k *keyLimiter) storedRefusal(n int) *Refusal {
	k.mu.Lock()
	defer k.mu.Unlock()
	lim := k.limits.StoredBytes
	if lim == nil || k.stored+int64(n) <= *lim {
		return nil
	}
	r := &Refusal{Limit: "stored_bytes", RetryAfter: busyRetry,
		Message: fmt.Sprintf("the turns client key %q runs hold %d bytes in the turn store; with this request's %d the key would be over its limit (stored_bytes: %d); retry when one has ended", k.name, k.stored, n, *lim)}
	if int64(n) > *lim {
		r.RetryAfter = 0
		r.Message = fmt.Sprintf("the request (%d bytes) is larger than client key %q may hold in the turn store (stored_bytes: %d)", n, k.name, *lim)
	}
	return r
}
