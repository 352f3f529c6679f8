package server_test

import (
	"context"
	"fmt"
	"iter"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
)

// recorded is a provider that records each call's request and answers
// the nth call (from 1, across replicas) with script(n).
type recorded struct {
	mu     sync.Mutex
	reqs   []*llm.Request
	script func(ctx context.Context, n int) iter.Seq2[llm.Chunk, error]
}

func (p *recorded) Stream(ctx context.Context, req *llm.Request) iter.Seq2[llm.Chunk, error] {
	p.mu.Lock()
	p.reqs = append(p.reqs, req)
	n := len(p.reqs)
	p.mu.Unlock()
	return p.script(ctx, n)
}

func (p *recorded) requests() []*llm.Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*llm.Request(nil), p.reqs...)
}

// cutRunner is a runner of one model that continues cut streams
// (on_stream_cut: continue) when cut is StreamCutContinue.
func cutRunner(t *testing.T, p llm.Provider, cut runtime.StreamCut) *runtime.Runner {
	t.Helper()
	retry := policy.DefaultRetry()
	retry.InitialBackoff, retry.MaxBackoff = time.Millisecond, 2*time.Millisecond
	r, err := runtime.New([]*runtime.Model{{Alias: "sim", ProviderName: "fake", Provider: p, ID: "fake-1", Retry: retry, OnStreamCut: cut}}, "sim", nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestTakeoverContinuesCutReply: the replica running a turn dies while
// the model streams its reply. With on_stream_cut: continue, the replica
// that takes the turn over keeps the text stored (the Retry event does not
// discard it) and asks the model to continue it; the reply committed is
// the stored text followed by the continuation. With restart, the text is
// discarded and the call made again from the start, as before.
func TestTakeoverContinuesCutReply(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cut         runtime.StreamCut
		second      string // the second call's reply
		wantDiscard bool
		wantReply   string
		wantTail    []llm.Message // the end of the second call's conversation
	}{{
		cut: runtime.StreamCutContinue, second: "world", wantReply: "Hello world",
		wantTail: []llm.Message{
			{Role: llm.RoleAssistant, Parts: []llm.Part{llm.TextPart("Hello ")}},
			{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(runtime.ContinuationPrompt)}},
		},
	}, {
		cut: runtime.StreamCutRestart, second: "Hello world", wantDiscard: true, wantReply: "Hello world",
		wantTail: []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("hello")}}},
	}}
	for _, tt := range tests {
		t.Run(string(tt.cut), func(t *testing.T) {
			t.Parallel()
			p := &recorded{script: func(ctx context.Context, n int) iter.Seq2[llm.Chunk, error] {
				if n == 1 {
					return chunks(ctx, true, textChunk("Hel"), textChunk("lo "))
				}
				return chunks(ctx, false, fake.Text(tt.second)...)
			}}
			rs := startReplicas(t, 2, func(int) *runtime.Runner { return cutRunner(t, p, tt.cut) }, detachAfter(5*time.Second))
			rp := &replicaPair{a: rs[0], b: rs[1], storeA: rs[0].store}
			head, cut := rp.runUntil(t, textSoFar("Hello "))
			rp.kill(cut)
			all, st := resumeOnB(t, rp, head)
			if st.Code() != codes.OK {
				t.Fatalf("status %v", st)
			}
			if got, want := wiretest.Names(all), "TurnStarted LlmCallStarted TextDelta Retry LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"; got != want {
				t.Fatalf("events:\n got %s\nwant %s", got, want)
			}
			var retry *turnstilev1.Retry
			for _, ev := range all {
				if r := ev.GetRetry(); r != nil {
					retry = r
				}
			}
			if tt.wantDiscard != retry.GetDiscardPartial() || (tt.wantDiscard && retry.GetDiscardFromSeq() != 3) || (!tt.wantDiscard && retry.GetDiscardFromSeq() != 0) {
				t.Errorf("retry = %v, want discard_partial %v", retry, tt.wantDiscard)
			}
			tc := all[len(all)-1].GetTurnCompleted()
			if len(tc.GetMessages()) != 1 || tc.GetMessages()[0].GetParts()[0].GetText() != tt.wantReply {
				t.Errorf("completed = %v, want one reply %q", tc, tt.wantReply)
			}
			reqs := p.requests()
			if len(reqs) != 2 {
				t.Fatalf("model calls = %d, want 2", len(reqs))
			}
			msgs := reqs[1].Messages
			if len(msgs) < len(tt.wantTail) {
				t.Fatalf("second call's messages = %v", msgs)
			}
			for i, want := range tt.wantTail {
				got := msgs[len(msgs)-len(tt.wantTail)+i]
				if got.Role != want.Role || len(got.Parts) != 1 || got.Parts[0].Text != want.Parts[0].Text {
					t.Errorf("second call's message %d from the end = %+v, want %+v", len(tt.wantTail)-i, got, want)
				}
			}
			log, _ := watch(t, t.Context(), rp.b.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
			sameEvents(t, "log", log, all)
		})
	}
}

