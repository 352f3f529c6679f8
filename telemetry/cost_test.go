package telemetry_test

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/telemetry"
)

// TestCost: a priced model's calls carry their cost on their chat spans,
// the turn's span and log line carry the turn's, and the cost counter adds
// it up by model, provider, currency and client key name; a model without
// a price puts no cost anywhere, not even 0.
func TestCost(t *testing.T) {
	cr := int64(300_000_000)
	price := &llm.Price{Currency: "USD", Input: 3_000_000_000, Output: 15_000_000_000, CacheRead: &cr}
	for _, priced := range []bool{true, false} {
		name := "priced"
		if !priced {
			name, price = "unpriced", nil
		}
		t.Run(name, func(t *testing.T) {
			p := newPipeline(t)
			var buf bytes.Buffer
			answer := fake.Text("done")
			answer[1].Usage.CacheReadTokens = 30
			prov := fake.NewProvider(fake.Reply{Chunks: fake.Call("c1", "lookup", `{}`)}, fake.Reply{Chunks: answer})
			obs := runtime.Observers(observer(t, p, telemetry.ObserverOptions{}), telemetry.NewTurnLog(slog.New(slog.NewJSONHandler(&buf, nil))))
			r, err := runtime.New([]*runtime.Model{{Alias: "m", ProviderName: "oai", Provider: prov, ID: "m-id", Retry: fastRetry(), Price: price}},
				"m", []llm.Tool{fake.NewTool("lookup", nil)}, runtime.WithObserver(obs))
			if err != nil {
				t.Fatal(err)
			}
			req := userTurn("hi")
			req.Client = "team-a"
			if _, err := r.Run(t.Context(), req, runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil })); err != nil {
				t.Fatal(err)
			}
			// 10×3 + 5×15 = 105 per million; then 10×3 + 5×15 + 30×0.3 = 114.
			wantCall := []string{"0.000105", "0.000114"}
			wantTurn := "0.000219"
			if !priced {
				wantCall, wantTurn = []string{"", ""}, ""
			}
			for i, w := range wantCall {
				a := attrs(named(t, p.spans.Ended(), "chat m-id", i))
				if got := a["turnstile.cost"]; !sameAmount(got, w) || (w != "") != (a["turnstile.cost.currency"] == "USD") {
					t.Errorf("chat span %d: cost %q %q, want %q", i, got, a["turnstile.cost.currency"], w)
				}
			}
			turn := attrs(named(t, p.spans.Ended(), "invoke_agent", 0))
			if got := turn["turnstile.cost"]; !sameAmount(got, wantTurn) {
				t.Errorf("turn span: cost %q, want %q", got, wantTurn)
			}
			if _, ok := turn["turnstile.cost.partial"]; ok {
				t.Error("a turn of one model is partial")
			}

			m, ok := p.metrics(t)["turnstile.cost"]
			var pts []metricdata.DataPoint[float64]
			if ok {
				pts = m.Data.(metricdata.Sum[float64]).DataPoints
			}
			switch {
			case !priced && len(pts) != 0:
				t.Errorf("cost points of an unpriced model: %v", pts)
			case priced && len(pts) != 1:
				t.Fatalf("cost points: %v, want 1", pts)
			case priced:
				// A model without deployments is its own: its provider's name.
				want := attribute.NewSet(attribute.String("turnstile.model", "m"), attribute.String("turnstile.provider", "oai"), attribute.String("turnstile.deployment", "oai"),
					attribute.String("turnstile.cost.currency", "USD"), attribute.String("turnstile.client", "team-a"))
				if !pts[0].Attributes.Equals(&want) || math.Abs(pts[0].Value-0.000219) > 1e-15 || m.Unit != "{currency}" {
					t.Errorf("cost point %v %v %s", pts[0].Attributes.ToSlice(), pts[0].Value, m.Unit)
				}
			}

			line := logLines(t, &buf)[0]
			if priced && (line["cost"] != "0.000219" || line["currency"] != "USD") {
				t.Errorf("log line cost %v %v", line["cost"], line["currency"])
			}
			if _, has := line["cost"]; !priced && has {
				t.Errorf("log line of an unpriced turn has a cost: %v", line["cost"])
			}
		})
	}
}

// sameAmount compares a float attribute as emitted with a decimal amount;
// "" is no attribute.
func sameAmount(got, want string) bool {
	if got == "" || want == "" {
		return got == want
	}
	g, err1 := strconv.ParseFloat(got, 64)
	w, err2 := strconv.ParseFloat(want, 64)
	return err1 == nil && err2 == nil && math.Abs(g-w) < 1e-15
}

// TestCostOfACutCall: a call cut short with no usage reported costs the
// estimate its client key is charged, in the cost counter too, marked
// turnstile.cost.estimated; the call that then answers costs what it
// reported, unmarked.
func TestCostOfACutCall(t *testing.T) {
	price := &llm.Price{Currency: "USD", Input: 3_000_000_000, Output: 15_000_000_000}
	p := newPipeline(t)
	// 400 bytes of prompt (100 tokens), then 40 bytes of reply (10 tokens)
	// before the stream fails: 100×3 + 10×15 = 450 per million.
	cut := fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: strings.Repeat("w", 40)}}, Err: providerErr(llm.KindServerError)}
	prov := fake.NewProvider(cut, fake.Reply{Chunks: fake.Text("done")})
	r, err := runtime.New([]*runtime.Model{{Alias: "m", ProviderName: "oai", Provider: prov, ID: "m-id", Retry: fastRetry(), Price: price}},
		"m", nil, runtime.WithObserver(observer(t, p, telemetry.ObserverOptions{})))
	if err != nil {
		t.Fatal(err)
	}
	req := userTurn(strings.Repeat("x", 400))
	req.Client = "team-a"
	if _, err := r.Run(t.Context(), req, runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil })); err != nil {
		t.Fatal(err)
	}
	m := p.metrics(t)["turnstile.cost"]
	pts := m.Data.(metricdata.Sum[float64]).DataPoints
	base := []attribute.KeyValue{attribute.String("turnstile.model", "m"), attribute.String("turnstile.provider", "oai"), attribute.String("turnstile.deployment", "oai"),
		attribute.String("turnstile.cost.currency", "USD"), attribute.String("turnstile.client", "team-a")}
	estimated := attribute.NewSet(append(base, attribute.Bool("turnstile.cost.estimated", true))...)
	reported := attribute.NewSet(base...)
	// The answer reports 10 input and 5 output tokens: 105 per million.
	want := map[attribute.Distinct]float64{estimated.Equivalent(): 0.00045, reported.Equivalent(): 0.000105}
	if len(pts) != len(want) {
		t.Fatalf("cost points %v, want %d", pts, len(want))
	}
	for _, pt := range pts {
		w, ok := want[pt.Attributes.Equivalent()]
		if !ok || math.Abs(pt.Value-w) > 1e-15 {
			t.Errorf("cost point %v %v", pt.Attributes.ToSlice(), pt.Value)
		}
	}
}
