package runtime_test

import (
	"context"
	"iter"
	"sync"
	"testing"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// cancelsMidSummary is a summarizing model that reports its usage, then
// cancels the turn and waits for the call's end.
type cancelsMidSummary struct {
	cancel context.CancelFunc
}

func (c *cancelsMidSummary) Stream(ctx context.Context, _ *llm.Request) iter.Seq2[llm.Chunk, error] {
	return func(yield func(llm.Chunk, error) bool) {
		if !yield(llm.Chunk{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 300, OutputTokens: 7}}, nil) {
			return
		}
		c.cancel()
		<-ctx.Done()
		yield(llm.Chunk{}, ctx.Err())
	}
}

// compactionWatcher records the compactions and the turn's usage an
// observer is told of.
type compactionWatcher struct {
	runtime.NopObserver
	mu          sync.Mutex
	compactions []runtime.CompactionInfo
	usage       llm.Usage
}

func (w *compactionWatcher) Compaction(_ context.Context, c runtime.CompactionInfo) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.compactions = append(w.compactions, c)
}

func (w *compactionWatcher) TurnEnd(_ context.Context, _ runtime.TurnInfo, end runtime.TurnEnd) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.usage = end.Usage
}

// TestCancelDuringTheSummary: a turn cancelled while its summary call
// runs ends there: no compaction is committed or observed (the summary's
// failure is the cancellation, not a reason to compact by keep_ends), the
// model is not called, and the tokens the summary call used count in the
// turn's usage.
func TestCancelDuringTheSummary(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	p := fake.NewProvider(fake.Reply{Chunks: fake.Text("done")})
	m := model("a", p)
	m.ContextWindow, m.Compaction = 600, &runtime.CompactionConfig{Strategy: runtime.CompactSummarize, Model: "cheap"}
	w := &compactionWatcher{}
	r := newRunner(t, []*runtime.Model{m, model("cheap", &cancelsMidSummary{cancel: cancel})}, nil, runtime.WithObserver(w))
	evs, _, terr := run(t, ctx, r, &runtime.TurnRequest{Messages: history()})
	if terr == nil || terr.Kind != llm.KindCancelled {
		t.Fatalf("turn error %v, want CANCELLED", terr)
	}
	// The interruption note is committed, as for any cancelled turn.
	if got, want := describeAll(evs), "start | commit user | error CANCELLED retryable=false"; got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	if p.Calls() != 0 {
		t.Errorf("the model got %d calls after the turn was cancelled", p.Calls())
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.compactions) != 0 {
		t.Errorf("compactions observed: %+v", w.compactions)
	}
	if w.usage.InputTokens != 300 || w.usage.OutputTokens != 7 {
		t.Errorf("turn usage %+v, want the summary call's 300/7", w.usage)
	}
}

// TestSummaryTokensBeforeAFailedCall: the tokens of a summary call are in
// the turn's running totals at once, so a turn whose next model call
// fails without usage still reports them (and the server charges them to
// the client key's budget, which counts the totals of usage events).
func TestSummaryTokensBeforeAFailedCall(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Err: providerErr(llm.KindInvalidRequest, 0)})
	cheap := fake.NewProvider(fake.Reply{Chunks: fake.Text("They compared five letters.")})
	m := model("a", p)
	m.ContextWindow, m.Compaction = 600, &runtime.CompactionConfig{Strategy: runtime.CompactSummarize, Model: "cheap"}
	r := newRunner(t, []*runtime.Model{m, model("cheap", cheap)}, nil)
	evs, _, terr := run(t, t.Context(), r, &runtime.TurnRequest{Messages: history()})
	if terr == nil || terr.Kind != llm.KindInvalidRequest {
		t.Fatalf("turn error %v, want INVALID_REQUEST", terr)
	}
	if got, want := describeAll(evs), "start | usage | compaction | call a#1 | failed INVALID_REQUEST | error INVALID_REQUEST retryable=false"; got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	if u, ok := evs[1].Payload.(*runtime.UsageUpdated); !ok || u.Total.InputTokens != 10 || u.Total.OutputTokens != 5 {
		t.Errorf("event 1 %+v, want the summary's 10/5 tokens", evs[1].Payload)
	}
}

// TestSummaryCostOfADeployment: a summarizing model served by deployments
// calls its first, and the summary's cost is at that deployment's price,
// under its provider's name.
func TestSummaryCostOfADeployment(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: fake.Text("done")})
	first := fake.NewProvider(fake.Reply{Chunks: fake.Text("They compared five letters.")})
	second := fake.NewProvider(fake.Reply{Chunks: fake.Text("never asked")})
	m := model("a", p)
	m.ContextWindow, m.Compaction = 600, &runtime.CompactionConfig{Strategy: runtime.CompactSummarize, Model: "cheap"}
	// 10 input and 5 output tokens at 1 and 2 per million.
	price := &llm.Price{Currency: "USD", Input: 1_000_000_000, Output: 2_000_000_000}
	cheap := &runtime.Model{Alias: "cheap", Retry: fastRetry(), Deployments: []runtime.Deployment{
		{Name: "east", ProviderName: "small-east", Provider: first, ID: "cheap-1", Price: price},
		{Name: "west", ProviderName: "small-west", Provider: second, ID: "cheap-1"},
	}}
	w := &compactionWatcher{}
	r := newRunner(t, []*runtime.Model{m, cheap}, nil, runtime.WithObserver(w))
	if _, _, terr := run(t, t.Context(), r, &runtime.TurnRequest{Messages: history()}); terr != nil {
		t.Fatal(terr)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.compactions) != 1 {
		t.Fatalf("compactions %+v", w.compactions)
	}
	c := w.compactions[0]
	want := llm.Cost{Currency: "USD", Nanos: 20_000, Priced: true}
	if c.Strategy != "summarize" || c.SummaryProvider != "small-east" || c.SummaryUsage.Cost != want || first.Calls() != 1 || second.Calls() != 0 {
		t.Errorf("compaction %+v; calls %d, %d", c, first.Calls(), second.Calls())
	}
	// Model a has no price: the turn's cost is the summary's, partial.
	if partial := (llm.Cost{Currency: "USD", Nanos: 20_000, Priced: true, Unpriced: true}); w.usage.Cost != partial {
		t.Errorf("turn cost %+v, want %+v", w.usage.Cost, partial)
	}
}
