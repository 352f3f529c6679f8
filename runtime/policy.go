package runtime

import (
	"math"
	"time"
)

// RetryConfig tunes retries on one model. The zero value is not useful;
// start from [DefaultRetryConfig].
type RetryConfig struct {
	// MaxRetries is the number of retries after the first attempt, per
	// model and step, for failures worth retrying.
	MaxRetries int
	// InitialBackoff is the first backoff delay.
	InitialBackoff time.Duration
	// Multiplier grows the backoff from one retry to the next.
	Multiplier float64
	// MaxBackoff caps a backoff delay before jitter.
	MaxBackoff time.Duration
	// Jitter spreads each backoff delay uniformly by ± this fraction.
	Jitter float64
	// MaxRetryAfter is the longest provider-requested wait the turn honours.
	// A longer Retry-After is not waited for: the turn falls back, or fails
	// with a retryable error that carries the provider's delay.
	MaxRetryAfter time.Duration
	// Cooldown is how long a failing model is skipped by new turns when the
	// provider gave no Retry-After.
	Cooldown time.Duration
	// BudgetTokens sizes the retry budget shared by every turn on a model:
	// each failure spends one token, each success earns BudgetRatio, and
	// retries stop while the budget is at or below half of BudgetTokens.
	// Zero disables the budget.
	BudgetTokens float64
	// BudgetRatio is the tokens each success earns back.
	BudgetRatio float64
}

// DefaultRetryConfig returns the built-in retry settings: 2 retries, 500ms
// initial backoff doubling up to 16s with ±25% jitter, Retry-After honoured
// up to 60s, a 30s cooldown, and a budget of 10 tokens earning 0.1 per
// success.
func DefaultRetryConfig() RetryConfig {
	return RetryConfig{
		MaxRetries:     2,
		InitialBackoff: 500 * time.Millisecond,
		Multiplier:     2,
		MaxBackoff:     16 * time.Second,
		Jitter:         0.25,
		MaxRetryAfter:  60 * time.Second,
		Cooldown:       30 * time.Second,
		BudgetTokens:   10,
		BudgetRatio:    0.1,
	}
}

// Action is what the turn does after a failed attempt.
type Action uint8

// The actions a [Decision] may take.
const (
	// ActionFail ends the turn with the failure.
	ActionFail Action = iota
	// ActionRetry calls the same model again after Decision.Delay.
	ActionRetry
	// ActionFallback moves to the next model of the chain.
	ActionFallback
	// ActionCompact shortens the conversation and calls the same model again.
	ActionCompact
)

// String returns the action's lower-case name.
func (a Action) String() string {
	switch a {
	case ActionRetry:
		return "retry"
	case ActionFallback:
		return "fallback"
	case ActionCompact:
		return "compact"
	}
	return "fail"
}

// Attempt describes a failed model call and the state of its step, all the
// [Policy] needs to decide what comes next.
type Attempt struct {
	// Kind, Hint and RetryAfter come from the failure.
	Kind       Kind
	Hint       Hint
	RetryAfter time.Duration
	// Number counts attempts on this model in this step, from 1.
	Number int
	// HasFallback reports that a later model of the chain is available.
	HasFallback bool
	// HasLargerFallback reports that a later model has a larger context
	// window than this one.
	HasLargerFallback bool
	// Compacted reports that this step already compacted the conversation.
	Compacted bool
	// BudgetExhausted reports that the model's shared retry budget forbids
	// retries now.
	BudgetExhausted bool
	// Remaining is the time left before the turn's deadline; negative
	// means no deadline.
	Remaining time.Duration
	// Jitter is a uniform draw from [0, 1), taken by the caller.
	Jitter float64
}

// Decision is the [Policy]'s verdict on an [Attempt].
type Decision struct {
	Action Action
	// Delay is the wait before a retry.
	Delay time.Duration
	// Cooldown, when positive, is how long new turns should skip the model.
	Cooldown time.Duration
	// RetryAfter is the delay to advise the client when the turn fails with
	// a retryable error.
	RetryAfter time.Duration
}

