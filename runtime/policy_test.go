package runtime_test

import (
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/runtime"
)

func TestDecide(t *testing.T) {
	p := runtime.Policy{Retry: runtime.DefaultRetryConfig()}
	const noDeadline = -1
	tests := []struct {
		name string
		a    runtime.Attempt
		want runtime.Decision
	}{
		{"overloaded first attempt backs off", runtime.Attempt{Kind: runtime.KindOverloaded, Number: 1, Remaining: noDeadline, Jitter: 0.5},
			runtime.Decision{Action: runtime.ActionRetry, Delay: 500 * time.Millisecond}},
		{"server error second attempt doubles", runtime.Attempt{Kind: runtime.KindServerError, Number: 2, Remaining: noDeadline, Jitter: 0.5},
			runtime.Decision{Action: runtime.ActionRetry, Delay: time.Second}},
		{"retries exhausted with fallback", runtime.Attempt{Kind: runtime.KindNetwork, Number: 3, HasFallback: true, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionFallback}},
		{"retries exhausted without fallback", runtime.Attempt{Kind: runtime.KindTimeout, Number: 3, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionFail, RetryAfter: 500 * time.Millisecond}},
		{"overload exhausted cools the model", runtime.Attempt{Kind: runtime.KindOverloaded, Number: 3, HasFallback: true, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionFallback, Cooldown: 30 * time.Second}},
		{"budget exhausted fails over at once", runtime.Attempt{Kind: runtime.KindServerError, Number: 1, HasFallback: true, BudgetExhausted: true, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionFallback, Cooldown: 30 * time.Second}},
		{"x-should-retry false", runtime.Attempt{Kind: runtime.KindServerError, Hint: runtime.HintNever, Number: 1, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionFail, RetryAfter: 500 * time.Millisecond}},
		{"retry immediately", runtime.Attempt{Kind: runtime.KindServerError, Hint: runtime.HintImmediately, Number: 1, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionRetry}},
		{"server retry-after honoured", runtime.Attempt{Kind: runtime.KindOverloaded, RetryAfter: 3 * time.Second, Number: 1, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionRetry, Delay: 3 * time.Second}},
		{"backoff outlasts deadline", runtime.Attempt{Kind: runtime.KindOverloaded, Number: 1, Remaining: 100 * time.Millisecond, Jitter: 0.5},
			runtime.Decision{Action: runtime.ActionFail, RetryAfter: 500 * time.Millisecond}},
		{"backoff outlasts deadline, fallback", runtime.Attempt{Kind: runtime.KindOverloaded, Number: 1, HasFallback: true, Remaining: 100 * time.Millisecond, Jitter: 0.5},
			runtime.Decision{Action: runtime.ActionFallback}},
		{"rate limited, fallback available", runtime.Attempt{Kind: runtime.KindRateLimited, RetryAfter: 7 * time.Second, Number: 1, HasFallback: true, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionFallback, Cooldown: 7 * time.Second}},
		{"rate limited, alone, waits", runtime.Attempt{Kind: runtime.KindRateLimited, RetryAfter: 7 * time.Second, Number: 1, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionRetry, Delay: 7 * time.Second}},
		{"rate limited, wait above cap", runtime.Attempt{Kind: runtime.KindRateLimited, RetryAfter: 90 * time.Second, Number: 1, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionFail, RetryAfter: 90 * time.Second, Cooldown: 90 * time.Second}},
		{"rate limited without hint backs off", runtime.Attempt{Kind: runtime.KindRateLimited, Number: 1, Remaining: noDeadline, Jitter: 0.5},
			runtime.Decision{Action: runtime.ActionRetry, Delay: 500 * time.Millisecond}},
		{"rate limited past deadline", runtime.Attempt{Kind: runtime.KindRateLimited, RetryAfter: 5 * time.Second, Number: 1, Remaining: time.Second},
			runtime.Decision{Action: runtime.ActionFail, RetryAfter: 5 * time.Second}},
		{"quota moves on and cools", runtime.Attempt{Kind: runtime.KindQuotaExhausted, Number: 1, HasFallback: true, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionFallback, Cooldown: 30 * time.Second}},
		{"auth alone fails", runtime.Attempt{Kind: runtime.KindAuth, Number: 1, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionFail, Cooldown: 30 * time.Second}},
		{"not found moves on", runtime.Attempt{Kind: runtime.KindNotFound, Number: 1, HasFallback: true, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionFallback, Cooldown: 30 * time.Second}},
		{"overflow compacts first", runtime.Attempt{Kind: runtime.KindContextOverflow, Number: 1, HasFallback: true, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionCompact}},
		{"overflow prefers a larger model", runtime.Attempt{Kind: runtime.KindContextOverflow, Number: 1, HasFallback: true, HasLargerFallback: true, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionFallback}},
		{"overflow after compaction fails", runtime.Attempt{Kind: runtime.KindContextOverflow, Number: 2, Compacted: true, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionFail}},
		{"invalid request fails", runtime.Attempt{Kind: runtime.KindInvalidRequest, Number: 1, HasFallback: true, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionFail}},
		{"content filtered fails", runtime.Attempt{Kind: runtime.KindContentFiltered, Number: 1, HasFallback: true, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionFail}},
		{"cancelled never retried", runtime.Attempt{Kind: runtime.KindCancelled, Number: 1, HasFallback: true, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionFail}},
		{"unclassified never retried", runtime.Attempt{Kind: runtime.KindInternal, Number: 1, HasFallback: true, Remaining: noDeadline},
			runtime.Decision{Action: runtime.ActionFail}},
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
	p := runtime.Policy{Retry: runtime.DefaultRetryConfig()}
	for n := 1; n <= 8; n++ {
		base := min(500*time.Millisecond<<(n-1), 16*time.Second)
		lo, hi := time.Duration(float64(base)*0.75), time.Duration(float64(base)*1.25)
		for _, u := range []float64{0, 0.1, 0.5, 0.9, 0.999999} {
			d := p.Decide(runtime.Attempt{Kind: runtime.KindServerError, Number: 1, Remaining: -1, Jitter: u})
			if n == 1 && (d.Delay < lo || d.Delay > hi) {
				t.Errorf("attempt 1, jitter %v: delay %v outside [%v, %v]", u, d.Delay, lo, hi)
			}
		}
		// Larger attempt numbers through a config that allows them.
		cfg := runtime.DefaultRetryConfig()
		cfg.MaxRetries = 10
		q := runtime.Policy{Retry: cfg}
		for _, u := range []float64{0, 0.5, 0.999999} {
			d := q.Decide(runtime.Attempt{Kind: runtime.KindOverloaded, Number: n, Remaining: -1, Jitter: u})
			if d.Action != runtime.ActionRetry || d.Delay < lo || d.Delay > hi {
				t.Errorf("attempt %d, jitter %v: %+v outside [%v, %v]", n, u, d, lo, hi)
			}
		}
	}
}
