package admission

import (
	"testing"
	"time"
)

// TestKeyLimiterWaits checks the waits a refused key is told, on a fake
// clock: each is when the limit lets the next turn start.
func TestKeyLimiterWaits(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	three := 3
	var perMin int64 = 60
	k := newKeyLimiter("k", KeyLimits{TurnsPerMinute: &three, TokensPerMinute: &perMin}, clock)
	for i := range 3 {
		end, r := k.admit()
		if r != nil {
			t.Fatalf("turn %d refused: %s", i+1, r.Message)
		}
		end()
	}
	// Three turns per minute: one comes back every 20s.
	if _, r := k.admit(); r == nil || r.Limit != "turns_per_minute" || r.RetryAfter != 20*time.Second {
		t.Fatalf("fourth turn: %+v, want turns_per_minute in 20s", r)
	}
	now = now.Add(20 * time.Second)
	end, r := k.admit()
	if r != nil {
		t.Fatalf("after 20s: %s", r.Message)
	}
	end()
	// 60 tokens a minute, one a second: 90 used is 30 in debt, so the next
	// turn may start once one is back, in 31s.
	k.charge(90)
	if _, r := k.admit(); r == nil || r.Limit != "tokens_per_minute" || r.RetryAfter != 31*time.Second {
		t.Fatalf("after 90 tokens: %+v, want tokens_per_minute in 31s", r)
	}
	now = now.Add(31 * time.Second)
	if _, r := k.admit(); r != nil && r.Limit == "tokens_per_minute" {
		t.Errorf("after 31s still refused: %s", r.Message)
	}
}

// TestKeyLimiterChargesPastBurst: usage larger than a bucket is taken
// whole, in debt.
func TestKeyLimiterChargesPastBurst(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var perDay int64 = 1000
	k := newKeyLimiter("k", KeyLimits{TokensPerDay: &perDay}, func() time.Time { return now })
	k.charge(5000)
	_, r := k.admit()
	if r == nil || r.Limit != "tokens_per_day" {
		t.Fatalf("after 5000 of 1000 tokens: %+v", r)
	}
	// 4001 tokens to win back at 1000 a day: just over four days.
	if want := 4001 * 24 * time.Hour / 1000; r.RetryAfter < want || r.RetryAfter > want+time.Second {
		t.Errorf("retry in %s, want about %s", r.RetryAfter, want)
	}
}
