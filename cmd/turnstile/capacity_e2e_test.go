package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/turnstile-dev/turnstile/config"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
)

// TestStoreSizeMetrics: a server with a store reports its size on
// /metrics (bytes held, the limit and the share of it used, the oldest
// record's age, turns held, runs removed, full or not), and health says the
// AgentService serves while the store has room.
func TestStoreSizeMetrics(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	for _, v := range []string{"OTEL_SDK_DISABLED", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"} {
		t.Setenv(v, "")
	}
	cfg, err := config.Parse("config.yaml", []byte(`
providers: {sim: {type: simulator}}
models: {m: {provider: sim, model: x}}
ops: {listen: "127.0.0.1:0"}
store: {dir: "", max_bytes: 4194304}
`))
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	addr, opsAddr, stop := serveWithOps(t, cfg, &logs)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, st := wiretest.Collect(t, t.Context(), turnstilev1.NewAgentServiceClient(conn), &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("hello")}, nil)
	if st.Code() != codes.OK {
		t.Fatalf("status %v", st)
	}
	h, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{Service: turnstilev1.AgentService_ServiceDesc.ServiceName})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health %v, %v", h, err)
	}
	var scrape string
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + opsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		scrape = string(b)
		// The keeper reads the size every second.
		if strings.Contains(scrape, "turnstile_store_oldest_age_seconds{") || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Each line is name{scope labels} value.
	values := map[string]string{}
	for _, l := range strings.Split(scrape, "\n") {
		if name, rest, ok := strings.Cut(l, "{"); ok && strings.HasPrefix(name, "turnstile_store_") {
			values[name] = rest[strings.LastIndex(rest, " ")+1:]
		}
	}
	for name, want := range map[string]string{
		"turnstile_store_bytes":              "",
		"turnstile_store_limit_bytes":        "4.194304e+06",
		"turnstile_store_utilization_ratio":  "",
		"turnstile_store_oldest_age_seconds": "",
		"turnstile_store_turns":              "1",
		"turnstile_store_evicted_total":      "0",
		"turnstile_store_full_ratio":         "0",
	} {
		got, ok := values[name]
		if !ok || want != "" && got != want {
			t.Errorf("/metrics: %s = %q (present: %v), want %q", name, got, ok, want)
		}
	}
	if values["turnstile_store_bytes"] == "0" {
		t.Error("the store holds 0 bytes after a turn")
	}
	if t.Failed() {
		for _, l := range strings.Split(scrape, "\n") {
			if strings.Contains(l, "turnstile_store") {
				t.Log(l)
			}
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
