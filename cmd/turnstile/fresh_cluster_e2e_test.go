package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/turnstile-dev/turnstile/config"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/natstest"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
)

// TestServeOnAFreshCluster starts three replicas, as `turnstile serve`
// does, against a new three-server NATS cluster that is not up yet: while
// their stores wait for it, each listener answers health with NOT_SERVING
// and RunTurn with UNAVAILABLE; once the cluster is started, all three
// turn SERVING and run a durable turn.
func TestServeOnAFreshCluster(t *testing.T) {
	urls, startNATS := natstest.ClusterLater(t, 3)
	cfg, err := config.Parse("config.yaml", fmt.Appendf(nil, `
providers: {sim: {type: simulator}}
models: {sim: {provider: sim, model: turnstile-sim-1}}
store: {mode: nats, nats: {url: %q}}
server: {shutdown_grace: 1s}
`, strings.Join(urls, ",")))
	if err != nil {
		t.Fatal(err)
	}
	type replica struct {
		health healthpb.HealthClient
		agent  turnstilev1.AgentServiceClient
		served chan error
	}
	ctx, cancel := context.WithCancel(context.Background())
	var replicas []replica
	for range 3 {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		r := replica{health: healthpb.NewHealthClient(conn), agent: turnstilev1.NewAgentServiceClient(conn), served: make(chan error, 1)}
		go func() { r.served <- serveOn(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), lis, nil) }()
		replicas = append(replicas, r)
	}
	defer func() {
		cancel()
		for i, r := range replicas {
			if err := <-r.served; err != nil {
				t.Errorf("replica %d: serve: %v", i, err)
			}
		}
	}()
	// check returns a replica's health (the empty service's), once its
	// listener answers.
	check := func(r replica) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			hctx, hcancel := context.WithTimeout(ctx, time.Second)
			resp, err := r.health.Check(hctx, &healthpb.HealthCheckRequest{})
			hcancel()
			if err == nil {
				return resp.GetStatus()
			}
			if time.Now().After(deadline) {
				t.Fatalf("health: %v", err)
			}
		}
	}
	req := func(id string) *turnstilev1.RunTurnRequest {
		return &turnstilev1.RunTurnRequest{TurnId: id, Messages: []*turnstilev1.Message{{
			Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "hi"}}},
		}}}
	}
	for i, r := range replicas {
		if got := check(r); got != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("replica %d before the cluster: health %v, want NOT_SERVING", i, got)
		}
		evs, st := wiretest.Collect(t, ctx, r.agent, req(fmt.Sprintf("early-%d", i)), nil)
		if st.Code() != codes.Unavailable || len(evs) != 0 || !strings.Contains(st.Message(), "turn store is not ready") {
			t.Fatalf("replica %d before the cluster: RunTurn %v with %d events, want UNAVAILABLE and none", i, st, len(evs))
		}
	}

	startNATS()
	for i, r := range replicas {
		for deadline := time.Now().Add(time.Minute); check(r) != healthpb.HealthCheckResponse_SERVING; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("replica %d not SERVING a minute after the cluster started", i)
			}
		}
		evs, st := wiretest.Collect(t, ctx, r.agent, req(fmt.Sprintf("fresh-%d", i)), nil)
		if st.Code() != codes.OK || len(evs) == 0 || evs[len(evs)-1].GetTurnCompleted() == nil {
			t.Fatalf("replica %d: RunTurn %v, events %s", i, st, wiretest.Names(evs))
		}
	}
}
