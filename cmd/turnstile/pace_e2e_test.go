package main

import (
	"fmt"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/turnstile-dev/turnstile/config"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
)

// TestFrameIntervalReachesTheTurns: store.frame_interval is the pace of a
// durable turn's text. A reply of twelve words streamed 20 ms apart, with
// an interval of 10s (the most), reaches the client as its first delta and one
// more holding the rest (what followed the first waits until the call
// ends), where a store that answers within 20 ms, without the interval,
// would store and send a delta per word.
func TestFrameIntervalReachesTheTurns(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	for _, v := range []string{"OTEL_SDK_DISABLED", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"} {
		t.Setenv(v, "")
	}
	const reply = "one two three four five six seven eight nine ten eleven twelve"
	cfg, err := config.Parse("config.yaml", []byte(fmt.Sprintf(`
providers: {sim: {type: simulator, token_delay: 20ms, script: [%q]}}
models: {m: {provider: sim, model: x}}
ops: {listen: "127.0.0.1:0"}
store: {dir: "", frame_interval: 10s}
`, fmt.Sprintf("reply=%q", reply))))
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	addr, _, stop := serveWithOps(t, cfg, &logs)
	defer func() {
		if err := stop(); err != nil {
			t.Fatalf("serve: %v", err)
		}
	}()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	evs, st := wiretest.Collect(t, t.Context(), turnstilev1.NewAgentServiceClient(conn), &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("hello")}, nil)
	if st.Code() != codes.OK {
		t.Fatal(st)
	}
	var deltas []string
	for _, ev := range evs {
		if d := ev.GetTextDelta(); d != nil {
			deltas = append(deltas, d.GetText())
		}
	}
	if strings.TrimSpace(strings.Join(deltas, "")) != reply || len(deltas) > 2 {
		t.Errorf("text deltas %q: want the reply in at most two", deltas)
	}
}
