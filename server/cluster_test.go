package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/natstest"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/store"
)

// clusterStoreR3 opens a store on the cluster, which waits until the
// cluster can place three replicas.
func clusterStoreR3(t *testing.T, urls []string) *store.Store {
	t.Helper()
	return openStore(t, onNATS(strings.Join(urls, ",")))
}

// TestThreeNodeCluster runs durable turns on a three-server JetStream
// cluster: the log is replicated three times (chosen automatically) and a
// turn run on one replica is replayed on another. Then the server leading
// the log's stream is shut down while a turn runs (one of its tools is
// running), and the turn goes on: its later events are stored once the
// cluster has elected a new leader, and the client, re-attaching as the
// Go client does if its stream breaks with UNAVAILABLE, gets every event
// once, in order, ending OK; the log, replayed on another replica, is
// gap-free and equal to what the client was sent. A turn started with one
// server of three gone runs and replays too.
func TestThreeNodeCluster(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	servers, urls := natstest.Cluster(t, 3)
	all := strings.Join(urls, ",")
	sa, sb := clusterStoreR3(t, []string{all}), clusterStoreR3(t, []string{all})
	t.Logf("cluster and stores in %v", time.Since(t0))
	started, release := make(chan struct{}), make(chan struct{})
	tool := fake.NewTool("wait", func(ctx context.Context, _ llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
		close(started)
		select {
		case <-release:
		case <-ctx.Done():
			return llm.ToolOutput{}, ctx.Err()
		}
		return llm.ToolOutput{Content: "waited"}, nil
	})
	p := fake.NewProvider(fake.Reply{Chunks: fake.Text("replicated")}, fake.Reply{Chunks: fake.Call("c1", "wait", `{}`)}, fake.Reply{Chunks: fake.Text("after the failover")})
	a := start(t, runner(t, p, tool), server.Options{Store: sa})
	b := start(t, runner(t, p, tool), server.Options{Store: sb})

	js := jetStream(t, all)
	for _, name := range []string{store.StreamName, "KV_" + store.LeaseBucket, "KV_" + store.CooldownBucket, "KV_" + store.BudgetBucket} {
		s, err := js.Stream(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		if info := s.CachedInfo(); info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			t.Fatalf("stream %s has %d replicas (%+v), want 3", name, info.Config.Replicas, info.Cluster)
		}
	}
	leader := func() string {
		s, err := js.Stream(t.Context(), store.StreamName)
		if err != nil {
			return ""
		}
		if c := s.CachedInfo().Cluster; c != nil {
			return c.Leader
		}
		return ""
	}
	// runTurn runs req on a to its end, re-attaching on UNAVAILABLE (to
	// a, then b, alternately) for up to 15s, as a client does.
	type result struct {
		evs        []*turnstilev1.AgentEvent
		st         *status.Status
		reattached int
	}
	runTurn := func(req *turnstilev1.RunTurnRequest) result {
		var r result
		r.evs, r.st = wiretest.Collect(t, t.Context(), a.client, req, nil)
		for deadline := time.Now().Add(15 * time.Second); r.st.Code() == codes.Unavailable && time.Now().Before(deadline); {
			r.reattached++
			if len(r.evs) == 0 {
				// The run may not exist: the same request again attaches
				// to it if it does.
				r.evs, r.st = wiretest.Collect(t, t.Context(), a.client, req, nil)
				continue
			}
			c := []*testServer{a, b}[r.reattached%2]
			more, st := wiretest.Watch(t, t.Context(), c.client, &turnstilev1.WatchTurnRequest{TurnId: req.GetTurnId(), AfterSeq: uint64(len(r.evs))})
			r.evs, r.st = append(r.evs, more...), st
		}
		return r
	}
	check := func(what string, r result, want string) {
		t.Helper()
		if r.st.Code() != codes.OK {
			t.Fatalf("%s: %v (events %s)", what, r.st, wiretest.Names(r.evs))
		}
		if got := wiretest.Names(r.evs); got != want {
			t.Errorf("%s: events:\n got %s\nwant %s", what, got, want)
		}
		for i, ev := range r.evs {
			if ev.GetSeq() != uint64(i+1) {
				t.Fatalf("%s: event %d has seq %d", what, i+1, ev.GetSeq())
			}
		}
		got, wst := watch(t, t.Context(), b.client, &turnstilev1.WatchTurnRequest{TurnId: r.evs[0].GetTurnId()})
		sameEvents(t, what+": the log replayed on the other replica", got, r.evs)
		if wst.Code() != codes.OK {
			t.Errorf("%s: replay status %v", what, wst)
		}
	}
	plain := "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"

	req := hello()
	req.TurnId = "c-1"
	check("a turn", runTurn(req), plain)

	// The stream's leader goes away while the turn's tool runs.
	done := make(chan result, 1)
	go func() {
		req := hello()
		req.TurnId = "c-2"
		done <- runTurn(req)
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the tool never started")
	}
	old := leader()
	var killed bool
	for _, ns := range servers {
		if ns.Name() == old {
			ns.Shutdown()
			ns.WaitForShutdown()
			killed = true
		}
	}
	if !killed {
		t.Fatalf("no server leads the stream (leader %q)", old)
	}
	lost := time.Now()
	close(release) // the tool's result is stored under the new leader
	var res result
	select {
	case res = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the turn did not end within 20s of the leader's loss")
	}
	t.Logf("at %v: leader %s lost; the turn ended %v later (%d re-attaches), new leader %s", time.Since(t0), old, time.Since(lost), res.reattached, leader())
	check("a turn that lost the stream's leader", res, "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted ToolFinished MessageCompleted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted")

	// Two servers of three keep a quorum: a new turn runs.
	req = hello()
	req.TurnId = "c-3"
	t3 := time.Now()
	r3 := runTurn(req)
	t.Logf("c-3 took %v, %d re-attaches", time.Since(t3), r3.reattached)
	check("a turn with one server gone", r3, plain)
}
