package runtime_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// TestCutCallEstimate: a call that ends with no usage reported after its
// reply began, or cut by the watchdog or the caller's deadline, carries an
// estimate of its prompt and of what it streamed of its reply (4000 bytes: 1000 tokens, 0.003 USD at 3 USD a
// million input tokens) in LLMCallFinished.Estimated and the turn's
// TurnError.Estimated, never in the usage the turn reports; a call that
// reported usage, or that the provider refused before answering, has none.
func TestCutCallEstimate(t *testing.T) {
	est := llm.Usage{InputTokens: 1000, Cost: llm.Cost{Currency: "USD", Nanos: 3_000_000, Priced: true}}
	reported := llm.Usage{InputTokens: 7, OutputTokens: 2}
	ok := fake.Reply{Chunks: append(fake.Text("ok"), llm.Chunk{Kind: llm.ChunkUsage, Usage: reported})}
	text := fake.Text("Hel")[:1] // a text delta, no stop
	tests := []struct {
		name    string
		replies []fake.Reply
		// deadline is the turn's; zero: none.
		deadline time.Duration
		// calls are the Estimated of each LLMCallFinished, in order.
		calls []llm.Usage
		// estimated is the turn's TurnError.Estimated, when it fails.
		estimated llm.Usage
		fails     bool
	}{
		{name: "idle timeout after a delta", replies: []fake.Reply{{Chunks: text, Hang: true}, ok}, calls: []llm.Usage{est, {}}},
		{name: "first-token timeout", replies: []fake.Reply{{Hang: true}, ok}, calls: []llm.Usage{est, {}}},
		{name: "stream error after a delta", replies: []fake.Reply{{Chunks: text, Err: providerErr(llm.KindServerError, 0)}, ok}, calls: []llm.Usage{est, {}}},
		{name: "usage reported, then an error", replies: []fake.Reply{{Chunks: append(text, llm.Chunk{Kind: llm.ChunkUsage, Usage: reported}), Err: providerErr(llm.KindServerError, 0)}, ok},
			calls: []llm.Usage{{}, {}}},
		// A server that ignores include_usage: the prompt and the reply's
		// 8 bytes (2 tokens at 15 USD a million: 0.00003 USD).
		{name: "completed with no usage reported", replies: []fake.Reply{{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "Hello, w"}, {Kind: llm.ChunkStop, Stop: llm.StopEndTurn}}}},
			calls: []llm.Usage{{InputTokens: 1000, OutputTokens: 2, Cost: llm.Cost{Currency: "USD", Nanos: 3_030_000, Priced: true}}}},
		// What streamed before the cut, 40 bytes: 10 output tokens at 15
		// USD a million, 0.00015 USD.
		{name: "stream error after 40 bytes of reply", replies: []fake.Reply{{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: strings.Repeat("w", 40)}}, Err: providerErr(llm.KindServerError, 0)}, ok},
			calls: []llm.Usage{{InputTokens: 1000, OutputTokens: 10, Cost: llm.Cost{Currency: "USD", Nanos: 3_150_000, Priced: true}}, {}}},
		{name: "refused before answering", replies: []fake.Reply{{Err: providerErr(llm.KindInvalidRequest, 0)}}, calls: []llm.Usage{{}}, fails: true},
		{name: "caller's deadline", replies: []fake.Reply{{Chunks: text, Hang: true}}, deadline: 200 * time.Millisecond, estimated: est, fails: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := model("a", fake.NewProvider(tt.replies...))
			m.Price = &llm.Price{Currency: "USD", Input: 3_000_000_000, Output: 15_000_000_000}
			if tt.deadline == 0 {
				m.FirstTokenTimeout, m.IdleTimeout = 50*time.Millisecond, 50*time.Millisecond
			}
			r := newRunner(t, []*runtime.Model{m}, nil)
			ctx := t.Context()
			if tt.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.deadline)
				defer cancel()
			}
			evs, done, terr := run(t, ctx, r, userTurn(strings.Repeat("x", 4000)))
			if (terr != nil) != tt.fails {
				t.Fatalf("turn error %v, want one: %v", terr, tt.fails)
			}
			var calls []llm.Usage
			var sent llm.Usage // the usage the turn reports
			for _, ev := range evs {
				switch p := ev.Payload.(type) {
				case *runtime.LLMCallFinished:
					calls = append(calls, p.Estimated)
					if !p.Estimated.IsZero() && !p.Usage.IsZero() {
						t.Errorf("call %d: usage %+v and an estimate %+v", p.Attempt, p.Usage, p.Estimated)
					}
					sent = sent.Add(p.Usage)
				case *runtime.UsageUpdated:
					if p.Total != sent {
						t.Errorf("UsageUpdated %+v, want the calls' reported usage %+v", p.Total, sent)
					}
				}
			}
			if len(calls) != len(tt.calls) {
				t.Fatalf("%d calls finished, want %d: %s", len(calls), len(tt.calls), describeAll(evs))
			}
			for i := range calls {
				if calls[i] != tt.calls[i] {
					t.Errorf("call %d: estimated %+v, want %+v", i+1, calls[i], tt.calls[i])
				}
			}
			if done != nil && done.Usage != sent {
				t.Errorf("TurnCompleted usage %+v, want the calls' reported usage %+v", done.Usage, sent)
			}
			if terr != nil && (terr.Estimated != tt.estimated || terr.Usage != sent) {
				t.Errorf("TurnError usage %+v estimated %+v, want %+v and %+v", terr.Usage, terr.Estimated, sent, tt.estimated)
			}
		})
	}
}
