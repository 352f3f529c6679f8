package telemetry_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/telemetry"
)

// longHistory is five exchanges of 400 bytes, then a question: about 500
// tokens by bytes, over 0.8 of a window of 600.
func longHistory() []llm.Message {
	var msgs []llm.Message
	for i := range 5 {
		msgs = append(msgs,
			llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(fmt.Sprintf("q%d %s", i, strings.Repeat("q", 196)))}},
			llm.Message{Role: llm.RoleAssistant, Parts: []llm.Part{llm.TextPart(strings.Repeat("a", 200))}})
	}
	return append(msgs, llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("and now?")}})
}

// spanEvents renders the events named name of span s, one line each, its
// attributes in the order they were added.
func spanEvents(s sdktrace.ReadOnlySpan, name string) []string {
	var out []string
	for _, ev := range s.Events() {
		if ev.Name != name {
			continue
		}
		var kv []string
		for _, a := range ev.Attributes {
			kv = append(kv, string(a.Key)+"="+a.Value.Emit())
		}
		out = append(out, strings.Join(kv, " "))
	}
	return out
}

// TestCompactionTelemetry: every compaction, whichever its trigger (before
// the call as the conversation nears the window, after an overflow) and
// strategy (keep_ends, summarize, summarize fallen back to keep_ends), is
// an event of the turn's span with its trigger and strategy, and a point
// of turnstile.compactions by model, strategy and trigger; a summary
// call's tokens and cost are on the event and its cost on the cost
// counter under the summarizing model.
func TestCompactionTelemetry(t *testing.T) {
	at := 0.8
	near := &runtime.CompactionConfig{At: &at}
	summarize := &runtime.CompactionConfig{At: &at, Strategy: runtime.CompactSummarize, Model: "cheap"}
	overflow := fake.Reply{Err: &llm.Error{Kind: llm.KindContextOverflow, Message: "prompt is too long", Provider: "fake", StatusCode: 400}}
	// cheap's summary: 10 input and 5 output tokens at 1 and 2 per
	// million, 0.00002 USD.
	cheapPrice := &llm.Price{Currency: "USD", Input: 1_000_000_000, Output: 2_000_000_000}
	const head = "turnstile.model=a turnstile.compaction.strategy="
	tests := []struct {
		name       string
		compaction *runtime.CompactionConfig
		replies    []fake.Reply
		summary    fake.Reply
		events     []string
		points     []string
		cost       []string
	}{{
		name:       "near the window, keep_ends",
		compaction: near,
		replies:    []fake.Reply{{Chunks: fake.Text("done")}},
		events: []string{head + "keep_ends turnstile.compaction.trigger=near_window " +
			"turnstile.compaction.messages_before=11 turnstile.compaction.messages_after=5"},
		points: []string{"turnstile.compaction.strategy=keep_ends,turnstile.compaction.trigger=near_window,turnstile.model=a 1"},
	}, {
		name:       "near the window, summarize",
		compaction: summarize,
		replies:    []fake.Reply{{Chunks: fake.Text("done")}},
		summary:    fake.Reply{Chunks: fake.Text("They compared five letters.")},
		events: []string{head + "summarize turnstile.compaction.trigger=near_window " +
			"turnstile.compaction.messages_before=11 turnstile.compaction.messages_after=5 turnstile.compaction.summary_model=cheap " +
			"gen_ai.usage.input_tokens=10 gen_ai.usage.output_tokens=5 gen_ai.usage.cache_read.input_tokens=0 " +
			"gen_ai.usage.cache_creation.input_tokens=0 turnstile.cost=2e-05 turnstile.cost.currency=USD"},
		points: []string{"turnstile.compaction.strategy=summarize,turnstile.compaction.trigger=near_window,turnstile.model=a 1"},
		cost:   []string{"turnstile.client=team-a,turnstile.cost.currency=USD,turnstile.model=cheap,turnstile.provider=small"},
	}, {
		name:       "near the window, a failed summary falls back to keep_ends",
		compaction: summarize,
		replies:    []fake.Reply{{Chunks: fake.Text("done")}},
		summary:    fake.Reply{Err: providerErr(llm.KindServerError)},
		events: []string{head + "keep_ends turnstile.compaction.trigger=near_window " +
			"turnstile.compaction.messages_before=11 turnstile.compaction.messages_after=5 turnstile.compaction.summary_model=cheap " +
			"turnstile.compaction.summary_failed=true"},
		points: []string{"turnstile.compaction.strategy=keep_ends,turnstile.compaction.trigger=near_window,turnstile.model=a 1"},
	}, {
		name:    "after an overflow",
		replies: []fake.Reply{overflow, {Chunks: fake.Text("done")}},
		events: []string{head + "keep_ends turnstile.compaction.trigger=overflow " +
			"turnstile.compaction.messages_before=11 turnstile.compaction.messages_after=5 error.type=CONTEXT_OVERFLOW turnstile.attempt=1"},
		points: []string{"turnstile.compaction.strategy=keep_ends,turnstile.compaction.trigger=overflow,turnstile.model=a 1"},
	}, {
		// The compaction before the call was not enough: the provider
		// still refused, and the conversation was compacted again.
		name:       "near the window, then after an overflow",
		compaction: near,
		replies:    []fake.Reply{overflow, {Chunks: fake.Text("done")}},
		events: []string{
			head + "keep_ends turnstile.compaction.trigger=near_window turnstile.compaction.messages_before=11 turnstile.compaction.messages_after=5",
			head + "keep_ends turnstile.compaction.trigger=overflow turnstile.compaction.messages_before=5 turnstile.compaction.messages_after=3 " +
				"error.type=CONTEXT_OVERFLOW turnstile.attempt=1",
		},
		points: []string{
			"turnstile.compaction.strategy=keep_ends,turnstile.compaction.trigger=near_window,turnstile.model=a 1",
			"turnstile.compaction.strategy=keep_ends,turnstile.compaction.trigger=overflow,turnstile.model=a 1",
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPipeline(t)
			a := fake.NewProvider(tc.replies...)
			cheap := fake.NewProvider(tc.summary)
			r, err := runtime.New([]*runtime.Model{
				{Alias: "a", ProviderName: "oai", Provider: a, ID: "a-id", Retry: fastRetry(), ContextWindow: 600, Compaction: tc.compaction},
				{Alias: "cheap", ProviderName: "small", Provider: cheap, ID: "cheap-id", Retry: fastRetry(), Price: cheapPrice},
			}, "a", nil, runtime.WithObserver(observer(t, p, telemetry.ObserverOptions{})))
			if err != nil {
				t.Fatal(err)
			}
			req := &runtime.TurnRequest{Messages: longHistory(), Client: "team-a"}
			if _, err := r.Run(t.Context(), req, runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil })); err != nil {
				t.Fatal(err)
			}
			turn := named(t, p.spans.Ended(), "invoke_agent", 0)
			if got := spanEvents(turn, "turnstile.compaction"); !slices.Equal(got, tc.events) {
				t.Errorf("compaction events:\n got %q\nwant %q", got, tc.events)
			}
			if got := attrs(turn)["turnstile.compactions"]; got != fmt.Sprint(len(tc.events)) {
				t.Errorf("turnstile.compactions on the turn's span = %s, want %d", got, len(tc.events))
			}
			ms := p.metrics(t)
			if got := points(t, ms["turnstile.compactions"]); !slices.Equal(got, tc.points) {
				t.Errorf("turnstile.compactions points:\n got %q\nwant %q", got, tc.points)
			}
			if ms["turnstile.compactions"].Unit != "{compaction}" {
				t.Errorf("unit %q", ms["turnstile.compactions"].Unit)
			}
			// Model a has no price: the only cost is the summary's.
			var cost []string
			if m, ok := ms["turnstile.cost"]; ok {
				for _, pt := range m.Data.(metricdata.Sum[float64]).DataPoints {
					var kv []string
					for _, a := range pt.Attributes.ToSlice() {
						kv = append(kv, string(a.Key)+"="+a.Value.Emit())
					}
					cost = append(cost, strings.Join(kv, ","))
					if math.Abs(pt.Value-0.00002) > 1e-15 {
						t.Errorf("cost %v, want 0.00002", pt.Value)
					}
				}
			}
			if !slices.Equal(cost, tc.cost) {
				t.Errorf("turnstile.cost points %q, want %q", cost, tc.cost)
			}
		})
	}
}