// Policy decides, from the class of a failure and the state of the step,
// whether to retry, fall back, compact or fail. Decide is pure: no clock,
// no randomness, no I/O; the turn loop does the waiting.
type Policy struct {
	Retry RetryConfig
}

// Transient reports whether failures of kind k may succeed when the same
// request is sent again later, on this model or another.
func Transient(k Kind) bool {
	switch k {
	case KindRateLimited, KindOverloaded, KindServerError, KindTimeout,
		KindNetwork, KindStreamInterrupted, KindUnavailable:
		return true
	}
	return false
}

// Decide returns what to do after the failed attempt a.
func (p Policy) Decide(a Attempt) Decision {
	r := p.Retry
	fallbackOrFail := func(retryAfter time.Duration) Decision {
		if a.HasFallback {
			return Decision{Action: ActionFallback}
		}
		return Decision{Action: ActionFail, RetryAfter: retryAfter}
	}
	switch a.Kind {
	case KindCancelled, KindDeadlineExceeded, KindInternal, KindInvalidRequest,
		KindContentFiltered, KindToolsUnsafe:
		return Decision{Action: ActionFail}

	case KindQuotaExhausted, KindAuth, KindNotFound:
		// Waiting never helps: skip the model for a while and move on.
		d := fallbackOrFail(0)
		d.Cooldown = r.Cooldown
		return d

	case KindContextOverflow:
		switch {
		case a.HasLargerFallback:
			return Decision{Action: ActionFallback}
		case !a.Compacted:
			return Decision{Action: ActionCompact}
		}
		return Decision{Action: ActionFail}

	case KindRateLimited:
		wait := a.RetryAfter
		cooldown := wait
		if cooldown <= 0 {
			cooldown = r.Cooldown
		}
		if a.HasFallback {
			// Another model can answer now; let this one cool down.
			return Decision{Action: ActionFallback, Cooldown: cooldown}
		}
		if wait <= 0 {
			wait = p.backoff(a.Number, a.Jitter)
		}
		if wait > r.MaxRetryAfter || a.Number > r.MaxRetries || a.Hint == HintNever {
			return Decision{Action: ActionFail, RetryAfter: wait, Cooldown: cooldown}
		}
		if a.Remaining >= 0 && wait > a.Remaining {
			return Decision{Action: ActionFail, RetryAfter: wait}
		}
		return Decision{Action: ActionRetry, Delay: wait}
	}

	// Overloaded, server errors, timeouts, network failures, interrupted
	// streams and anything else transient: back off on the same model, then
	// move down the chain.
	retryAfter := a.RetryAfter
	if a.Number > r.MaxRetries || a.Hint == HintNever || a.BudgetExhausted {
		d := fallbackOrFail(max(retryAfter, r.InitialBackoff))
		if a.BudgetExhausted || a.Kind == KindOverloaded {
			d.Cooldown = max(retryAfter, r.Cooldown)
		}
		return d
	}
	var delay time.Duration
	switch {
	case a.Hint == HintImmediately:
		delay = 0
	case retryAfter > 0:
		if retryAfter > r.MaxRetryAfter {
			return fallbackOrFail(retryAfter)
		}
		delay = retryAfter
	default:
		delay = p.backoff(a.Number, a.Jitter)
	}
	if a.Remaining >= 0 && delay >= a.Remaining {
		// The wait would outlast the caller's deadline.
		return fallbackOrFail(delay)
	}
	return Decision{Action: ActionRetry, Delay: delay}
}

// backoff returns the jittered delay before retry number n (n >= 1):
// InitialBackoff × Multiplier^(n-1), capped at MaxBackoff, spread by
// ±Jitter using the draw u in [0, 1).
func (p Policy) backoff(n int, u float64) time.Duration {
	r := p.Retry
	d := float64(r.InitialBackoff) * math.Pow(max(r.Multiplier, 1), float64(max(n-1, 0)))
	d = min(d, float64(r.MaxBackoff))
	d *= 1 + r.Jitter*(2*u-1)
	return time.Duration(max(d, 0))
}
