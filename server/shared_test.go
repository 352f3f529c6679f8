package server_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/store"
)

// sharingReplicas starts n servers on one NATS server, each with its own
// store connection and provider p(i), their limits on clock (time.Now
// when nil), which share key k's limits every interval; a turn its client
// left ends after 100ms. It returns them once each shares its limits,
// with the sharer each shares them through, which tells what reached it.
func sharingReplicas(t *testing.T, n int, k server.Key, p func(i int) llm.Provider, clock func() time.Time, interval time.Duration) ([]*testServer, []*sharer) {
	t.Helper()
	rs := startReplicas(t, n, func(i int) *runtime.Runner { return pricedRunner(t, p(i), fake.NewProvider()) }, func(int) server.Options {
		return server.Options{Keys: []server.Key{k}, DetachGrace: 100 * time.Millisecond, Clock: clock}
	})
	var sharers []*sharer
	for _, ts := range rs {
		sh := &sharer{Shared: ts.store.Shared(), applied: map[string]int64{}, changed: make(chan struct{}), watching: make(chan struct{})}
		sharers = append(sharers, sh)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- ts.srv.ShareLimits(ctx, sh, ts.store.ReplicaID(), interval) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("ShareLimits: %v", err)
			}
		})
	}
	// A turn admitted before its replica shares the key's limits is not
	// shared: the turns start once every replica does.
	for i, sh := range sharers {
		select {
		case <-sh.watching:
		case <-time.After(waitBound):
			t.Fatalf("replica %d does not share its limits", i)
		}
	}
	return rs, sharers
}

// sharer is the LimitSharer of one replica, its store's Shared, which
// records each shared counter as the replica's limits have applied it:
// once they have, the replica knows the counter's total (another
// replica's use) or, for a replica's count of its running turns, its
// value.
type sharer struct {
	*store.Shared
	mu      sync.Mutex
	applied map[string]int64 // the last total applied, by counter
	changed chan struct{}    // closed, and replaced, at each
	// watching is closed once the replica watches the counters, which it
	// does once it shares every key's limits.
	watching chan struct{}
	once     sync.Once
}

// WatchCounters watches as the store does, recording each counter once
// fn, the replica's limits, has taken it.
func (s *sharer) WatchCounters(ctx context.Context, fn func(name, window string, total int64, at time.Time, revision uint64)) error {
	s.once.Do(func() { close(s.watching) })
	return s.Shared.WatchCounters(ctx, func(name, window string, total int64, at time.Time, revision uint64) {
		fn(name, window, total, at, revision)
		s.mu.Lock()
		defer s.mu.Unlock()
		s.applied[name] = total
		close(s.changed)
		s.changed = make(chan struct{})
	})
}

// await waits until what the replica's limits applied satisfies cond,
// woken by each counter they apply.
func (s *sharer) await(t *testing.T, what string, cond func(applied map[string]int64) bool) {
	t.Helper()
	timeout := time.NewTimer(waitBound)
	defer timeout.Stop()
	for {
		s.mu.Lock()
		ok, changed := cond(s.applied), s.changed
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-timeout.C:
			s.mu.Lock()
			defer s.mu.Unlock()
			t.Fatalf("not within %s: %s; the counters applied: %v", waitBound, what, s.applied)
		}
	}
}

var turnSeq atomic.Int64

// turnOn runs a turn with a new id on ts as the key of token, and returns
// its status.
func turnOn(t *testing.T, ts *testServer, token string) *status.Status {
	t.Helper()
	req := hello()
	req.TurnId = fmt.Sprintf("shared-%d", turnSeq.Add(1))
	_, st := wiretest.Collect(t, bearer(t.Context(), token), ts.client, req, nil)
	return st
}

// refusedFor reports whether st refuses a turn by reason and limit.
func refusedFor(st *status.Status, reason, limit string) bool {
	if st.Code() != codes.ResourceExhausted || reasonOf(st) != reason {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(interface{ GetMetadata() map[string]string }); ok && info.GetMetadata()["limit"] == limit {
			return true
		}
	}
	return false
}

