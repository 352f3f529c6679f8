// Package wiretest helps tests drive AgentService over a real gRPC
// connection: run a turn to its end, render its events compactly so a
// test can assert the exact sequence, and make the certificates of a TLS
// or mutual-TLS set-up ([NewCA]).
package wiretest

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// Collect runs req to the end of its stream and returns its events and the
// final status (OK when the stream ended cleanly). onEvent, when not nil,
// sees each event as it arrives.
func Collect(tb testing.TB, ctx context.Context, c turnstilev1.AgentServiceClient, req *turnstilev1.RunTurnRequest, onEvent func(*turnstilev1.AgentEvent)) ([]*turnstilev1.AgentEvent, *status.Status) {
	tb.Helper()
	stream, err := c.RunTurn(ctx, req)
	if err != nil {
		tb.Fatalf("RunTurn: %v", err)
	}
	return drain(stream, onEvent)
}

// Watch runs WatchTurn to the end of its stream and returns its events and
// the final status.
func Watch(tb testing.TB, ctx context.Context, c turnstilev1.AgentServiceClient, req *turnstilev1.WatchTurnRequest) ([]*turnstilev1.AgentEvent, *status.Status) {
	tb.Helper()
	stream, err := c.WatchTurn(ctx, req)
	if err != nil {
		tb.Fatalf("WatchTurn: %v", err)
	}
	return drain(stream, nil)
}

// drain receives a stream's events until it ends.
func drain[R interface {
	GetEvent() *turnstilev1.AgentEvent
}](stream interface{ Recv() (R, error) }, onEvent func(*turnstilev1.AgentEvent)) ([]*turnstilev1.AgentEvent, *status.Status) {
	var evs []*turnstilev1.AgentEvent
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			return evs, status.New(codes.OK, "")
		}
		if err != nil {
			return evs, status.Convert(err)
		}
		evs = append(evs, resp.GetEvent())
		if onEvent != nil {
			onEvent(resp.GetEvent())
		}
	}
}

// Names renders events as their payload names separated by spaces, runs of
// text and tool-call deltas collapsed to one, e.g. "TurnStarted
// LlmCallStarted TextDelta ...". It reports a broken sequence (a seq that is
// not 1, 2, 3, ...) instead.
func Names(evs []*turnstilev1.AgentEvent) string {
	var out []string
	for i, ev := range evs {
		if ev.GetSeq() != uint64(i+1) {
			return fmt.Sprintf("event %d has seq %d", i, ev.GetSeq())
		}
		n := strings.TrimPrefix(fmt.Sprintf("%T", ev.GetPayload()), "*turnstilev1.AgentEvent_")
		if k := len(out); k > 0 && (n == "TextDelta" || n == "ToolCallDelta" || n == "ThinkingDelta") && out[k-1] == n {
			continue
		}
		out = append(out, n)
	}
	return strings.Join(out, " ")
}

// UserText returns a conversation of one user message.
func UserText(text string) []*turnstilev1.Message {
	return []*turnstilev1.Message{{Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: text}}}}}
}
