package runtime_test

import (
	"context"
	"fmt"
	"iter"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

type ctxKey string

// hookRecorder is an Observer that writes each hook as a line and marks
// the contexts it returns, so a test can see where they reach.
type hookRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (h *hookRecorder) add(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lines = append(h.lines, fmt.Sprintf(format, args...))
}

func (h *hookRecorder) TurnStart(ctx context.Context, t runtime.TurnInfo) context.Context {
	h.add("turn start %s on %s", t.TurnID, t.Model)
	return context.WithValue(ctx, ctxKey("turn"), t.TurnID)
}

func (h *hookRecorder) TurnEnd(ctx context.Context, t runtime.TurnInfo, end runtime.TurnEnd) {
	outcome := "failed"
	if end.Completed != nil {
		outcome = end.Completed.Reason.String()
	}
	h.add("turn end %s served_by=%s calls=%d retries=%d fallbacks=%d tools=%d usage=%d/%d ctx=%v first_output=%v",
		outcome, end.ServedBy, end.Counters.ModelCalls, end.Counters.Retries, end.Counters.Fallbacks, end.Counters.ToolCalls,
		end.Usage.InputTokens, end.Usage.OutputTokens, ctx.Value(ctxKey("turn")), end.TimeToFirstOutput > 0)
}

func (h *hookRecorder) AttemptStart(ctx context.Context, a runtime.AttemptInfo) context.Context {
	h.add("attempt start %s/%s/%s attempt=%d call=%d step=%d msgs=%d", a.Model, a.Provider, a.ProviderModel, a.Attempt, a.Call, a.Step, len(a.Request.Messages))
	return context.WithValue(ctx, ctxKey("attempt"), fmt.Sprintf("%s#%d", a.Model, a.Call))
}

func (h *hookRecorder) AttemptFirstChunk(ctx context.Context, a runtime.AttemptInfo, ttfc time.Duration) {
	h.add("first chunk %s#%d positive=%v", a.Model, a.Call, ttfc > 0)
}

func (h *hookRecorder) AttemptEnd(ctx context.Context, a runtime.AttemptInfo, end runtime.AttemptEnd) {
	if end.Err != nil {
		h.add("attempt end %s#%d %s streamed=%v", a.Model, a.Call, end.Err.Kind, end.Streamed)
		return
	}
	h.add("attempt end %s#%d %s usage=%d/%d reply=%q served_by=%q", a.Model, a.Call, end.Stop, end.Usage.InputTokens, end.Usage.OutputTokens, end.Message.Text(), end.ResponseModel)
}

func (h *hookRecorder) Decision(ctx context.Context, d runtime.DecisionInfo) {
	h.add("decision %s#%d %s -> %s to=%q delay=%v", d.Model, d.Attempt, d.Kind, d.Action, d.To, d.Delay)
}

func (h *hookRecorder) Compaction(ctx context.Context, c runtime.CompactionInfo) {
	h.add("compaction %s before_call=%v attempt=%d %s %d->%d summary=%q/%q usage=%d/%d error=%q",
		c.Model, c.BeforeCall, c.Attempt, c.Strategy, c.MessagesBefore, c.MessagesAfter, c.SummaryModel, c.SummaryProvider,
		c.SummaryUsage.InputTokens, c.SummaryUsage.OutputTokens, c.SummaryError)
}

func (h *hookRecorder) ToolStart(ctx context.Context, t runtime.ToolInfo) context.Context {
	h.add("tool start %s %s", t.Name, t.CallID)
	return context.WithValue(ctx, ctxKey("tool"), t.CallID)
}

func (h *hookRecorder) ToolEnd(ctx context.Context, t runtime.ToolInfo, end runtime.ToolEnd) {
	h.add("tool end %s error=%v result=%q", t.Name, end.IsError, end.Content)
}

func (h *hookRecorder) Approval(ctx context.Context, a runtime.ApprovalInfo) {
	h.add("approval %s %s approved=%v timed_out=%v by=%q", a.Name, a.CallID, a.Approved, a.TimedOut, a.DecidedBy)
}

func (h *hookRecorder) Steer(ctx context.Context, s runtime.SteerInfo) {
	h.add("steer %d bytes", s.Bytes)
}

// ctxProvider records the attempt context value each call sees.
type ctxProvider struct {
	*fake.Provider
	mu   sync.Mutex
	seen []any
}

func (p *ctxProvider) Stream(ctx context.Context, req *llm.Request) iter.Seq2[llm.Chunk, error] {
	p.mu.Lock()
	p.seen = append(p.seen, ctx.Value(ctxKey("attempt")))
	p.mu.Unlock()
	return p.Provider.Stream(ctx, req)
}

// servedBy names model as the one that served a scripted reply, on its stop.
func servedBy(chunks []llm.Chunk, model string) []llm.Chunk {
	chunks[len(chunks)-1].Model = model
	return chunks
}

// TestObserverSeesTheWholeTurn runs a turn with a retry, a fallback and a
// tool, and asserts every hook the observer saw, in order, and that the
// contexts the hooks return reach the provider call and the tool.
func TestObserverSeesTheWholeTurn(t *testing.T) {
	primary := &ctxProvider{Provider: fake.NewProvider(
		fake.Reply{Err: providerErr(llm.KindOverloaded, time.Millisecond)},
		fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "par"}}, Err: providerErr(llm.KindNetwork, 0)},
		fake.Reply{Err: providerErr(llm.KindServerError, time.Millisecond)},
	)}
	backup := &ctxProvider{Provider: fake.NewProvider(
		fake.Reply{Chunks: fake.Call("c1", "lookup", `{}`)},
		fake.Reply{Chunks: servedBy(fake.Text("done"), "b-id-2026-01-01")},
	)}
	var toolCtx any
	tool := fake.NewTool("lookup", func(ctx context.Context, _ llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
		toolCtx = ctx.Value(ctxKey("tool"))
		return llm.ToolOutput{Content: "42"}, nil
	})
	obs := &hookRecorder{}
	// A still clock keeps the budget from refilling while the turn runs.
	still := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := newRunner(t, []*runtime.Model{model("a", primary, "b"), model("b", backup)}, []llm.Tool{tool},
		runtime.WithObserver(obs), runtime.WithClock(func() time.Time { return still }))
	_, _, terr := run(t, t.Context(), r, userTurn("hi"))
	if terr != nil {
		t.Fatal(terr)
	}
	want := []string{
		"turn start t1 on a",
		"attempt start a/fake/a-id attempt=1 call=1 step=1 msgs=1",
		"attempt end a#1 OVERLOADED streamed=false",
		"decision a#1 OVERLOADED -> retry to=\"\" delay=1ms",
		"attempt start a/fake/a-id attempt=2 call=2 step=1 msgs=1",
		"first chunk a#2 positive=true",
		"attempt end a#2 STREAM_INTERRUPTED streamed=true",
		"decision a#2 STREAM_INTERRUPTED -> retry to=\"\" delay=2ms",
		"attempt start a/fake/a-id attempt=3 call=3 step=1 msgs=1",
		"attempt end a#3 SERVER_ERROR streamed=false",
		"decision a#3 SERVER_ERROR -> fallback to=\"b\" delay=0s",
		"attempt start b/fake/b-id attempt=1 call=4 step=1 msgs=1",
		"first chunk b#4 positive=true",
		"attempt end b#4 tool_use usage=10/5 reply=\"\" served_by=\"\"",
		"tool start lookup c1",
		"tool end lookup error=false result=\"42\"",
		"attempt start b/fake/b-id attempt=1 call=5 step=2 msgs=3",
		"first chunk b#5 positive=true",
		"attempt end b#5 end_turn usage=10/5 reply=\"done\" served_by=\"b-id-2026-01-01\"",
		"turn end end_turn served_by=b calls=5 retries=2 fallbacks=1 tools=1 usage=20/10 ctx=t1 first_output=true",
	}
	if got := strings.Join(obs.lines, "\n"); got != strings.Join(want, "\n") {
		t.Errorf("hooks:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	if got := fmt.Sprint(primary.seen, backup.seen); got != "[a#1 a#2 a#3] [b#4 b#5]" {
		t.Errorf("attempt contexts seen by the providers = %s", got)
	}
	if toolCtx != "c1" {
		t.Errorf("tool context value = %v, want c1", toolCtx)
	}
	// The shared state the gauges read: a's two retries failed, spending
	// the token each took; b, never retried, keeps its budget full.
	var budgets []string
	for _, m := range r.Health() {
		budgets = append(budgets, fmt.Sprintf("%s=%g/%g", m.Alias, m.BudgetTokens, m.BudgetMax))
	}
	if got := strings.Join(budgets, " "); got != "a=8/10 b=10/10" {
		t.Errorf("Health budgets = %s, want a=8/10 b=10/10", got)
	}
}

// TestObserverSeesFailureCause asserts that a failed turn's end carries
// the terminal error and its root cause, which never reaches the event.
func TestObserverSeesFailureCause(t *testing.T) {
	cause := fmt.Errorf(`Post "api.example.com/v1/chat": unsupported protocol scheme ""`)
	p := fake.NewProvider(fake.Reply{Err: cause})
	var end runtime.TurnEnd
	rec := &endRecorder{end: &end}
	r := newRunner(t, []*runtime.Model{model("a", p)}, nil, runtime.WithObserver(rec))
	evs, _, terr := run(t, t.Context(), r, userTurn("hi"))
	if terr == nil || terr.Kind != llm.KindInternal {
		t.Fatalf("error = %v, want INTERNAL", terr)
	}
	last := evs[len(evs)-1].Payload.(*runtime.TurnError)
	if strings.Contains(last.Message, "scheme") {
		t.Errorf("the event's message leaks the cause: %q", last.Message)
	}
	if end.Err == nil || end.Err.Cause == nil || !strings.Contains(end.Err.Cause.Error(), "unsupported protocol scheme") {
		t.Errorf("TurnEnd.Err = %+v; want the root cause kept for logs", end.Err)
	}
}

type endRecorder struct {
	runtime.NopObserver
	end *runtime.TurnEnd
}

func (e *endRecorder) TurnEnd(_ context.Context, _ runtime.TurnInfo, end runtime.TurnEnd) {
	*e.end = end
}

// TestObserversChainContexts asserts that Observers calls each observer in
// order and passes on the contexts they return.
func TestObserversChainContexts(t *testing.T) {
	a, b := &hookRecorder{}, &hookRecorder{}
	obs := runtime.Observers(nil, a, b)
	ctx := obs.TurnStart(t.Context(), runtime.TurnInfo{TurnID: "x", Model: "m"})
	if ctx.Value(ctxKey("turn")) != "x" || len(a.lines) != 1 || len(b.lines) != 1 {
		t.Errorf("TurnStart: ctx value %v, lines %v %v", ctx.Value(ctxKey("turn")), a.lines, b.lines)
	}
	if _, ok := runtime.Observers().(runtime.NopObserver); !ok {
		t.Errorf("Observers() is not a NopObserver")
	}
	if runtime.Observers(a) != runtime.Observer(a) {
		t.Errorf("Observers(a) does not return a itself")
	}
}
