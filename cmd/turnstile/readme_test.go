package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
)

// readmeDirectiveRequest returns the request of README's directive example:
// the grpcurl command whose prompt holds [sim fail=overloaded times=2].
func readmeDirectiveRequest(t *testing.T) *turnstilev1.RunTurnRequest {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`grpcurl -plaintext -d '(\{[^']*\[sim fail=overloaded times=2\][^']*\})'`).FindSubmatch(b)
	if m == nil {
		t.Fatal("README.md has no grpcurl example with [sim fail=overloaded times=2]")
	}
	req := &turnstilev1.RunTurnRequest{}
	if err := protojson.Unmarshal(m[1], req); err != nil {
		t.Fatalf("README's example request: %v", err)
	}
	return req
}

// describeWire renders events with what the README's walk-through of the
// example names: payloads, a retry's attempt and reason and whether it
// discards, a call's error code.
func describeWire(evs []*turnstilev1.AgentEvent) string {
	var out []string
	for _, ev := range evs {
		name := strings.TrimPrefix(fmt.Sprintf("%T", ev.GetPayload()), "*turnstilev1.AgentEvent_")
		if n := len(out); n > 0 && strings.HasSuffix(name, "Delta") && out[n-1] == name {
			continue // a run of deltas
		}
		switch {
		case ev.GetRetry() != nil:
			r := ev.GetRetry()
			out = append(out, fmt.Sprintf("Retry(%d/%d %s discard=%v)", r.GetAttempt(), r.GetMaxAttempts(), r.GetReason(), r.GetDiscardPartial()))
		case ev.GetLlmCallFinished().GetError() != nil:
			out = append(out, "LlmCallFinished("+ev.GetLlmCallFinished().GetError().GetCode().String()+")")
		default:
			out = append(out, name)
		}
	}
	return strings.Join(out, " ")
}

// TestREADMEDirectiveExampleRepeats runs README's directive example ten
// times on one server, as `turnstile serve` builds it with the default
// simulator (backoffs and pacing shortened), and asserts the event sequence
// the README walks through, the same every time: the simulator counts
// times=K per turn, and the retry budget keeps retries that work.
func TestREADMEDirectiveExampleRepeats(t *testing.T) {
	w := serveYAML(t, `
providers:
  sim: {type: simulator, token_delay: 0}
models:
  sim: {provider: sim, model: turnstile-sim-1, context_window: 32000}
retry: {initial_backoff: 1ms, max_backoff: 2ms}
`)
	const (
		failed = "LlmCallStarted ToolCallDelta LlmCallFinished(ERROR_CODE_OVERLOADED) "
		step1  = failed + "Retry(2/3 ERROR_CODE_OVERLOADED discard=true) " + failed + "Retry(3/3 ERROR_CODE_OVERLOADED discard=true) " +
			"LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted ToolFinished MessageCompleted "
		step2 = "LlmCallStarted LlmCallFinished(ERROR_CODE_OVERLOADED) Retry(2/3 ERROR_CODE_OVERLOADED discard=false) " +
			"LlmCallStarted LlmCallFinished(ERROR_CODE_OVERLOADED) Retry(3/3 ERROR_CODE_OVERLOADED discard=false) " +
			"LlmCallStarted TextDelta"
		want = "TurnStarted " + step1 + step2
	)
	for i := range 10 {
		evs, st := wiretest.Collect(t, t.Context(), w.client, readmeDirectiveRequest(t), nil)
		if st.Code() != codes.OK {
			t.Fatalf("run %d: status %v", i+1, st)
		}
		if names := wiretest.Names(evs); strings.HasPrefix(names, "event ") {
			t.Fatalf("run %d: %s", i+1, names)
		}
		got := describeWire(evs)
		if !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "LlmCallFinished Usage MessageCompleted TurnCompleted") {
			t.Fatalf("run %d:\n got %s\nwant %s ... LlmCallFinished Usage MessageCompleted TurnCompleted", i+1, got, want)
		}
	}
}