// TestSharedLimits: a key's budget, turns per minute and tokens per day
// hold across three replicas on one NATS: the turns the key ran, spread
// over the replicas, spent the limit together (no replica alone ran
// enough to), and each replica refuses the key at once when what the
// others used has reached it, where keeping the limit alone each would
// run several more; concurrent turns on one replica hold the key's turns
// back on the others once they know of them, and let them go once they
// know those ended. The limits' clock stands still at noon UTC: no bucket
// refills and no day ends while the test runs.
func TestSharedLimits(t *testing.T) {
	t.Parallel()
	six, one := 6, 1
	tokens := 6 * pricedUsage.Tokens() // each turn uses pricedUsage
	// A turn's call holds its prompt alone: these count what the turns
	// used (TestHoldsAcrossReplicas counts what they hold).
	var zero int64
	tests := []struct {
		name   string
		limits server.KeyLimits
		reason string
		limit  string
		turns  int   // the turns that spend the limit, spread over the replicas
		used   int64 // what they use together, in the limit's unit
	}{
		// Each turn costs 0.01875: the eighth crosses 0.15.
		{name: "cost per day", limits: server.KeyLimits{CostPerDay: money("0.15"), ReserveOutputTokens: &zero}, reason: "BUDGET_EXHAUSTED", limit: "cost_per_day", turns: 8, used: 8 * 18_750_000},
		{name: "turns per minute", limits: server.KeyLimits{TurnsPerMinute: &six}, reason: "LIMIT_EXCEEDED", limit: "turns_per_minute", turns: 6, used: 6},
		{name: "tokens per day", limits: server.KeyLimits{TokensPerDay: &tokens, ReserveOutputTokens: &zero}, reason: "LIMIT_EXCEEDED", limit: "tokens_per_day", turns: 6, used: tokens},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			k := keyed("busy", "tok-busy-0123456")
			k.Limits = tt.limits
			rs, sharers := sharingReplicas(t, 3, k, func(int) llm.Provider { return fake.NewProvider(costReply(false)) }, atNoon, 20*time.Millisecond)
			for i := range tt.turns {
				if st := turnOn(t, rs[i%3], "tok-busy-0123456"); st.Code() != codes.OK {
					t.Fatalf("turn %d on replica %d: %v", i+1, i%3, st)
				}
			}
			// The key's one shared counter of this limit holds what every
			// replica used once each has shared it; each replica refuses
			// once its limits have applied that total.
			for i, sh := range sharers {
				sh.await(t, fmt.Sprintf("replica %d applies the key's use, %d", i, tt.used), func(applied map[string]int64) bool {
					for _, total := range applied {
						if total >= tt.used {
							return true
						}
					}
					return false
				})
			}
			for i, ts := range rs {
				if st := turnOn(t, ts, "tok-busy-0123456"); !refusedFor(st, tt.reason, tt.limit) {
					t.Errorf("replica %d, knowing what the key used: %v %s; want %s %s", i, st.Code(), st.Message(), tt.reason, tt.limit)
				}
			}
		})
	}
	t.Run("concurrent turns", func(t *testing.T) {
		t.Parallel()
		k := keyed("busy", "tok-busy-0123456")
		k.Limits.ConcurrentTurns = &one
		rs, sharers := sharingReplicas(t, 3, k, func(i int) llm.Provider {
			if i == 0 {
				return hanging(t)
			}
			return fake.NewProvider(fake.Reply{Chunks: fake.Text("hi")})
		}, nil, 20*time.Millisecond)
		// running reports whether the replica knows of count turns of the
		// key running on the others: the key's only shared counters are
		// the replicas' counts of its running turns.
		running := func(count int64) func(map[string]int64) bool {
			return func(applied map[string]int64) bool {
				n := int64(0)
				for _, v := range applied {
					n += v
				}
				return len(applied) > 0 && n == count
			}
		}
		release := holdTurn(t, rs[0].client, bearer(t.Context(), "tok-busy-0123456"))
		for i, ts := range rs[1:] {
			sharers[i+1].await(t, fmt.Sprintf("replica %d knows of the turn on replica 0", i+1), running(1))
			if st := turnOn(t, ts, "tok-busy-0123456"); !refusedFor(st, "LIMIT_EXCEEDED", "concurrent_turns") {
				t.Errorf("replica %d: %v %s; want LIMIT_EXCEEDED concurrent_turns", i+1, st.Code(), st.Message())
			}
		}
		release()
		sharers[1].await(t, "replica 1 knows the turn on replica 0 ended", running(0))
		if st := turnOn(t, rs[1], "tok-busy-0123456"); st.Code() != codes.OK {
			t.Errorf("replica 1, once the other turn ended: %v", st)
		}
	})
}
