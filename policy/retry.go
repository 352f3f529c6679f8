package policy

import (
	"fmt"
	"math"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// Retry tunes retries on one model. Every field means what it says,
// zero included: MaxRetries 0 is no retry, Jitter 0 no jitter,
// BudgetTokens 0 no budget. [DefaultRetry] gives the built-in values. The
// yaml names are the configuration file's keys.
type Retry struct {
	// MaxRetries is the number of retries after the first attempt, per
	// model and step, for failures worth retrying.
	MaxRetries int `yaml:"max_retries"`
	// InitialBackoff is the first backoff delay.
	InitialBackoff time.Duration `yaml:"initial_backoff"`
	// Multiplier grows the backoff from one retry to the next; at least 1.
	Multiplier float64 `yaml:"multiplier"`
	// MaxBackoff caps a backoff delay before jitter.
	MaxBackoff time.Duration `yaml:"max_backoff"`
	// Jitter spreads each backoff delay uniformly by ± this fraction, from
	// 0 (none) to 1.
	Jitter float64 `yaml:"jitter"`
	// MaxRetryAfter is the longest provider-requested wait the turn honours.
	// A longer Retry-After is not waited for: the turn falls back, or fails
	// with a retryable error that carries the provider's delay.
	MaxRetryAfter time.Duration `yaml:"max_retry_after"`
	// Cooldown is how long a failing model is skipped by new turns when the
	// provider gave no Retry-After.
	Cooldown time.Duration `yaml:"cooldown"`
	// BudgetTokens sizes the retry budget shared by every turn on a model
	// (see [Health]): a retry takes a token until the model answers it, a
	// retry that works earns it back and one more, one that fails spends
	// it, and retries stop while less than one token is left. Zero
	// disables the budget: only MaxRetries bounds retries.
	BudgetTokens float64 `yaml:"budget_tokens"`
	// BudgetRefill is how many spent tokens come back per second, so an
	// idle model recovers; once spent, the budget is probed (see [Health])
	// each time a token comes back. Positive when the budget is on.
	BudgetRefill float64 `yaml:"budget_refill"`
	// OutputRetries is how many times per step a reply that does not match
	// the request's output schema is asked for again, the model shown its
	// validation errors; 0 fails the turn with OUTPUT_INVALID at the first.
	OutputRetries int `yaml:"output_retries"`
}

// maxOutputRetries bounds Retry.OutputRetries: each costs a whole reply.
const maxOutputRetries = 10

// DefaultRetry returns the built-in retry settings: 2 retries, 500ms
// initial backoff doubling up to 16s with ±25% jitter, Retry-After honoured
// up to 60s, a 30s cooldown, a retry budget of 20 tokens refilling at
// two per second, and 2 output retries.
func DefaultRetry() Retry {
	return Retry{
		MaxRetries:     2,
		InitialBackoff: 500 * time.Millisecond,
		Multiplier:     2,
		MaxBackoff:     16 * time.Second,
		Jitter:         0.25,
		MaxRetryAfter:  60 * time.Second,
		Cooldown:       30 * time.Second,
		BudgetTokens:   20,
		BudgetRefill:   2,
		OutputRetries:  2,
	}
}

// Problems lists every setting of r that is out of range, in field order;
// none when r is valid.
func (r Retry) Problems() []llm.Problem {
	var out []llm.Problem
	bad := func(field, format string, args ...any) {
		out = append(out, llm.Problem{Field: field, Message: fmt.Sprintf(format, args...)})
	}
	if r.MaxRetries < 0 {
		bad("max_retries", "must not be negative (0 means no retries)")
	}
	if r.OutputRetries < 0 || r.OutputRetries > maxOutputRetries {
		bad("output_retries", "must be from 0 to %d", maxOutputRetries)
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"initial_backoff", r.InitialBackoff}, {"max_backoff", r.MaxBackoff},
		{"max_retry_after", r.MaxRetryAfter}, {"cooldown", r.Cooldown},
	} {
		if d.v < 0 {
			bad(d.field, "must not be negative")
		}
	}
	if !(r.Multiplier >= 1) || math.IsInf(r.Multiplier, 0) {
		bad("multiplier", "must be a finite number of at least 1")
	}
	if !(r.Jitter >= 0 && r.Jitter <= 1) {
		bad("jitter", "must be between 0 and 1")
	}
	if !(r.BudgetTokens >= 0) || math.IsInf(r.BudgetTokens, 0) {
		bad("budget_tokens", "must be a finite number of at least 0 (0 means no budget)")
	}
	switch {
	case !(r.BudgetRefill >= 0) || math.IsInf(r.BudgetRefill, 0):
		bad("budget_refill", "must be a finite number of at least 0")
	case r.BudgetRefill == 0 && r.BudgetTokens > 0:
		bad("budget_refill", "must be positive while budget_tokens is set: a budget that never refills stops retries for good (budget_tokens: 0 turns the budget off)")
	}
	return out
}

// backoff returns the jittered delay before retry number n (n >= 1):
// InitialBackoff × Multiplier^(n-1), capped at MaxBackoff, spread by
// ±Jitter using the draw u in [0, 1).
func (r Retry) backoff(n int, u float64) time.Duration {
	d := float64(r.InitialBackoff) * math.Pow(max(r.Multiplier, 1), float64(max(n-1, 0)))
	d = min(d, float64(r.MaxBackoff))
	d *= 1 + r.Jitter*(2*u-1)
	return time.Duration(max(d, 0))
}
