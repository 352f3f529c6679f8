package runtime_test

import (
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
			req.Budget = func() error {
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
