package server_test

import (
	"context"
	"errors"
	"io"
	"iter"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
)

// TestWatchDuringTakeover: a WatchTurn made while the turn's replica is
// dead and no other has taken the turn over yet (its lease has not
// expired) is not refused UNAVAILABLE: it waits for the replica that takes
// the turn over and streams the rest of the turn from it, to its end, in
// the one call, its first event no sooner than the lease could expire and
// within its bound (two lease TTLs and the claim: a watch that sees no
// event for a lease TTL from a run without a lease adopts it), which the
// test's deadline holds it to with room for a slow machine
// (docs/durable-turns.md, "What a client sees in each failure").
func TestWatchDuringTakeover(t *testing.T) {
	t.Parallel()
	p := &byCall{script: func(ctx context.Context, n int) iter.Seq2[llm.Chunk, error] {
		if n == 1 {
			return chunks(ctx, true, textChunk("Hel"), textChunk("lo "))
		}
		return chunks(ctx, false, fake.Text("Hello world")...)
	}}
	rp := pair(t, p)
	head, cut := rp.runUntil(t, textSoFar("Hello "))
	rp.kill(cut)
	killed := time.Now()

	// At once, before the lease (the harness's, a second) expires: one
	// call, which must end well within a minute.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	w, err := rp.b.client.WatchTurn(ctx, &turnstilev1.WatchTurnRequest{TurnId: "turn-1", Attempt: 1, AfterSeq: head[len(head)-1].GetSeq()})
	if err != nil {
		t.Fatal(err)
	}
	var rest []*turnstilev1.AgentEvent
	var first time.Time
	st := status.New(codes.OK, "")
	for {
		resp, err := w.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			st = status.Convert(err)
			break
		}
		if first.IsZero() {
			first = time.Now()
		}
		rest = append(rest, resp.GetEvent())
	}
	if st.Code() != codes.OK || len(rest) == 0 {
		t.Fatalf("the watch made during the takeover ended %v after %d events, want the rest of the turn and OK", st, len(rest))
	}
	// It waited for the takeover: the lease lasts two thirds of its TTL at
	// least after the owner's last renewal.
	if d := first.Sub(killed); d < 100*time.Millisecond {
		t.Errorf("the first event came %v after the owner died, before its lease could expire", d)
	}
	t.Logf("the watch made at once after the owner died got its first event %v later", first.Sub(killed).Round(time.Millisecond))
	all := append(head, rest...)
	if got := wiretest.Names(all); got != "TurnStarted LlmCallStarted TextDelta Retry LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted" {
		t.Fatalf("events = %s", got)
	}
	log, _ := watch(t, t.Context(), rp.b.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
	sameEvents(t, "log", log, all)
}
