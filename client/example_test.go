package client_test

import (
	"context"
	"fmt"
	"iter"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
)

// exampleServer starts a real turnstile server on loopback whose model is
// overloaded on its first call and then answers; stop stops it.
func exampleServer() (addr string, stop func()) {
	p := &scripted{fn: func(_ context.Context, call int, _ *llm.Request) iter.Seq2[llm.Chunk, error] {
		if call == 1 {
			return fail(&llm.Error{Kind: llm.KindOverloaded, Message: "Overloaded", StatusCode: 529}, "Hel")
		}
		return reply("Hello ", "from ", "turnstile.")
	}}
	r, err := buildReplica(p)
	if err != nil {
		panic(err)
	}
	addr, _, stop = startServer(r)
	return addr, stop
}

// Run a turn and print its text as it streams. The first attempt fails
// with a retryable error after some output: the client says so, the
// partial output is to be dropped, and the step runs again.
func Example() {
	addr, stop := exampleServer()
	defer stop()

	c, err := client.New(addr,
		client.WithInsecure(),
		client.WithMaxStepRetries(2),
		client.WithBackoff(client.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 2, Jitter: 0.2}),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	turn := c.RunTurn(context.Background(), &turnstilev1.RunTurnRequest{
		Messages: []*turnstilev1.Message{{
			Role:  turnstilev1.Role_ROLE_USER,
			Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "Say hello."}}},
		}},
	})
	for ev, err := range turn.Events() {
		if err != nil {
			fmt.Println("\nturn failed:", err)
			return
		}
		switch {
		case ev.StepRetry != nil:
			r := ev.StepRetry
			fmt.Printf(" [%s; discard partial output: %v; attempt %d of %d]\n",
				client.CodeName(r.Err.Code), r.DiscardPartial, r.Attempt, r.MaxAttempts)
		case ev.Agent.GetTextDelta() != nil:
			fmt.Print(ev.Agent.GetTextDelta().GetText())
		}
	}
	res := turn.Result()
	fmt.Printf("\n%s after %d attempts, %d messages added\n", res.EndReason, res.Attempts, len(res.Messages))
	// Output:
	// Hel [OVERLOADED; discard partial output: true; attempt 2 of 3]
	// Hello from turnstile.
	// END_REASON_END_TURN after 2 attempts, 1 messages added
}

// A program traced with OpenTelemetry puts its turns in its traces with
// otelgrpc's client stats handler: the server's spans become children of
// the span of the context the turn runs with. Here the program's tracer
// provider is OpenTelemetry's global one, set up elsewhere.
func ExampleWithDialOptions_tracing() {
	c, err := client.New("turnstile.internal:7700",
		client.WithDialOptions(grpc.WithStatsHandler(otelgrpc.NewClientHandler(
			otelgrpc.WithPropagators(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})),
		))),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	ctx, span := otel.Tracer("my-agent").Start(context.Background(), "answer the user")
	defer span.End()
	res, err := c.RunTurn(ctx, &turnstilev1.RunTurnRequest{
		Messages: []*turnstilev1.Message{{
			Role:  turnstilev1.Role_ROLE_USER,
			Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "Say hello."}}},
		}},
	}).Wait()
	fmt.Println(res, err)
}

// A tool the server lists under require_approval waits for a decision:
// OnApproval answers each request in the event loop (a real program would
// ask a person; Turn.Approve decides from anywhere else). The denied call
// never runs: the model sees the reason in its error result.
func ExampleOnApproval() {
	p := &scripted{fn: func(_ context.Context, call int, _ *llm.Request) iter.Seq2[llm.Chunk, error] {
		if call == 1 {
			return callTool("call_1", "counter", `{"by":100}`)
		}
		return reply("I will not count then.")
	}}
	r, err := runtime.New([]*runtime.Model{{Alias: "test", ProviderName: "scripted", Provider: p, ID: "scripted-1", Retry: policy.Retry{Multiplier: 1}}}, "test",
		[]llm.Tool{&counter{}}, runtime.WithToolRules(runtime.ToolRules{RequireApproval: []string{"counter"}}))
	if err != nil {
		panic(err)
	}
	addr, _, stop := startServer(&replica{Runner: r, ended: make(chan error, 8)})
	defer stop()

	c, err := client.New(addr, client.WithInsecure())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	ask := func(_ context.Context, req *turnstilev1.ToolApprovalRequested) (client.Decision, error) {
		fmt.Printf("%s(%s)? no\n", req.GetName(), req.GetArguments())
		return client.Decision{Approved: false, Reason: "counting by 100 is too much"}, nil
	}
	turn := c.RunTurn(context.Background(), &turnstilev1.RunTurnRequest{
		Messages: []*turnstilev1.Message{{
			Role:  turnstilev1.Role_ROLE_USER,
			Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "Count by 100."}}},
		}},
	}, client.OnApproval(ask))
	for ev, err := range turn.Events() {
		if err != nil {
			fmt.Println(err)
			return
		}
		switch p := ev.Agent.GetPayload().(type) {
		case *turnstilev1.AgentEvent_ToolApprovalDecided:
			fmt.Printf("approved: %v (%s)\n", p.ToolApprovalDecided.GetApproved(), p.ToolApprovalDecided.GetReason())
		case *turnstilev1.AgentEvent_ToolFinished:
			fmt.Printf("result: %s\n", p.ToolFinished.GetContent())
		case *turnstilev1.AgentEvent_TextDelta:
			fmt.Print(p.TextDelta.GetText())
		}
	}
	fmt.Printf("\n%s, %d approval requested, %d denied\n", turn.Result().EndReason,
		turn.Result().Counters.GetApprovalsRequested(), turn.Result().Counters.GetApprovalsDenied())
	// Output:
	// counter({"by":100})? no
	// approved: false (counting by 100 is too much)
	// result: denied by the user: counting by 100 is too much
	// I will not count then.
	// END_REASON_END_TURN, 1 approval requested, 1 denied
}
