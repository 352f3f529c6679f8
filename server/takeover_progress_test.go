package server_test

import (
	"context"
	"iter"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

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