// TestTakeoverBounded: a turn whose owners keep dying mid-reply is taken
// over three times, each continuing it; the fourth replica that claims it
// ends it at once with a retryable UNAVAILABLE error instead of calling
// the model again.
func TestTakeoverBounded(t *testing.T) {
	t.Parallel()
	type replica = testServer
	var replicas []*replica
	calls := make(chan *replica, 16) // the replica of each model call
	replicas = startReplicas(t, 5, func(i int) *runtime.Runner {
		p := &recorded{script: func(ctx context.Context, _ int) iter.Seq2[llm.Chunk, error] {
			calls <- replicas[i]
			return chunks(ctx, true, textChunk("more "))
		}}
		return cutRunner(t, p, runtime.StreamCutRestart)
	}, detachAfter(30*time.Second))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stream, err := replicas[0].client.RunTurn(ctx, hello())
	if err != nil {
		t.Fatal(err)
	}
	// owner waits for the next model call and returns its replica.
	owner := func() *replica {
		t.Helper()
		select {
		case r := <-calls:
			return r
		case <-time.After(20 * time.Second):
			t.Fatal("no model call")
			return nil
		}
	}
	first := owner()
	if _, err := stream.Recv(); err != nil { // the turn is under way
		t.Fatal(err)
	}
	cancel()
	// stored waits until the log holds the reply's text of n model calls:
	// their owner dies only then.
	dead := map[*replica]bool{}
	stored := func(n int) {
		t.Helper()
		var live *replica
		for _, r := range replicas {
			if !dead[r] {
				live = r
			}
		}
		// A watch that ends before (the run has no owner yet) is made
		// again.
		eventually(t, fmt.Sprintf("the log holds the text of %d replies", n), func() bool {
			wctx, wcancel := context.WithTimeout(t.Context(), waitBound)
			defer wcancel()
			w, err := live.client.WatchTurn(wctx, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
			if err != nil {
				t.Fatal(err)
			}
			for texts := 0; texts < n; {
				r, err := w.Recv()
				if err != nil {
					return false
				}
				if r.GetEvent().GetTextDelta() != nil {
					texts++
				}
			}
			return true
		})
	}
	o := first
	for i := range 4 {
		stored(i + 1)
		dead[o] = true
		o.store.Close()
		if i < 3 {
			if o = owner(); dead[o] {
				t.Fatal("a dead replica called the model")
			}
		}
	}
	var live *replica
	for _, r := range replicas {
		if !dead[r] {
			live = r
		}
	}
	// The watch follows the turn to its end once the last replica took
	// it over, and is made again while the run has no owner.
	var evs []*turnstilev1.AgentEvent
	eventually(t, "the turn ends", func() bool {
		wctx, wcancel := context.WithTimeout(t.Context(), waitBound)
		defer wcancel()
		var st *status.Status
		evs, st = watch(t, wctx, live.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
		if len(evs) == 0 || evs[len(evs)-1].GetError() == nil {
			return false
		}
		if st.Code() != codes.Unavailable {
			t.Errorf("watch status %v, want UNAVAILABLE", st)
		}
		return true
	})
	want := "TurnStarted LlmCallStarted TextDelta Retry LlmCallStarted TextDelta Retry LlmCallStarted TextDelta Retry LlmCallStarted TextDelta Error"
	if got := wiretest.Names(evs); got != want {
		t.Fatalf("events:\n got %s\nwant %s", got, want)
	}
	e := evs[len(evs)-1].GetError()
	if e.GetCode() != turnstilev1.ErrorCode_ERROR_CODE_UNAVAILABLE || !e.GetRetryable() || e.GetMessage() != fmt.Sprintf("the turn was taken over %d times (at most %d): the servers running it kept going away; run it again", 4, 3) {
		t.Errorf("error event = %v", e)
	}
	select {
	case <-calls:
		t.Error("a model call after the fourth takeover")
	default:
	}
}
