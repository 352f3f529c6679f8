package server_test

import (
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
)

// pricedUsage is what each call of the cost tests reports: at the price
// table of pricedRunner it costs 1200×3 + 350×15 + 8000×0.3 + 2000×3.75
// = 18750 USD per million, 0.01875 USD.
var pricedUsage = llm.Usage{InputTokens: 1200, OutputTokens: 350, CacheReadTokens: 8000, CacheWriteTokens: 2000}

// callCost is pricedUsage's cost on the wire.
var callCost = &turnstilev1.Cost{Currency: "USD", Units: 0, Nanos: 18_750_000}

// costReply returns a reply that calls tool "lookup" (call true) or says
// "done", and reports pricedUsage.
func costReply(call bool) fake.Reply {
	chunks := fake.Text("done")
	stop := llm.StopEndTurn
	if call {
		chunks, stop = fake.Call("c1", "lookup", `{}`), llm.StopToolUse
	}
	out := []llm.Chunk{}
	for _, c := range chunks {
		switch c.Kind {
		case llm.ChunkUsage:
			c.Usage = pricedUsage
		case llm.ChunkStop:
			c.Stop = stop
		}
		out = append(out, c)
	}
	return fake.Reply{Chunks: out}
}

// money returns the amount s; the tests' amounts are valid.
func money(s string) *llm.Money {
	var m llm.Money
	if err := m.UnmarshalText([]byte(s)); err != nil {
		panic(err)
	}
	return &m
}

