package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/natstest"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/store"
)

// replicas starts n servers on one NATS server, each with its own store
// connection and provider p(i), whose key k's limits they share every
// 20ms; a turn its client left ends after 100ms.
func replicas(t *testing.T, n int, k server.Key, p func(i int) llm.Provider) []*testServer {
	t.Helper()
	url := natstest.Start(t)
	var out []*testServer
	for i := range n {
		cfg := store.DefaultConfig()
		cfg.Mode, cfg.NATS.URL, cfg.LeaseTTL = store.ModeNATS, url, time.Second
		st, err := store.Open(context.Background(), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		ts := start(t, pricedRunner(t, p(i), fake.NewProvider()), server.Options{Store: st, Keys: []server.Key{k}, DetachGrace: 100 * time.Millisecond})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- ts.srv.ShareLimits(ctx, st, st.ReplicaID(), 20*time.Millisecond) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("ShareLimits: %v", err)
			}
		})
		out = append(out, ts)
	}
	return out
}

var turnSeq int

// turnOn runs a turn with a new id on ts as the key of token, and returns
// its status.
func turnOn(t *testing.T, ts *testServer, token string) *status.Status {
	t.Helper()
	turnSeq++
	req := hello()
	req.TurnId = fmt.Sprintf("shared-%d", turnSeq)
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
// over the replicas, spent the limit together, and then each replica
// refuses the key, having run at most one more turn (the share's lag)
// where, keeping the limit alone, each would run several; concurrent
// turns on one replica hold the key's turns back on the others.
func TestSharedLimits(t *testing.T) {
	if untilMidnight(time.Now()) < 10*time.Second {
		t.Skip("too near the day's reset")
	}
	six, one := 6, 1
	tokens := 6 * pricedUsage.Tokens() // each turn uses pricedUsage
	tests := []struct {
		name   string
		limits server.KeyLimits
		reason string
		limit  string
		turns  int // the turns that spend the limit, spread over the replicas
	}{
		// Each turn costs 0.01875: the eighth crosses 0.15.
		{name: "cost per day", limits: server.KeyLimits{CostPerDay: money("0.15")}, reason: "BUDGET_EXHAUSTED", limit: "cost_per_day", turns: 8},
		{name: "turns per minute", limits: server.KeyLimits{TurnsPerMinute: &six}, reason: "LIMIT_EXCEEDED", limit: "turns_per_minute", turns: 6},
		{name: "tokens per day", limits: server.KeyLimits{TokensPerDay: &tokens}, reason: "LIMIT_EXCEEDED", limit: "tokens_per_day", turns: 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := keyed("busy", "tok-busy-0123456")
			k.Limits = tt.limits
			rs := replicas(t, 3, k, func(int) llm.Provider { return fake.NewProvider(costReply(false)) })
			for i := range tt.turns {
				if st := turnOn(t, rs[i%3], "tok-busy-0123456"); st.Code() != codes.OK {
					t.Fatalf("turn %d on replica %d: %v", i+1, i%3, st)
				}
			}
			// Ten shares' time for what the last turns used to reach every
			// replica.
			time.Sleep(200 * time.Millisecond)
			for i, ts := range rs {
				extra := 0
				eventually(t, fmt.Sprintf("replica %d refuses the key", i), func() bool {
					st := turnOn(t, ts, "tok-busy-0123456")
					if st.Code() == codes.OK {
						extra++
						return false
					}
					if !refusedFor(st, tt.reason, tt.limit) {
						t.Fatalf("replica %d: %v %s", i, st.Code(), st.Message())
					}
					return true
				})
				if extra > 1 {
					t.Errorf("replica %d ran %d more turns of the key after the limit was spent", i, extra)
				}
			}
		})
	}
	t.Run("concurrent turns", func(t *testing.T) {
		k := keyed("busy", "tok-busy-0123456")
		k.Limits.ConcurrentTurns = &one
		rs := replicas(t, 3, k, func(i int) llm.Provider {
			if i == 0 {
				return hanging(t)
			}
			return fake.NewProvider(fake.Reply{Chunks: fake.Text("hi")})
		})
		release := holdTurn(t, rs[0].client, bearer(t.Context(), "tok-busy-0123456"))
		for i, ts := range rs[1:] {
			eventually(t, fmt.Sprintf("replica %d refuses the key", i+1), func() bool {
				return refusedFor(turnOn(t, ts, "tok-busy-0123456"), "LIMIT_EXCEEDED", "concurrent_turns")
			})
		}
		release()
		eventually(t, "replica 1 runs the key's turn once the other ended", func() bool {
			return turnOn(t, rs[1], "tok-busy-0123456").Code() == codes.OK
		})
	})
}
