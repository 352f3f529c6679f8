package server_test

import (
	"context"
	"fmt"
	"math"
	goruntime "runtime"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/telemetry"
)

// costOf returns the sum of the float counter name over the data points
// whose attributes include every one of attrs.
func (m *meter) costOf(t *testing.T, name string, attrs ...attribute.KeyValue) float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name != name {
				continue
			}
		points:
			for _, dp := range mt.Data.(metricdata.Sum[float64]).DataPoints {
				for _, a := range attrs {
					if v, ok := dp.Attributes.Value(a.Key); !ok || v != a.Value {
						continue points
					}
				}
				sum += dp.Value
			}
		}
	}
	return sum
}

// TestCancelledTurnsPayTheirEstimate: a client that cancels each turn of
// its key once the model's reply began, before OpenAI reports usage (at
// the stream's end), is charged for each the estimate of its call: its
// prompt (1000 tokens, 0.003 USD) and what the reply streamed before the
// cut (400 bytes, 100 tokens, 0.0015 USD), to its budget and to the
// turnstile.cost metric of its key alike (marked turnstile.cost.estimated).
// Under a daily budget of 0.018 USD, where each turn holds 0.006 USD (its
// prompt and 200 output tokens), three such turns start and the fourth is
// refused BUDGET_EXHAUSTED; charged their prompts alone, six started, and
// the metric showed nothing for the key. The key's clock stands still at
// noon: no day ends while the test runs.
func TestCancelledTurnsPayTheirEstimate(t *testing.T) {
	t.Parallel()
	u := newUpstream(t)
	reply := strings.Repeat("w", 400)
	for range 8 {
		u.replies = append(u.replies, u.textThenHang(reply))
	}
	m := newMeter()
	obs, err := telemetry.NewObserver(tracenoop.NewTracerProvider(), m, telemetry.ObserverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	retry := policy.DefaultRetry()
	r, err := runtime.New([]*runtime.Model{{Alias: "oai", ProviderName: "up", Provider: u.provider(t), ID: "gpt-test", Retry: retry,
		MaxOutputTokens: 200, Price: &llm.Price{Currency: "USD", Input: int64(*money("3")), Output: int64(*money("15"))}}},
		"oai", nil, runtime.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	k := keyed("team", "tok-team-0123456")
	k.Limits.CostPerDay = money("0.018")
	ts := start(t, r, server.Options{Keys: []server.Key{k}, Clock: atNoon})
	ctx := bearer(t.Context(), "tok-team-0123456")
	cut := 0
	for i := 0; ; i++ {
		st := cancelAfterText(t, ts, ctx, bigPrompt(fmt.Sprintf("turn-%d", i)), len(reply))
		if st == nil {
			cut++
			continue
		}
		if !refusedFor(st, "BUDGET_EXHAUSTED", "cost_per_day") || retryInfo(st) <= 0 {
			t.Fatalf("turn %d: %v %q; want BUDGET_EXHAUSTED on cost_per_day with RetryInfo", i, st.Code(), st.Message())
		}
		break
	}
	if cut != 3 {
		t.Errorf("%d turns cut before the budget refused the key, want 3", cut)
	}
	got := m.costOf(t, "turnstile.cost", attribute.String("turnstile.client", "team"), attribute.Bool("turnstile.cost.estimated", true))
	if want := 3 * 0.0045; math.Abs(got-want) > 1e-12 {
		t.Errorf("turnstile.cost of the key's estimates: %v, want %v", got, want)
	}
}

// cancelAfterText runs req until its text deltas hold n bytes, then leaves
// its stream, which cancels the turn (no store), and reads it to its end;
// nil when it did, else the status that refused it before any event. A
// refusal while the turn before still holds what its call may cost (it
// has not been charged yet) is tried again.
func cancelAfterText(t *testing.T, ts *testServer, ctx context.Context, req *turnstilev1.RunTurnRequest, n int) *status.Status {
	t.Helper()
attempt:
	for {
		cctx, cancel := context.WithCancel(ctx)
		stream, err := ts.client.RunTurn(cctx, req)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		text, events := 0, 0
		for text < n {
			resp, err := stream.Recv()
			if err != nil {
				cancel()
				st := status.Convert(err)
				switch {
				case events > 0:
					t.Fatalf("the turn ended after %d events: %v", events, st)
				case refusedFor(st, "LIMIT_EXCEEDED", "cost_per_day"):
					goruntime.Gosched()
					continue attempt
				}
				return st
			}
			events++
			text += len(resp.GetEvent().GetTextDelta().GetText())
		}
		cancel()
		for {
			if _, err := stream.Recv(); err != nil {
				return nil
			}
		}
	}
}
