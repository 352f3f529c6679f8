package policy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
)

func TestDecide(t *testing.T) {
	p := policy.Policy{Retry: policy.DefaultRetry()}
	const noDeadline = -1
	tests := []struct {
		name string
		a    policy.Attempt
		want policy.Decision
	}{
		{"overloaded first attempt backs off", policy.Attempt{Kind: llm.KindOverloaded, Number: 1, Remaining: noDeadline, Jitter: 0.5},
			policy.Decision{Action: policy.ActionRetry, Delay: 500 * time.Millisecond}},
		{"server error second attempt doubles", policy.Attempt{Kind: llm.KindServerError, Number: 2, Remaining: noDeadline, Jitter: 0.5},
			policy.Decision{Action: policy.ActionRetry, Delay: time.Second}},
		{"retries exhausted with fallback", policy.Attempt{Kind: llm.KindNetwork, Number: 3, HasFallback: true, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFallback}},
		{"retries exhausted without fallback", policy.Attempt{Kind: llm.KindTimeout, Number: 3, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFail, RetryAfter: 500 * time.Millisecond}},
		{"overload exhausted cools the model", policy.Attempt{Kind: llm.KindOverloaded, Number: 3, HasFallback: true, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFallback, Cooldown: 30 * time.Second}},
		{"budget exhausted fails over at once", policy.Attempt{Kind: llm.KindServerError, Number: 1, HasFallback: true, BudgetExhausted: true, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFallback, Cooldown: 30 * time.Second}},
		{"x-should-retry false", policy.Attempt{Kind: llm.KindServerError, Hint: llm.HintNever, Number: 1, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFail, RetryAfter: 500 * time.Millisecond}},
		{"retry immediately", policy.Attempt{Kind: llm.KindServerError, Hint: llm.HintImmediately, Number: 1, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionRetry}},
		{"server retry-after honoured", policy.Attempt{Kind: llm.KindOverloaded, RetryAfter: 3 * time.Second, Number: 1, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionRetry, Delay: 3 * time.Second}},
		{"backoff outlasts deadline", policy.Attempt{Kind: llm.KindOverloaded, Number: 1, Remaining: 100 * time.Millisecond, Jitter: 0.5},
			policy.Decision{Action: policy.ActionFail, RetryAfter: 500 * time.Millisecond}},
		{"backoff outlasts deadline, fallback", policy.Attempt{Kind: llm.KindOverloaded, Number: 1, HasFallback: true, Remaining: 100 * time.Millisecond, Jitter: 0.5},
			policy.Decision{Action: policy.ActionFallback}},
		{"rate limited, fallback available", policy.Attempt{Kind: llm.KindRateLimited, RetryAfter: 7 * time.Second, Number: 1, HasFallback: true, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFallback, Cooldown: 7 * time.Second}},
		{"rate limited, alone, waits", policy.Attempt{Kind: llm.KindRateLimited, RetryAfter: 7 * time.Second, Number: 1, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionRetry, Delay: 7 * time.Second}},
		{"rate limited, wait above cap", policy.Attempt{Kind: llm.KindRateLimited, RetryAfter: 90 * time.Second, Number: 1, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFail, RetryAfter: 90 * time.Second, Cooldown: 90 * time.Second}},
		{"rate limited without hint backs off", policy.Attempt{Kind: llm.KindRateLimited, Number: 1, Remaining: noDeadline, Jitter: 0.5},
			policy.Decision{Action: policy.ActionRetry, Delay: 500 * time.Millisecond}},
		{"rate limited past deadline", policy.Attempt{Kind: llm.KindRateLimited, RetryAfter: 5 * time.Second, Number: 1, Remaining: time.Second},
			policy.Decision{Action: policy.ActionFail, RetryAfter: 5 * time.Second}},
		{"quota moves on and cools", policy.Attempt{Kind: llm.KindQuotaExhausted, Number: 1, HasFallback: true, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFallback, Cooldown: 30 * time.Second}},
		{"auth alone fails", policy.Attempt{Kind: llm.KindAuth, Number: 1, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFail, Cooldown: 30 * time.Second}},
		{"not found moves on", policy.Attempt{Kind: llm.KindNotFound, Number: 1, HasFallback: true, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFallback, Cooldown: 30 * time.Second}},
		{"invalid output is corrected at once", policy.Attempt{Kind: llm.KindOutputInvalid, Number: 3, HasFallback: true, Remaining: noDeadline, Jitter: 0.5},
			policy.Decision{Action: policy.ActionRetry}},
		{"invalid output after its corrections fails, no fallback", policy.Attempt{Kind: llm.KindOutputInvalid, Number: 3, Corrections: 2, HasFallback: true, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFail}},
		{"invalid output out of calls fails", policy.Attempt{Kind: llm.KindOutputInvalid, Number: 1, OutOfCalls: true, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFail}},
		{"overflow compacts first", policy.Attempt{Kind: llm.KindContextOverflow, Number: 1, HasFallback: true, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionCompact}},
		{"overflow prefers a larger model", policy.Attempt{Kind: llm.KindContextOverflow, Number: 1, HasFallback: true, HasLargerFallback: true, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFallback}},
		{"overflow after compaction fails", policy.Attempt{Kind: llm.KindContextOverflow, Number: 2, Compacted: true, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFail}},
		{"invalid request fails", policy.Attempt{Kind: llm.KindInvalidRequest, Number: 1, HasFallback: true, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFail}},
		{"content filtered fails", policy.Attempt{Kind: llm.KindContentFiltered, Number: 1, HasFallback: true, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFail}},
		{"cancelled never retried", policy.Attempt{Kind: llm.KindCancelled, Number: 1, HasFallback: true, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFail}},
		{"out of calls: no retry", policy.Attempt{Kind: llm.KindServerError, Number: 1, OutOfCalls: true, Remaining: noDeadline, Jitter: 0.5},
			policy.Decision{Action: policy.ActionFail, RetryAfter: 500 * time.Millisecond}},
		{"out of calls: no fallback, cooldown kept", policy.Attempt{Kind: llm.KindQuotaExhausted, Number: 1, HasFallback: true, OutOfCalls: true, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFail, Cooldown: 30 * time.Second}},
		{"out of calls: no compaction", policy.Attempt{Kind: llm.KindContextOverflow, Number: 1, OutOfCalls: true, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFail}},
		{"unknown class fails", policy.Attempt{Kind: llm.Kind(200), Number: 1, HasFallback: true, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFail}},
		{"unclassified never retried", policy.Attempt{Kind: llm.KindInternal, Number: 1, HasFallback: true, Remaining: noDeadline},
			policy.Decision{Action: policy.ActionFail}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := p.Decide(tt.a); got != tt.want {
				t.Errorf("Decide(%+v) = %+v, want %+v", tt.a, got, tt.want)
			}
		})
	}
}

