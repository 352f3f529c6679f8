package runtime_test

import (
	"context"
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// TestBudgetAskedBeforeEachCall: the turn's Budget is asked before every
// model call, retries and fallbacks included; a spent budget ends the turn
// BUDGET_EXHAUSTED, not retryable, without the call, the one under way
// having finished; asked before the first call, it ends the turn with no
// call at all.
func TestBudgetAskedBeforeEachCall(t *testing.T) {
	spent := &llm.Error{Kind: llm.KindBudgetExhausted, Message: "client key \"k\" spent its budget"}
	tests := []struct {
		name    string
		replies []fake.Reply
		// left is how many checks pass before the budget is spent.
		left int
		want string
	}{
		{"before the first call", []fake.Reply{{Chunks: fake.Text("never")}}, 0,
			"start | error BUDGET_EXHAUSTED retryable=false"},
		{"after a tool call", []fake.Reply{{Chunks: fake.Call("c1", "lookup", `{}`)}, {Chunks: fake.Text("never")}}, 1,
			"start | call m#1 | tooldelta | finished | usage | commit assistant | tool lookup | tooldone lookup | commit tool | error BUDGET_EXHAUSTED retryable=false"},
		{"before a retry", []fake.Reply{{Err: providerErr(llm.KindServerError, 0)}, {Chunks: fake.Text("never")}}, 1,
			"start | call m#1 | failed SERVER_ERROR | retry 2/3 SERVER_ERROR | error BUDGET_EXHAUSTED retryable=false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := fake.NewProvider(tt.replies...)
			r := newRunner(t, []*runtime.Model{model("m", p)}, []llm.Tool{fake.NewTool("lookup", nil)})
			req := userTurn("hi")
			left := tt.left
			req.Budget = func(context.Context, runtime.CallBound) error {
				if left == 0 {
					return spent
				}
				left--
				return nil
			}
			evs, _, terr := run(t, t.Context(), r, req)
			if got := describeAll(evs); got != tt.want {
				t.Errorf("events:\n got %s\nwant %s", got, tt.want)
			}
			if terr == nil || terr.Kind != llm.KindBudgetExhausted || terr.Message != spent.Message || terr.Retryable == nil || *terr.Retryable {
				t.Errorf("error = %+v", terr)
			}
			if p.Calls() != tt.left {
				t.Errorf("%d calls, want %d", p.Calls(), tt.left)
			}
		})
	}
}

// TestBudgetAskedWithEachCallsBound: each call's check carries its bound:
// its prompt estimated as compaction does (a quarter of the request's
// bytes before any report, then the reported prompt plus a quarter of the
// bytes since), the request's output limit over the model's, and the price
// of the model it goes to; FirstCall, before the turn, gives the first
// call's bound at the highest prices of the model's deployments.
func TestBudgetAskedWithEachCallsBound(t *testing.T) {
	price := &llm.Price{Currency: "USD", Input: 2_000_000_000, Output: 10_000_000_000}
	dearer := &llm.Price{Currency: "USD", Input: 3_000_000_000, Output: 8_000_000_000}
	// The first call reports 10 input tokens and calls lookup, whose
	// result ("looked up", 9 bytes) and the call (6 + 2 bytes) follow.
	p := fake.NewProvider(fake.Reply{Chunks: fake.Call("c1", "lookup", `{}`)}, fake.Reply{Chunks: fake.Text("done")})
	m := model("m", p)
	m.MaxOutputTokens, m.Price = 500, price
	m.Deployments = []runtime.Deployment{{Name: "a", Provider: p, ID: "m-a", Weight: 1000, Price: price}, {Name: "b", Provider: p, ID: "m-b", Weight: 1, Price: dearer}}
	r := newRunner(t, []*runtime.Model{m}, []llm.Tool{fake.NewTool("lookup", func(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error) {
		return llm.ToolOutput{Content: "looked up"}, nil
	})})
	req := userTurn(strings.Repeat("x", 400))
	req.MaxOutputTokens = 50
	first := r.FirstCall(req)
	tools := len("lookup") + len("test tool lookup") + len(`{"type":"object"}`)
	want := runtime.CallBound{InputTokens: int64(400+tools) / 4, MaxOutputTokens: 50, Price: &llm.Price{Currency: "USD", Input: 3_000_000_000, Output: 10_000_000_000}}
	if first.InputTokens != want.InputTokens || first.MaxOutputTokens != 50 || *first.Price != *want.Price {
		t.Errorf("FirstCall = %+v %+v, want %+v %+v", first, first.Price, want, want.Price)
	}
	var asked []runtime.CallBound
	req.Budget = func(_ context.Context, b runtime.CallBound) error {
		asked = append(asked, b)
		return nil
	}
	if _, _, terr := run(t, t.Context(), r, req); terr != nil {
		t.Fatal(terr)
	}
	if len(asked) != 2 {
		t.Fatalf("asked %d times, want 2", len(asked))
	}
	if asked[0].InputTokens != first.InputTokens || asked[0].MaxOutputTokens != 50 || *asked[0].Price != *price {
		t.Errorf("first call's bound %+v", asked[0])
	}
	// The provider reported 10 input tokens for the first call.
	if asked[1].InputTokens <= 10 || asked[1].InputTokens >= first.InputTokens || asked[1].MaxOutputTokens != 50 {
		t.Errorf("second call's bound %+v: want the reported 10 tokens and the bytes since", asked[1])
	}
	if c := asked[0].Cost(50); c.Nanos != (asked[0].InputTokens*2_000+50*10_000) || !c.Priced {
		t.Errorf("the bound's cost %+v", c)
	}
}

// TestCostOfCalls: each call's usage carries its cost at its model's
// price, the turn's usage the sum; a fallback to a model without a price
// makes the turn's cost partial.
func TestCostOfCalls(t *testing.T) {
	a := fake.NewProvider(fake.Reply{Chunks: fake.Call("c1", "lookup", `{}`)}, fake.Reply{Err: providerErr(llm.KindQuotaExhausted, 0)})
	b := fake.NewProvider(fake.Reply{Chunks: fake.Text("done")})
	priced := model("a", a, "b")
	priced.Price = &llm.Price{Currency: "EUR", Input: 2_000_000_000, Output: 10_000_000_000}
	r := newRunner(t, []*runtime.Model{priced, model("b", b)}, []llm.Tool{fake.NewTool("lookup", nil)})
	evs, done, terr := run(t, t.Context(), r, userTurn("hi"))
	if terr != nil {
		t.Fatal(terr)
	}
	var calls []llm.Cost
	for _, ev := range evs {
		if f, ok := ev.Payload.(*runtime.LLMCallFinished); ok {
			calls = append(calls, f.Usage.Cost)
		}
	}
	// 10 input × 2 + 5 output × 10 = 70 per million; the failed call used
	// nothing; b has no price.
	want := []llm.Cost{{Currency: "EUR", Nanos: 70_000, Priced: true}, {}, {Unpriced: true}}
	if len(calls) != len(want) {
		t.Fatalf("costs %v, want %v", calls, want)
	}
	for i := range want {
		if calls[i] != want[i] {
			t.Errorf("call %d cost %+v, want %+v", i+1, calls[i], want[i])
		}
	}
	if c := done.Usage.Cost; c != (llm.Cost{Currency: "EUR", Nanos: 70_000, Priced: true, Unpriced: true}) {
		t.Errorf("turn cost %+v", c)
	}
}
