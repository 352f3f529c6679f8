package policy_test

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
)

// clock is a manual clock for Health.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// budgetHealth returns the health of one model, m, with a budget of 10
// tokens refilling at one per second.
func budgetHealth(c *clock) *policy.Health {
	r := policy.DefaultRetry()
	r.BudgetTokens, r.BudgetRefill = 10, 1
	return policy.NewHealth(map[string]policy.Retry{"m": r}, c.now)
}

func budget(h *policy.Health) float64 {
	for _, s := range h.Snapshot() {
		if s.Alias == "m" {
			return s.BudgetTokens
		}
	}
	return -1
}

// retry makes one retry on m that worked or failed, and reports whether the
// budget allowed it.
func retry(h *policy.Health, worked bool) bool {
	ticket, ok := h.Reserve("m")
	if ok {
		ticket.Answered()
		ticket.Settle(worked)
	}
	return ok
}

// TestBudgetKeepsRetriesThatWork: under random independent faults, retries
// mostly work, and the budget never stops them — where the old token
// bucket (a token per failure, 0.1 per success) ran dry at 30% faults.
func TestBudgetKeepsRetriesThatWork(t *testing.T) {
	c := newClock()
	h := budgetHealth(c)
	rng := rand.New(rand.NewPCG(1, 2))
	refused := 0
	for range 10000 {
		c.advance(20 * time.Millisecond)
		if !retry(h, rng.Float64() >= 0.3) {
			refused++
		}
	}
	if refused != 0 {
		t.Errorf("%d of 10000 retries refused while 70%% of retries work", refused)
	}
}

// TestBudgetStopsFailingRetries: when every retry fails (an outage), the
// budget stops retries after budget_tokens failures, then lets one probe
// through per second of refill; a probe that works starts earning again.
func TestBudgetStopsFailingRetries(t *testing.T) {
	c := newClock()
	h := budgetHealth(c)
	allowed := 0
	for range 100 {
		if retry(h, false) {
			allowed++
		}
	}
	if allowed != 10 {
		t.Errorf("an outage got %d retries through a budget of 10 before it stopped them, want 10", allowed)
	}
	// One second of refill: exactly one probe.
	c.advance(time.Second)
	if !retry(h, false) {
		t.Error("no probe after a second of refill")
	}
	if retry(h, false) {
		t.Error("a second probe in the same second")
	}
	// Ten seconds of a sustained outage with a retry wanted every 10ms:
	// about one probe per second gets through.
	probes := 0
	for range 1000 {
		c.advance(10 * time.Millisecond)
		if retry(h, false) {
			probes++
		}
	}
	if probes < 9 || probes > 11 {
		t.Errorf("%d probes in 10s of outage, want about 10 (budget_refill 1/s)", probes)
	}
	// The model is back: probes work, each earning more room.
	c.advance(time.Second)
	for i := range 20 {
		if !retry(h, true) {
			t.Fatalf("retry %d after the model came back was refused (budget %.2f)", i, budget(h))
		}
	}
}

// TestBudgetHalfOpen: once spent, the budget is half-open each time the
// refill brings a token back, and the model's next call probes it: a first
// attempt that fails spends the token (no retry follows it), one that
// succeeds forgives what failed retries spent — the outage is over. A
// success while no token has come back yet proves nothing.
func TestBudgetHalfOpen(t *testing.T) {
	c := newClock()
	h := budgetHealth(c)
	for range 11 {
		retry(h, false)
	}
	h.Success("m", c.now()) // no token back yet: not a probe
	if retry(h, true) {
		t.Fatal("a retry got through a spent budget")
	}
	c.advance(time.Second)
	h.Failure("m", llm.KindOverloaded) // the probe: a first attempt fails
	if retry(h, true) {
		t.Error("the failed probe's retry got through")
	}
	c.advance(time.Second)
	h.Failure("m", llm.KindContextOverflow) // not the model's health: no probe
	h.Success("m", c.now())                 // the probe: the model answers
	if got := budget(h); got != 10 {
		t.Errorf("budget after a successful probe = %v, want 10", got)
	}
	if !retry(h, false) {
		t.Error("no retry after the model came back")
	}
}

// TestBudgetRefillsWhenIdle: an idle model's spent budget comes back with
// time — the old bucket never refilled, so a quiet server stopped retrying
// for good.
func TestBudgetRefillsWhenIdle(t *testing.T) {
	c := newClock()
	h := budgetHealth(c)
	for range 10 {
		retry(h, false)
	}
	if got := budget(h); got != 0 {
		t.Fatalf("budget after 10 failed retries = %v, want 0", got)
	}
	c.advance(4 * time.Second)
	if got := budget(h); got != 4 {
		t.Errorf("budget after 4s idle = %v, want 4", got)
	}
	c.advance(time.Minute)
	if got := budget(h); got != 10 {
		t.Errorf("budget after a minute idle = %v, want its size, 10", got)
	}
}

// TestBudgetCreditFades: retries that worked let a busy model hold more
// retries in flight than the budget's size, but that credit fades with a
// half-life of two seconds, so an outage that follows a healthy period is
// throttled soon.
func TestBudgetCreditFades(t *testing.T) {
	c := newClock()
	h := budgetHealth(c)
	for range 30 {
		retry(h, true)
	}
	if got := budget(h); got != 40 {
		t.Fatalf("budget after 30 retries that worked = %v, want 40", got)
	}
	c.advance(2 * time.Second)
	if got := budget(h); got != 25 {
		t.Errorf("budget two seconds later = %v, want 10 + 30/2", got)
	}
	c.advance(time.Minute)
	if got := budget(h); got < 10 || got > 10.001 {
		t.Errorf("budget a minute later = %v, want back to its size", got)
	}
}

