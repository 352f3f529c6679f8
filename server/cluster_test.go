package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/natstest"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/store"
)

// clusterStoreR3 opens a store on the cluster, waiting until the cluster
// can place three replicas.
func clusterStoreR3(t *testing.T, urls []string) *store.Store {
	t.Helper()
	cfg := store.DefaultConfig()
	cfg.Mode, cfg.NATS.URL, cfg.LeaseTTL = store.ModeNATS, strings.Join(urls, ","), time.Second
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, err := store.Open(context.Background(), cfg, nil)
		if err == nil {
			t.Cleanup(s.Close)
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("store on the cluster: %v", err)
		}
		// The cluster elects its meta leader first.
		time.Sleep(100 * time.Millisecond)
	}
}

// TestThreeNodeCluster runs durable turns on a three-server JetStream
// cluster: the log is replicated three times (chosen automatically), a
// turn run on one replica is replayed on another, and with one server
// of the cluster gone turns still run and replay.
func TestThreeNodeCluster(t *testing.T) {
	servers, urls := natstest.Cluster(t, 3)
	sa := clusterStoreR3(t, urls[:1])
	sb := clusterStoreR3(t, urls[1:2])
	p := fake.NewProvider(fake.Reply{Chunks: fake.Text("replicated")})
	a := start(t, runner(t, p), server.Options{Store: sa})
	b := start(t, runner(t, p), server.Options{Store: sb})

	nc, err := nats.Connect(urls[0])
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{store.StreamName, "KV_" + store.LeaseBucket} {
		s, err := js.Stream(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		if info := s.CachedInfo(); info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			t.Fatalf("stream %s has %d replicas (%+v), want 3", name, info.Config.Replicas, info.Cluster)
		}
	}

	for i, id := range []string{"c-1", "c-2"} {
		if i == 1 {
			// One server of three goes away: the others keep a quorum.
			servers[2].Shutdown()
			servers[2].WaitForShutdown()
		}
		req := hello()
		req.TurnId = id
		// While the cluster elects new leaders the store is unavailable
		// for a moment: a client retries, and the same request attaches
		// to the run if it was created.
		evs, st := wiretest.Collect(t, t.Context(), a.client, req, nil)
		for deadline := time.Now().Add(20 * time.Second); st.Code() == codes.Unavailable && time.Now().Before(deadline); {
			time.Sleep(200 * time.Millisecond)
			evs, st = wiretest.Collect(t, t.Context(), a.client, req, nil)
		}
		if st.Code() != codes.OK {
			t.Fatalf("turn %s: %v", id, st)
		}
		got, wst := watch(t, t.Context(), b.client, &turnstilev1.WatchTurnRequest{TurnId: id})
		sameEvents(t, "replay on the other replica", got, evs)
		if wst.Code() != codes.OK {
			t.Errorf("replay status %v", wst)
		}
	}
}
