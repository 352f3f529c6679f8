package server_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/natstest"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/store"
)

// TestFreshClusterStart starts three replicas and a new three-server NATS
// cluster at the same instant, as a new install's rollout does: each
// replica's store waits for the cluster (no server answers at first, then
// no meta leader, then too few servers known) instead of failing, all
// three come up with the log replicated three times, and each serves a
// durable turn that the others replay.
func TestFreshClusterStart(t *testing.T) {
	t.Parallel()
	urls, startNATS := natstest.ClusterLater(t, 3)
	cfg := store.DefaultConfig()
	cfg.Mode, cfg.NATS.URL, cfg.LeaseTTL = store.ModeNATS, strings.Join(urls, ","), time.Second
	var logs syncBuffer
	logger := newLogger(&logs)
	var (
		wg     sync.WaitGroup
		stores [3]*store.Store
		errs   [3]error
	)
	t0 := time.Now()
	for i := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stores[i], errs[i] = store.Open(t.Context(), cfg, logger)
		}()
	}
	startNATS()
	wg.Wait()
	for i, s := range stores {
		if errs[i] != nil {
			t.Fatalf("replica %d: %v", i, errs[i])
		}
		t.Cleanup(s.Close)
	}
	t.Logf("three replicas up %v after they and the cluster started", time.Since(t0))
	// Each wait says what it waits for.
	if waits := strings.Count(logs.String(), `msg="turn store: waiting for the NATS cluster" for=`); waits == 0 {
		t.Errorf("no wait for the cluster logged:\n%s", logs.String())
	}

	js := jetStream(t, cfg.NATS.URL)
	for _, name := range []string{store.StreamName, "KV_" + store.LeaseBucket, "KV_" + store.CooldownBucket, "KV_" + store.BudgetBucket} {
		s, err := js.Stream(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		if n := s.CachedInfo().Config.Replicas; n != 3 {
			t.Errorf("stream %s has %d replicas, want 3", name, n)
		}
	}

	var servers []*testServer
	for _, s := range stores {
		p := fake.NewProvider(fake.Reply{Chunks: fake.Text("up")})
		servers = append(servers, start(t, runner(t, p), server.Options{Store: s}))
	}
	const want = "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
	for i, srv := range servers {
		req := hello()
		req.TurnId = fmt.Sprintf("fresh-%d", i)
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		evs, st := wiretest.Collect(t, ctx, srv.client, req, nil)
		cancel()
		if st.Code() != codes.OK {
			t.Fatalf("replica %d: %v (events %s)", i, st, wiretest.Names(evs))
		}
		if got := wiretest.Names(evs); got != want {
			t.Errorf("replica %d: events:\n got %s\nwant %s", i, got, want)
		}
		other := servers[(i+1)%len(servers)]
		got, wst := watch(t, t.Context(), other.client, &turnstilev1.WatchTurnRequest{TurnId: req.TurnId})
		if wst.Code() != codes.OK {
			t.Errorf("replica %d's turn replayed elsewhere: %v", i, wst)
		}
		sameEvents(t, fmt.Sprintf("replica %d's turn replayed elsewhere", i), got, evs)
	}
}
