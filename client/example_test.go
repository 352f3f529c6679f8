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
