package client_test

import (
	"context"
	"iter"
	"testing"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/server"
)

// TestRefusedAttemptIsSentAgain: a server with a turn store runs attempt
// n only after attempt n-1. An attempt refused before any event (here the
// server's max_concurrent_turns, a retryable RESOURCE_EXHAUSTED) stored
// nothing, so the step retry sends the same attempt number again, and the
// turn runs as attempt 1.
func TestRefusedAttemptIsSentAgain(t *testing.T) {
	started := make(chan struct{})
	p := &scripted{fn: func(ctx context.Context, call int, _ *llm.Request) iter.Seq2[llm.Chunk, error] {
		if call == 1 {
			return hang(ctx, started, "holding")
		}
		return reply("ran")
	}}
	stores := sharedStores(t, 1)
	r := newReplica(t, p)
	addr := serveWith(t, r, server.Options{Store: stores[0], MaxConcurrentTurns: 1})
	c := newClient(t, addr, client.WithMaxStepRetries(1))
	rpc := turnstilev1.NewAgentServiceClient(c.Conn())

	hctx, cut := context.WithCancel(t.Context())
	holder := &turnstilev1.RunTurnRequest{TurnId: "holder", Messages: userRequest("hold").GetMessages()}
	if _, err := rpc.RunTurn(hctx, holder); err != nil {
		t.Fatal(err)
	}
	<-started
	cut() // the holder's client goes; its turn runs on, detached

	req := userRequest("go")
	req.TurnId = "turn-1"
	var sawRetry bool
	var last *client.Event
	for ev, err := range c.RunTurn(t.Context(), req).Events() {
		if err != nil {
			t.Fatalf("turn failed: %v", err)
		}
		if ev.StepRetry != nil {
			sawRetry = true
			if _, err := rpc.CancelTurn(t.Context(), &turnstilev1.CancelTurnRequest{TurnId: "holder"}); err != nil {
				t.Fatal(err)
			}
		}
		last = ev
	}
	if !sawRetry || last.Agent.GetTurnCompleted() == nil || last.Agent.GetAttempt() != 1 || last.Attempt != 2 {
		t.Errorf("retried %v; last event %v (client attempt %d)", sawRetry, last.Agent, last.Attempt)
	}
}