// pricedRunner returns a runner with model "priced" (3 / 15 USD per
// million input / output tokens, cache reads 0.3, cache writes 3.75),
// falling back to "free", which has no price, and the tool "lookup".
func pricedRunner(t *testing.T, priced, free llm.Provider) *runtime.Runner {
	t.Helper()
	retry := policy.DefaultRetry()
	retry.InitialBackoff, retry.MaxBackoff = time.Millisecond, 2*time.Millisecond
	cr, cw := int64(*money("0.3")), int64(*money("3.75"))
	price := &llm.Price{Currency: "USD", Input: int64(*money("3")), Output: int64(*money("15")), CacheRead: &cr, CacheWrite: &cw}
	r, err := runtime.New([]*runtime.Model{
		{Alias: "priced", ProviderName: "fake", Provider: priced, ID: "p-1", Retry: retry, Price: price, Fallbacks: []string{"free"}},
		{Alias: "free", ProviderName: "fake", Provider: free, ID: "f-1", Retry: retry},
	}, "priced", []llm.Tool{fake.NewTool("lookup", nil)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// costs returns the cost of each event that carries a usage, in order,
// "call" for LlmCallFinished, "total" for Usage and TurnCompleted; nil
// costs are kept as nil.
type costAt struct {
	at      string
	cost    *turnstilev1.Cost
	partial bool
}

func costsOf(evs []*turnstilev1.AgentEvent) []costAt {
	var out []costAt
	for _, ev := range evs {
		switch {
		case ev.GetLlmCallFinished() != nil:
			u := ev.GetLlmCallFinished().GetUsage()
			out = append(out, costAt{"call", u.GetCost(), u.GetCostPartial()})
		case ev.GetUsage() != nil:
			out = append(out, costAt{"usage", ev.GetUsage().GetCost(), ev.GetUsage().GetCostPartial()})
		case ev.GetTurnCompleted() != nil:
			u := ev.GetTurnCompleted().GetUsage()
			out = append(out, costAt{"completed", u.GetCost(), u.GetCostPartial()})
		}
	}
	return out
}

func usd(nanos int32) *turnstilev1.Cost {
	return &turnstilev1.Cost{Currency: "USD", Nanos: nanos}
}

// TestCostOnTheWire: each call's usage carries its cost at the model's
// price, cache tokens at their own rates, and the running and final
// totals the turn's; a model without a price has no cost field at all,
// and a turn that used both is partial.
func TestCostOnTheWire(t *testing.T) {
	t.Parallel()
	quota := fake.Reply{Err: &llm.Error{Kind: llm.KindQuotaExhausted, Message: "spent"}}
	tests := []struct {
		name        string
		model       string
		priced      []fake.Reply
		free        []fake.Reply
		wantEvents  string
		want        []costAt
		wantUsage   *turnstilev1.Usage
		wantPartial bool
	}{
		{
			name: "priced", model: "priced", priced: []fake.Reply{costReply(true), costReply(false)},
			wantEvents: "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted ToolFinished MessageCompleted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted",
			want:       []costAt{{"call", callCost, false}, {"usage", usd(18_750_000), false}, {"call", callCost, false}, {"usage", usd(37_500_000), false}, {"completed", usd(37_500_000), false}},
		},
		{
			name: "unpriced", model: "free", free: []fake.Reply{costReply(true), costReply(false)},
			wantEvents: "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted ToolFinished MessageCompleted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted",
			want:       []costAt{{"call", nil, false}, {"usage", nil, false}, {"call", nil, false}, {"usage", nil, false}, {"completed", nil, false}},
		},
		{
			// The priced model's second call fails having used nothing:
			// no cost field (and no usage event); the unpriced fallback
			// answers, which makes the turn's cost partial.
			name: "partly priced", model: "priced", priced: []fake.Reply{costReply(true), quota}, free: []fake.Reply{costReply(false)},
			wantEvents: "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted ToolFinished MessageCompleted LlmCallStarted LlmCallFinished Fallback LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted",
			want:       []costAt{{"call", callCost, false}, {"usage", usd(18_750_000), false}, {"call", nil, false}, {"call", nil, false}, {"usage", usd(18_750_000), true}, {"completed", usd(18_750_000), true}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ts := start(t, pricedRunner(t, fake.NewProvider(tt.priced...), fake.NewProvider(tt.free...)), server.Options{})
			req := hello()
			req.Model = tt.model
			evs, st := wiretest.Collect(t, t.Context(), ts.client, req, nil)
			if st.Code() != codes.OK {
				t.Fatalf("status %v", st)
			}
			if got := wiretest.Names(evs); got != tt.wantEvents {
				t.Fatalf("events\n got %s\nwant %s", got, tt.wantEvents)
			}
			got := costsOf(evs)
			if len(got) != len(tt.want) {
				t.Fatalf("%d costs, want %d: %v", len(got), len(tt.want), got)
			}
			for i, w := range tt.want {
				if got[i].at != w.at || !proto.Equal(got[i].cost, w.cost) || got[i].partial != w.partial || (w.cost == nil) != (got[i].cost == nil) {
					t.Errorf("cost %d: %s %v partial=%v, want %s %v partial=%v", i, got[i].at, got[i].cost, got[i].partial, w.at, w.cost, w.partial)
				}
			}
		})
	}
}

// untilMidnight returns the wait from now until the next UTC midnight.
func untilMidnight(now time.Time) time.Duration {
	now = now.UTC()
	next := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
	return next.Sub(now)
}

// budgetRefusal checks st refuses a turn for the key's spent cost_per_day
// before any event, with RetryInfo until the next UTC midnight on the
// server's clock, atNoon.
func budgetRefusal(t *testing.T, evs []*turnstilev1.AgentEvent, st *status.Status) {
	t.Helper()
	if len(evs) != 0 {
		t.Errorf("%d events before the refusal: %s", len(evs), wiretest.Names(evs))
	}
	var info *errdetails.ErrorInfo
	var ri *errdetails.RetryInfo
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			ri = d
		}
	}
	if st.Code() != codes.ResourceExhausted || info.GetReason() != "BUDGET_EXHAUSTED" || info.GetMetadata()["limit"] != "cost_per_day" || info.GetMetadata()["client"] != "spender" {
		t.Fatalf("status %v %q, ErrorInfo %v; want RESOURCE_EXHAUSTED BUDGET_EXHAUSTED limit=cost_per_day client=spender", st.Code(), st.Message(), info)
	}
	if want := untilMidnight(atNoon()); ri == nil || ri.GetRetryDelay().AsDuration() != want {
		t.Errorf("RetryInfo %v, want the wait to the next UTC midnight, %s", ri.GetRetryDelay().AsDuration(), want)
	}
}

// TestBudgetRefusesBeforeTheTurn: a key whose daily budget is spent gets
// RESOURCE_EXHAUSTED BUDGET_EXHAUSTED before any event, with RetryInfo to
// the reset; the turn that spent it (crossing it on its last call) ended
// normally, and another key is not held back.
func TestBudgetRefusesBeforeTheTurn(t *testing.T) {
	t.Parallel()
	p := fake.NewProvider(costReply(true), costReply(false), costReply(false))
	k := keyed("spender", "tok-spender-0123")
	// Its calls hold their prompts alone (the second's, 0.013512 USD at
	// the first's split of cached tokens, fits what is left, 0.01625): a
	// call may cross the budget by its reply.
	var zero int64
	k.Limits.CostPerDay, k.Limits.ReserveOutputTokens = money("0.035"), &zero
	ts := start(t, pricedRunner(t, p, fake.NewProvider()), server.Options{Keys: []server.Key{k, keyed("other", "tok-other-0123")}, Clock: atNoon})
	ctx := bearer(t.Context(), "tok-spender-0123")
	// 0.01875 then 0.0375: crossed by the last call, which ends the turn.
	if _, st := wiretest.Collect(t, ctx, ts.client, hello(), nil); st.Code() != codes.OK {
		t.Fatalf("first turn: %v", st)
	}
	req := hello()
	req.TurnId = "turn-2"
	evs, st := wiretest.Collect(t, ctx, ts.client, req, nil)
	budgetRefusal(t, evs, st)
	if p.Calls() != 2 {
		t.Errorf("the provider got %d calls, want 2", p.Calls())
	}
	if _, st := wiretest.Collect(t, bearer(t.Context(), "tok-other-0123"), ts.client, hello(), nil); st.Code() != codes.OK {
		t.Errorf("another key's turn: %v", st)
	}
}

// TestBudgetCrossedMidTurn: a turn whose call crosses its key's budget
// finishes that call (its tool calls run and are committed), then ends
// BUDGET_EXHAUSTED, not retryable, before the next model call; with a
// store and without.
func TestBudgetCrossedMidTurn(t *testing.T) {
	t.Parallel()
	for _, durable := range []bool{false, true} {
		name := "direct"
		if durable {
			name = "durable"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := fake.NewProvider(costReply(true), costReply(true), costReply(false))
			k := keyed("spender", "tok-spender-0123")
			// Its calls hold their prompts alone (the second's, 0.013512
			// USD, fits what is left, 0.01625): a call may cross the
			// budget by its reply (TestBudgetHoldsUnderConcurrency: with
			// the replies held, none does).
			var zero int64
			k.Limits.CostPerDay, k.Limits.ReserveOutputTokens = money("0.035"), &zero
			opts := server.Options{Keys: []server.Key{k}, Clock: atNoon}
			if durable {
				opts.Store = memStore(t)
			}
			ts := start(t, pricedRunner(t, p, fake.NewProvider()), opts)
			ctx := bearer(t.Context(), "tok-spender-0123")
			evs, st := wiretest.Collect(t, ctx, ts.client, hello(), nil)
			const want = "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted ToolFinished MessageCompleted " +
				"LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted ToolFinished MessageCompleted Error"
			if got := wiretest.Names(evs); got != want {
				t.Fatalf("events\n got %s\nwant %s", got, want)
			}
			last := evs[len(evs)-1].GetError()
			if last.GetCode() != turnstilev1.ErrorCode_ERROR_CODE_BUDGET_EXHAUSTED || last.Retryable == nil || last.GetRetryable() {
				t.Errorf("terminal error %v", last)
			}
			if st.Code() != codes.ResourceExhausted || reasonOf(st) != "BUDGET_EXHAUSTED" {
				t.Errorf("status %v %s", st.Code(), reasonOf(st))
			}
			for _, d := range st.Details() {
				if _, ok := d.(*errdetails.RetryInfo); ok {
					t.Errorf("RetryInfo on a turn ended mid-way: %v", d)
				}
			}
			if p.Calls() != 2 {
				t.Errorf("the provider got %d calls, want 2: the third is not made", p.Calls())
			}
			req := hello()
			req.TurnId = "turn-2"
			evs, st = wiretest.Collect(t, ctx, ts.client, req, nil)
			budgetRefusal(t, evs, st)
		})
	}
}