func TestBackoffJitterBounds(t *testing.T) {
	p := policy.Policy{Retry: policy.DefaultRetry()}
	for n := 1; n <= 8; n++ {
		base := min(500*time.Millisecond<<(n-1), 16*time.Second)
		lo, hi := time.Duration(float64(base)*0.75), time.Duration(float64(base)*1.25)
		for _, u := range []float64{0, 0.1, 0.5, 0.9, 0.999999} {
			d := p.Decide(policy.Attempt{Kind: llm.KindServerError, Number: 1, Remaining: -1, Jitter: u})
			if n == 1 && (d.Delay < lo || d.Delay > hi) {
				t.Errorf("attempt 1, jitter %v: delay %v outside [%v, %v]", u, d.Delay, lo, hi)
			}
		}
		// Larger attempt numbers through a config that allows them.
		cfg := policy.DefaultRetry()
		cfg.MaxRetries = 10
		q := policy.Policy{Retry: cfg}
		for _, u := range []float64{0, 0.5, 0.999999} {
			d := q.Decide(policy.Attempt{Kind: llm.KindOverloaded, Number: n, Remaining: -1, Jitter: u})
			if d.Action != policy.ActionRetry || d.Delay < lo || d.Delay > hi {
				t.Errorf("attempt %d, jitter %v: %+v outside [%v, %v]", n, u, d, lo, hi)
			}
		}
	}
}

// TestZeroMeansNone holds the settings whose zero value turns a feature
// off to their word: max_retries 0 never retries, jitter 0 waits exactly
// the backoff, budget_tokens 0 never exhausts.
func TestZeroMeansNone(t *testing.T) {
	r := policy.DefaultRetry()
	r.MaxRetries, r.Jitter, r.BudgetTokens = 0, 0, 0
	p := policy.Policy{Retry: r}
	if d := p.Decide(policy.Attempt{Kind: llm.KindOverloaded, Number: 1, Remaining: -1}); d.Action != policy.ActionFail {
		t.Errorf("max_retries 0: %+v, want fail", d)
	}
	r.MaxRetries = 5
	p = policy.Policy{Retry: r}
	for _, u := range []float64{0, 0.3, 0.999} {
		if d := p.Decide(policy.Attempt{Kind: llm.KindOverloaded, Number: 2, Remaining: -1, Jitter: u}); d.Delay != time.Second {
			t.Errorf("jitter 0, draw %v: delay %v, want exactly 1s", u, d.Delay)
		}
	}
	h := policy.NewHealth(map[string]policy.Retry{"m": r}, nil)
	for range 100 {
		ticket, ok := h.Reserve("m")
		if !ok {
			t.Fatal("budget_tokens 0: the budget ran out")
		}
		ticket.Settle(false)
	}
}

func TestRetryProblems(t *testing.T) {
	r := policy.Retry{MaxRetries: -1, InitialBackoff: -1, Multiplier: 0.5, Jitter: 1.5, BudgetTokens: -1, BudgetRefill: -0.1}
	var got []string
	for _, p := range r.Problems() {
		got = append(got, p.Field)
	}
	want := "max_retries initial_backoff multiplier jitter budget_tokens budget_refill"
	if strings.Join(got, " ") != want {
		t.Errorf("Problems fields = %v, want %s", got, want)
	}
	if p := policy.DefaultRetry().Problems(); len(p) != 0 {
		t.Errorf("the defaults have problems: %v", p)
	}
}
