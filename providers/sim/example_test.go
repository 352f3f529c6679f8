package sim_test

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/sim"
)

// The simulator streams a reply token by token, then usage and the stop.
func Example() {
	p, err := sim.New("sim", sim.Config{TokenDelay: -1})
	if err != nil {
		panic(err)
	}
	req := &llm.Request{
		Model:    "turnstile-sim-1",
		Messages: []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(`[sim reply="Hello there, friend."] Hi!`)}}},
	}
	for c, err := range p.Stream(context.Background(), req) {
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		switch c.Kind {
		case llm.ChunkText:
			fmt.Printf("text %q\n", c.Text)
		case llm.ChunkUsage:
			fmt.Printf("usage in=%d out=%d\n", c.Usage.InputTokens, c.Usage.OutputTokens)
		case llm.ChunkStop:
			fmt.Println("stop", c.Stop)
		}
	}
	// Output:
	// text "Hello "
	// text "there, "
	// text "friend."
	// usage in=9 out=3
	// stop end_turn
}

// A failure directive with times=K fails the first K calls of a
// conversation, so the runtime's retry succeeds.
func Example_failure() {
	p, err := sim.New("primary", sim.Config{TokenDelay: -1})
	if err != nil {
		panic(err)
	}
	req := &llm.Request{
		Model:    "sim-primary",
		Messages: []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("[sim fail=rate_limit retry_after=2s times=1] Hi!")}}},
	}
	for attempt := 1; attempt <= 2; attempt++ {
		var text strings.Builder
		for c, err := range p.Stream(context.Background(), req) {
			var e *llm.Error
			if errors.As(err, &e) {
				fmt.Printf("attempt %d: %v %d retry after %v\n", attempt, e.Kind, e.StatusCode, e.RetryAfter)
			}
			if c.Kind == llm.ChunkStop {
				fmt.Printf("attempt %d: %s\n", attempt, c.Stop)
			}
			text.WriteString(c.Text)
		}
	}
	// Output:
	// attempt 1: RATE_LIMITED 429 retry after 2s
	// attempt 2: end_turn
}