// TestBudgetBoundsRetriesInFlight: retries waiting for an answer hold
// their tokens, so a burst of simultaneous failures (every turn hitting a
// dead model at once) gets at most budget_tokens retries; an answer frees
// the token, and a cancelled retry gives it back.
func TestBudgetBoundsRetriesInFlight(t *testing.T) {
	c := newClock()
	h := budgetHealth(c)
	var tickets []*policy.Ticket
	for {
		ticket, ok := h.Reserve("m")
		if !ok {
			break
		}
		tickets = append(tickets, ticket)
	}
	if len(tickets) != 10 {
		t.Fatalf("%d retries in flight at once, want 10", len(tickets))
	}
	tickets[0].Answered() // streaming: no longer holds its token
	tickets[1].Cancel()   // the turn was cancelled: its token comes back
	tickets[1].Settle(false)
	if got := budget(h); got != 2 {
		t.Errorf("budget = %v, want 2 (one answered, one cancelled, settling after Cancel ignored)", got)
	}
	tickets[0].Settle(true)
	if got := budget(h); got != 3 {
		t.Errorf("budget after the answered retry worked = %v, want 3", got)
	}
}

// TestBudgetTicketsConcurrently settles tickets from many goroutines, as
// hedged calls do; run with -race.
func TestBudgetTicketsConcurrently(t *testing.T) {
	c := newClock()
	h := budgetHealth(c)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 1000 {
				ticket, ok := h.Reserve("m")
				if !ok {
					continue
				}
				ticket.Answered()
				if i%2 == 0 {
					ticket.Settle(true)
				} else {
					ticket.Cancel()
				}
			}
		})
	}
	wg.Wait()
	if s := h.Snapshot()[0]; s.PendingRetries != 0 {
		t.Errorf("pending retries = %d after every ticket settled", s.PendingRetries)
	}
}

func TestUnknownModelHasNoBudget(t *testing.T) {
	h := policy.NewHealth(nil, nil)
	ticket, ok := h.Reserve("other")
	if !ok || ticket != nil {
		t.Errorf("Reserve(unknown) = %v, %v; want nil, true", ticket, ok)
	}
	ticket.Answered()
	ticket.Settle(false)
	ticket.Cancel()
	if !h.Admit("other").OK || !h.Available("other") || !h.Healthy("other") {
		t.Error("an unknown model is not admitted")
	}
}

func TestCooldownAndProbe(t *testing.T) {
	c := newClock()
	h := budgetHealth(c)
	h.Cooldown("m", llm.KindRateLimited, 10*time.Second)
	if a := h.Admit("m"); a.OK || a.Kind != llm.KindRateLimited || h.Healthy("m") {
		t.Fatalf("cooling model admitted: %+v", a)
	}
	if s := h.Snapshot()[0]; !s.CoolingDown(c.now()) || s.CooldownKind != llm.KindRateLimited {
		t.Errorf("snapshot during the cooldown = %+v", s)
	}
	c.advance(11 * time.Second)
	if a := h.Admit("m"); !a.OK || !a.Probe {
		t.Fatalf("after the cooldown: %+v, want the probe", a)
	}
	if h.Available("m") || h.Admit("m").OK {
		t.Error("a second turn admitted during the probe")
	}
	h.Success("m", c.now())
	if !h.Healthy("m") || !h.Admit("m").OK {
		t.Error("a successful probe did not end the cooldown")
	}
	s := h.Snapshot()[0]
	if !s.CooldownUntil.IsZero() || s.Probing || s.CoolingDown(c.now()) || s.BudgetTokens != 10 || s.BudgetMax != 10 {
		t.Errorf("snapshot = %+v", s)
	}
}

// TestOlderSuccessKeepsCooldown: a turn admitted before a cooldown was set
// (here, or on another replica) whose call answers after it says nothing
// against it; a turn admitted after it (one whose every model cools down
// still makes its attempt) or the half-open probe ends it.
func TestOlderSuccessKeepsCooldown(t *testing.T) {
	c := newClock()
	h := budgetHealth(c)
	admittedBefore := c.now()
	c.advance(time.Second)
	h.Cooldown("m", llm.KindRateLimited, 30*time.Second)
	c.advance(time.Second)
	h.Success("m", admittedBefore)
	if h.Healthy("m") {
		t.Fatal("a success of a turn admitted before the cooldown ended it")
	}
	h.Success("m", c.now())
	if !h.Healthy("m") {
		t.Fatal("a success of a turn admitted during the cooldown did not end it")
	}
	h.Cooldown("m", llm.KindRateLimited, 10*time.Second)
	c.advance(11 * time.Second)
	if a := h.Admit("m"); !a.Probe {
		t.Fatalf("after the cooldown: %+v, want the probe", a)
	}
	h.Success("m", admittedBefore) // the probe's answer ends it, whenever admitted
	if !h.Healthy("m") {
		t.Error("the probe's success did not end the cooldown")
	}
}
