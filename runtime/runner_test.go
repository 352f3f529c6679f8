package runtime_test

import (
	"context"
	"errors"
	"iter"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
)

func TestPlainTurn(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: []llm.Chunk{
		{Kind: llm.ChunkThinking, Text: "hmm"},
		{Kind: llm.ChunkThinking, Signature: "sig"},
		{Kind: llm.ChunkText, Text: "Hello"},
		{Kind: llm.ChunkText, Text: ", world"},
		{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 7, OutputTokens: 3, CacheReadTokens: 2}},
		{Kind: llm.ChunkStop, Stop: llm.StopEndTurn},
	}})
	r := newRunner(t, []*runtime.Model{model("m", p)}, nil)
	evs, res, terr := run(t, t.Context(), r, userTurn("hi"))
	if terr != nil {
		t.Fatalf("turn failed: %v", terr)
	}
	want := "start | call m#1 | thinking | text | finished | usage | commit assistant | completed end_turn"
	if got := describeAll(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	if len(res.Messages) != 1 {
		t.Fatalf("messages added = %d, want 1", len(res.Messages))
	}
	m := res.Messages[0]
	if m.Role != llm.RoleAssistant || m.Text() != "Hello, world" || len(m.Parts) != 2 ||
		m.Parts[0].Kind != llm.PartThinking || m.Parts[0].Text != "hmm" || m.Parts[0].Signature != "sig" {
		t.Errorf("committed message = %+v", m)
	}
	if res.Usage != (llm.Usage{InputTokens: 7, OutputTokens: 3, CacheReadTokens: 2, Cost: llm.Cost{Unpriced: true}}) || res.Counters.ModelCalls != 1 {
		t.Errorf("usage %+v counters %+v", res.Usage, res.Counters)
	}
	if evs[0].TurnID != "t1" {
		t.Errorf("turn id = %q", evs[0].TurnID)
	}
}

func TestServerToolTurn(t *testing.T) {
	p := fake.NewProvider(
		fake.Reply{Chunks: fake.Call("c1", "lookup", `{"q":"x"}`)},
		fake.Reply{Chunks: fake.Text("found it")},
	)
	tool := fake.NewTool("lookup", func(_ context.Context, _ llm.ToolCall, progress func(llm.ToolProgress)) (llm.ToolOutput, error) {
		progress(llm.ToolProgress{Message: "searching", Progress: 1, Total: 2})
		return llm.ToolOutput{Content: "42"}, nil
	})
	r := newRunner(t, []*runtime.Model{model("m", p)}, []llm.Tool{tool})
	evs, res, terr := run(t, t.Context(), r, userTurn("look it up"))
	if terr != nil {
		t.Fatal(terr)
	}
	want := "start | call m#1 | tooldelta | finished | usage | commit assistant | tool lookup | progress | tooldone lookup | commit tool | call m#1 | text | finished | usage | commit assistant | completed end_turn"
	if got := describeAll(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	if len(res.Messages) != 3 || res.Counters.ToolCalls != 1 || res.Counters.ModelCalls != 2 {
		t.Fatalf("result %+v", res)
	}
	second := p.Requests()[1]
	last := second.Messages[len(second.Messages)-1]
	if last.Role != llm.RoleTool || last.Parts[0].ToolResult.Content != "42" || last.Parts[0].ToolResult.CallID != "c1" {
		t.Errorf("second call's last message = %+v", last)
	}
	if n := len(second.Tools); n != 1 || second.Tools[0].Name != "lookup" {
		t.Errorf("tools offered = %+v", second.Tools)
	}
}

func TestClientToolEndsTurn(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: fake.Call("c9", "ask_user", `{}`)})
	r := newRunner(t, []*runtime.Model{model("m", p)}, nil)
	req := userTurn("ask me")
	req.ClientTools = []llm.ToolSpec{{Name: "ask_user"}}
	evs, res, terr := run(t, t.Context(), r, req)
	if terr != nil {
		t.Fatal(terr)
	}
	want := "start | call m#1 | tooldelta | finished | usage | commit assistant | completed tool_calls_required"
	if got := describeAll(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	if calls := res.Messages[0].ToolCalls(); len(calls) != 1 || calls[0].ID != "c9" {
		t.Errorf("pending calls = %+v", calls)
	}
}

func TestMixedToolsRunServerSideFirst(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: []llm.Chunk{
		{Kind: llm.ChunkToolCallStart, Index: 0, CallID: "s", Name: "lookup"},
		{Kind: llm.ChunkToolCallEnd, Index: 0},
		{Kind: llm.ChunkToolCallStart, Index: 1, CallID: "c", Name: "ask_user"},
		{Kind: llm.ChunkToolCallEnd, Index: 1},
		{Kind: llm.ChunkStop, Stop: llm.StopToolUse},
	}})
	tool := fake.NewTool("lookup", nil)
	r := newRunner(t, []*runtime.Model{model("m", p)}, []llm.Tool{tool})
	req := userTurn("both")
	req.ClientTools = []llm.ToolSpec{{Name: "ask_user"}}
	evs, res, terr := run(t, t.Context(), r, req)
	if terr != nil {
		t.Fatal(terr)
	}
	want := "start | call m#1 | tooldelta | finished | commit assistant | tool lookup | tooldone lookup | commit tool | completed tool_calls_required"
	if got := describeAll(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	if len(res.Messages) != 2 || len(tool.Calls()) != 1 {
		t.Errorf("messages %d, tool calls %d", len(res.Messages), len(tool.Calls()))
	}
}

func TestToolFailuresGoBackToTheModel(t *testing.T) {
	p := fake.NewProvider(
		fake.Reply{Chunks: []llm.Chunk{
			{Kind: llm.ChunkToolCallStart, Index: 0, CallID: "a", Name: "nope"},
			{Kind: llm.ChunkToolCallEnd, Index: 0},
			{Kind: llm.ChunkToolCallStart, Index: 1, CallID: "b", Name: "broken"},
			{Kind: llm.ChunkToolCallArgs, Index: 1, Text: `{"x":`},
			{Kind: llm.ChunkToolCallEnd, Index: 1},
			{Kind: llm.ChunkToolCallStart, Index: 2, CallID: "c", Name: "broken"},
			{Kind: llm.ChunkToolCallArgs, Index: 2, Text: `{}`},
			{Kind: llm.ChunkToolCallEnd, Index: 2},
			{Kind: llm.ChunkStop, Stop: llm.StopToolUse},
		}},
		fake.Reply{Chunks: fake.Text("sorry")},
	)
	broken := fake.NewTool("broken", func(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error) {
		return llm.ToolOutput{}, errors.New("disk on fire")
	})
	r := newRunner(t, []*runtime.Model{model("m", p)}, []llm.Tool{broken})
	_, res, terr := run(t, t.Context(), r, userTurn("go"))
	if terr != nil {
		t.Fatal(terr)
	}
	results := res.Messages[1].Parts
	want := []string{
		`unknown tool "nope"; available tools: broken`,
		`the arguments of tool "broken" are not a valid JSON object; call it again with a JSON object`,
		`tool "broken" failed: disk on fire`,
	}
	for i, w := range want {
		if got := results[i].ToolResult; got.Content != w || !got.IsError {
			t.Errorf("result %d = %+v, want error %q", i, got, w)
		}
	}
	if n := len(broken.Calls()); n != 1 {
		t.Errorf("broken ran %d times, want 1 (malformed arguments must not run it)", n)
	}
	if res.Counters.ToolErrors != 3 {
		t.Errorf("tool errors = %d", res.Counters.ToolErrors)
	}
}

func TestToolBreakerTrips(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: fake.Call("", "flaky", `{}`)})
	flaky := fake.NewTool("flaky", func(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error) {
		return llm.ToolOutput{IsError: true, Content: "nope"}, nil
	})
	r := newRunner(t, []*runtime.Model{model("m", p)}, []llm.Tool{flaky}, withLimits(func(l *runtime.Limits) { l.MaxModelCalls = 5 }))
	_, res, terr := run(t, t.Context(), r, userTurn("loop"))
	if terr != nil {
		t.Fatal(terr)
	}
	if res.Reason != runtime.EndMaxModelCalls {
		t.Errorf("reason = %v", res.Reason)
	}
	if n := len(flaky.Calls()); n != 3 {
		t.Errorf("flaky ran %d times, want 3 before the breaker opened", n)
	}
	last := res.Messages[len(res.Messages)-1].Parts[0].ToolResult.Content
	if !strings.Contains(last, "disabled for the rest of this turn after 3 consecutive failures") {
		t.Errorf("last result = %q", last)
	}
}

func TestToolTimeoutAndParallelism(t *testing.T) {
	p := fake.NewProvider(
		fake.Reply{Chunks: []llm.Chunk{
			{Kind: llm.ChunkToolCallStart, Index: 0, CallID: "a", Name: "slow"},
			{Kind: llm.ChunkToolCallEnd, Index: 0},
			{Kind: llm.ChunkToolCallStart, Index: 1, CallID: "b", Name: "slow"},
			{Kind: llm.ChunkToolCallEnd, Index: 1},
			{Kind: llm.ChunkStop, Stop: llm.StopToolUse},
		}},
		fake.Reply{Chunks: fake.Text("done")},
	)
	var running, peak atomic.Int32
	slow := fake.NewTool("slow", func(ctx context.Context, _ llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-ctx.Done()
		return llm.ToolOutput{}, ctx.Err()
	})
	r := newRunner(t, []*runtime.Model{model("m", p)}, []llm.Tool{slow}, withLimits(func(l *runtime.Limits) { l.ToolTimeout = 20 * time.Millisecond }))
	_, res, terr := run(t, t.Context(), r, userTurn("go"))
	if terr != nil {
		t.Fatal(terr)
	}
	for _, part := range res.Messages[1].Parts {
		if got := part.ToolResult.Content; got != `tool "slow" timed out after 20ms` {
			t.Errorf("result = %q", got)
		}
	}
	if peak.Load() != 2 {
		t.Errorf("peak concurrency = %d, want 2", peak.Load())
	}
}

func TestToolPanicEndsTurnInternal(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: fake.Call("c1", "boom", `{}`)})
	boom := fake.NewTool("boom", func(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error) {
		panic("kaboom")
	})
	r := newRunner(t, []*runtime.Model{model("m", p)}, []llm.Tool{boom})
	evs, _, terr := run(t, t.Context(), r, userTurn("go"))
	if terr == nil || terr.Kind != llm.KindInternal || *terr.Retryable {
		t.Fatalf("error = %+v", terr)
	}
	want := "start | call m#1 | tooldelta | finished | usage | commit assistant | tool boom | error INTERNAL retryable=false"
	if got := describeAll(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	if strings.Contains(terr.Message, "kaboom") {
		t.Errorf("panic value leaked to the client: %q", terr.Message)
	}
}

// TestClassMatrix runs every failure class with and without a fallback and
// asserts the exact event sequence, retryability and what was committed.
func TestClassMatrix(t *testing.T) {
	const (
		retries  = "failed %[1]s | retry 2/3 %[1]s | call a#2 | failed %[1]s | retry 3/3 %[1]s | call a#3 | failed %[1]s"
		fellBack = " | fallback a>b %[1]s | call b#1 | text | finished | usage | commit assistant | completed end_turn"
	)
	transient := func(k string) (string, string) {
		noFB := sprintf("start | call a#1 | "+retries+" | error %[1]s retryable=true", k)
		withFB := sprintf("start | call a#1 | "+retries+fellBack, k)
		return noFB, withFB
	}
	final := func(k string, movesOn bool) (string, string) {
		noFB := sprintf("start | call a#1 | failed %[1]s | error %[1]s retryable=false", k)
		if !movesOn {
			return noFB, noFB
		}
		return noFB, sprintf("start | call a#1 | failed %[1]s"+fellBack, k)
	}
	type row struct {
		kind         llm.Kind
		noFB, withFB string
	}
	var rows []row
	for _, k := range []llm.Kind{llm.KindOverloaded, llm.KindServerError, llm.KindTimeout, llm.KindNetwork} {
		a, b := transient(k.String())
		rows = append(rows, row{k, a, b})
	}
	for _, k := range []llm.Kind{llm.KindQuotaExhausted, llm.KindAuth, llm.KindNotFound} {
		a, b := final(k.String(), true)
		rows = append(rows, row{k, a, b})
	}
	for _, k := range []llm.Kind{llm.KindInvalidRequest, llm.KindContentFiltered, llm.KindInternal, llm.KindContextOverflow} {
		a, b := final(k.String(), false)
		rows = append(rows, row{k, a, b})
	}
	rl := llm.KindRateLimited.String()
	rows = append(rows, row{llm.KindRateLimited,
		sprintf("start | call a#1 | "+retries+" | error %[1]s retryable=true", rl),
		sprintf("start | call a#1 | failed %[1]s"+fellBack, rl)})

	for _, tt := range rows {
		for _, withFB := range []bool{false, true} {
			name := tt.kind.String()
			want := tt.noFB
			if withFB {
				name += "/fallback"
				want = tt.withFB
			}
			t.Run(name, func(t *testing.T) {
				primary := fake.NewProvider(fake.Reply{Err: providerErr(tt.kind, 2*time.Millisecond)})
				models := []*runtime.Model{model("a", primary)}
				if withFB {
					models[0].Fallbacks = []string{"b"}
					models = append(models, model("b", fake.NewProvider(fake.Reply{Chunks: fake.Text("ok")})))
				}
				r := newRunner(t, models, nil)
				evs, res, terr := run(t, t.Context(), r, userTurn("hi"))
				if got := describeAll(evs); got != want {
					t.Errorf("events:\n got %s\nwant %s", got, want)
				}
				if terr != nil {
					if wantRetry := policy.RuleFor(tt.kind).Transient; *terr.Retryable != wantRetry {
						t.Errorf("retryable = %v, want %v", *terr.Retryable, wantRetry)
					}
					if len(terr.Attempts) == 0 || terr.Attempts[0].Model != "a" || terr.Attempts[0].LastKind != tt.kind {
						t.Errorf("attempts = %+v", terr.Attempts)
					}
				} else if len(res.Messages) != 1 || res.Messages[0].Text() != "ok" {
					t.Errorf("committed = %+v", res.Messages)
				}
			})
		}
	}
}

func TestStreamInterruptedDiscardsPartial(t *testing.T) {
	// The first attempt streams text and the start of a tool call, then the
	// connection drops: consumers must drop it, it is never committed, and
	// the tool does not run from it.
	p := fake.NewProvider(
		fake.Reply{
			Chunks: []llm.Chunk{
				{Kind: llm.ChunkText, Text: "Let me "},
				{Kind: llm.ChunkToolCallStart, Index: 0, CallID: "x", Name: "lookup"},
				{Kind: llm.ChunkToolCallArgs, Index: 0, Text: `{"q":`},
			},
			Err: &llm.Error{Kind: llm.KindNetwork, Message: "connection reset"},
		},
		fake.Reply{Chunks: fake.Text("All good.")},
	)
	tool := fake.NewTool("lookup", nil)
	r := newRunner(t, []*runtime.Model{model("m", p)}, []llm.Tool{tool})
	evs, res, terr := run(t, t.Context(), r, userTurn("hi"))
	if terr != nil {
		t.Fatal(terr)
	}
	want := "start | call m#1 | text | tooldelta | failed STREAM_INTERRUPTED | retry 2/3 STREAM_INTERRUPTED discard | call m#2 | text | finished | usage | commit assistant | completed end_turn"
	if got := describeAll(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	var retry *runtime.Retry
	for _, ev := range evs {
		if r, ok := ev.Payload.(*runtime.Retry); ok {
			retry = r
		}
	}
	if retry.DiscardFromSeq != 3 {
		t.Errorf("discard from seq %d, want 3 (the first text delta)", retry.DiscardFromSeq)
	}
	if len(res.Messages) != 1 || res.Messages[0].Text() != "All good." || len(tool.Calls()) != 0 {
		t.Errorf("committed %+v, tool calls %d", res.Messages, len(tool.Calls()))
	}
}

func TestStreamEndingWithoutStopIsInterrupted(t *testing.T) {
	p := fake.NewProvider(
		fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "half"}}},
		fake.Reply{Chunks: fake.Text("whole")},
	)
	r := newRunner(t, []*runtime.Model{model("m", p)}, nil)
	evs, _, terr := run(t, t.Context(), r, userTurn("hi"))
	if terr != nil {
		t.Fatal(terr)
	}
	want := "start | call m#1 | text | failed STREAM_INTERRUPTED | retry 2/3 STREAM_INTERRUPTED discard | call m#2 | text | finished | usage | commit assistant | completed end_turn"
	if got := describeAll(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
}

func TestRetryAfterHonouredAndCapped(t *testing.T) {
	tests := []struct {
		name       string
		retryAfter time.Duration
		want       string
	}{
		{"honoured", 30 * time.Millisecond, "start | call a#1 | failed RATE_LIMITED | retry 2/3 RATE_LIMITED | call a#2 | text | finished | usage | commit assistant | completed end_turn"},
		{"above cap", time.Second, "start | call a#1 | failed RATE_LIMITED | error RATE_LIMITED retryable=true"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := fake.NewProvider(fake.Reply{Err: providerErr(llm.KindRateLimited, tt.retryAfter)}, fake.Reply{Chunks: fake.Text("ok")})
			r := newRunner(t, []*runtime.Model{model("a", p)}, nil)
			start := time.Now()
			evs, _, terr := run(t, t.Context(), r, userTurn("hi"))
			if got := describeAll(evs); got != tt.want {
				t.Errorf("events:\n got %s\nwant %s", got, tt.want)
			}
			for _, ev := range evs {
				if r, ok := ev.Payload.(*runtime.Retry); ok && r.Delay != tt.retryAfter {
					t.Errorf("retry delay = %v, want %v", r.Delay, tt.retryAfter)
				}
			}
			if terr == nil && time.Since(start) < tt.retryAfter {
				t.Errorf("retried after %v, before Retry-After %v", time.Since(start), tt.retryAfter)
			}
			if terr != nil && terr.RetryAfter != tt.retryAfter {
				t.Errorf("error retry-after = %v, want the provider's %v", terr.RetryAfter, tt.retryAfter)
			}
		})
	}
}

func TestGrowingRetryAfterHonouredEachAttempt(t *testing.T) {
	p := fake.NewProvider(
		fake.Reply{Err: providerErr(llm.KindRateLimited, 5*time.Millisecond)},
		fake.Reply{Err: providerErr(llm.KindRateLimited, 20*time.Millisecond)},
		fake.Reply{Chunks: fake.Text("ok")},
	)
	r := newRunner(t, []*runtime.Model{model("a", p)}, nil)
	evs, _, terr := run(t, t.Context(), r, userTurn("hi"))
	if terr != nil {
		t.Fatal(terr)
	}
	var delays []time.Duration
	for _, ev := range evs {
		if r, ok := ev.Payload.(*runtime.Retry); ok {
			delays = append(delays, r.Delay)
		}
	}
	if len(delays) != 2 || delays[0] != 5*time.Millisecond || delays[1] != 20*time.Millisecond {
		t.Errorf("delays = %v, want [5ms 20ms]", delays)
	}
}

func TestCooldownSkipsModelThenProbes(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	primary := fake.NewProvider(
		fake.Reply{Err: providerErr(llm.KindRateLimited, 10*time.Second)},
		fake.Reply{Chunks: fake.Text("primary is back")},
	)
	backup := fake.NewProvider(fake.Reply{Chunks: fake.Text("backup")})
	r := newRunner(t, []*runtime.Model{model("a", primary, "b"), model("b", backup)}, nil, runtime.WithClock(clock))

	// Turn 1: rate limited on a, falls back to b; a cools down for 10s.
	evs, _, _ := run(t, t.Context(), r, userTurn("one"))
	if got, want := describeAll(evs), "start | call a#1 | failed RATE_LIMITED | fallback a>b RATE_LIMITED | call b#1 | text | finished | usage | commit assistant | completed end_turn"; got != want {
		t.Errorf("turn 1:\n got %s\nwant %s", got, want)
	}
	// Turn 2, 5s later: starts on b at once.
	now.Add(int64(5 * time.Second))
	evs, _, _ = run(t, t.Context(), r, userTurn("two"))
	if got, want := describeAll(evs), "start | call b#1 | text | finished | usage | commit assistant | completed end_turn"; got != want {
		t.Errorf("turn 2:\n got %s\nwant %s", got, want)
	}
	// Turn 3, after the cooldown: probes a, which answers.
	now.Add(int64(6 * time.Second))
	evs, _, _ = run(t, t.Context(), r, userTurn("three"))
	if got, want := describeAll(evs), "start | call a#1 | text | finished | usage | commit assistant | completed end_turn"; got != want {
		t.Errorf("turn 3:\n got %s\nwant %s", got, want)
	}
	if primary.Calls() != 2 || backup.Calls() != 2 {
		t.Errorf("calls: primary %d backup %d, want 2 and 2", primary.Calls(), backup.Calls())
	}
}

func TestHalfOpenAdmitsOneProbe(t *testing.T) {
	var now atomic.Int64
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	release := make(chan struct{})
	primary := &gatedProvider{gate: release, first: providerErr(llm.KindAuth, 0)}
	backup := fake.NewProvider(fake.Reply{Chunks: fake.Text("backup")})
	r := newRunner(t, []*runtime.Model{model("a", primary, "b"), model("b", backup)}, nil, runtime.WithClock(clock))
	run(t, t.Context(), r, userTurn("trip")) // auth failure: a cools down for a minute
	now.Add(int64(2 * time.Minute))

	// The probe blocks in a; a concurrent turn must skip a meanwhile.
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(t, context.Background(), r, userTurn("probe"))
	}()
	primary.waitBlocked()
	evs, _, _ := run(t, t.Context(), r, userTurn("other"))
	if got, want := describeAll(evs), "start | call b#1 | text | finished | usage | commit assistant | completed end_turn"; got != want {
		t.Errorf("turn during probe:\n got %s\nwant %s", got, want)
	}
	close(release)
	<-done
	evs, _, _ = run(t, t.Context(), r, userTurn("after"))
	if got := describe(evs[1]); got != "call a#1" {
		t.Errorf("after a successful probe, turns start on %s", got)
	}
}

// gatedProvider fails its first call with first, then blocks each later
// call until gate closes and answers.
type gatedProvider struct {
	gate  chan struct{}
	first error
	calls atomic.Int32
}

func (g *gatedProvider) waitBlocked() {
	for g.calls.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
}

func (g *gatedProvider) Stream(ctx context.Context, _ *llm.Request) iter.Seq2[llm.Chunk, error] {
	n := g.calls.Add(1)
	return func(yield func(llm.Chunk, error) bool) {
		if n == 1 {
			yield(llm.Chunk{}, g.first)
			return
		}
		select {
		case <-g.gate:
		case <-ctx.Done():
			yield(llm.Chunk{}, ctx.Err())
			return
		}
		for _, c := range fake.Text("a is back") {
			if !yield(c, nil) {
				return
			}
		}
	}
}

func TestBudgetStopsRetryStorm(t *testing.T) {
	// 200 concurrent turns hit a dead primary: the shared budget lets only
	// a handful retry; the rest fail over at once, and later turns skip the
	// primary entirely while it cools down.
	dead := fake.NewProvider(fake.Reply{Err: providerErr(llm.KindOverloaded, 0)})
	backup := fake.NewProvider(fake.Reply{Chunks: fake.Text("ok")})
	r := newRunner(t, []*runtime.Model{model("a", dead, "b"), model("b", backup)}, nil)
	const turns = 200
	var wg sync.WaitGroup
	var failed atomic.Int32
	for range turns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := r.Run(t.Context(), userTurn("hi"), runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil })); err != nil {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d turns failed; all should have fallen back", failed.Load())
	}
	// Without a budget: 3 attempts per turn = 600 calls. With it: at most
	// one call per turn that started before the cooldown, plus the few
	// retries the budget allowed (10 tokens: at most 10 retries wait for
	// an answer at once, and each that fails keeps its token).
	calls := dead.Calls()
	t.Logf("calls to the dead primary: %d for %d turns", calls, turns)
	if calls > turns+10 {
		t.Errorf("dead primary got %d calls for %d turns: retry storm", calls, turns)
	}
	before := dead.Calls()
	for range 20 {
		run(t, t.Context(), r, userTurn("later"))
	}
	if dead.Calls() != before {
		t.Errorf("turns after the storm still called the cooling primary %d times", dead.Calls()-before)
	}
}

func TestDeadlineCutsBackoffShort(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Err: providerErr(llm.KindOverloaded, 0)})
	m := model("a", p)
	m.Retry.InitialBackoff, m.Retry.MaxBackoff = time.Second, time.Second
	r := newRunner(t, []*runtime.Model{m}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	evs, _, terr := run(t, ctx, r, userTurn("hi"))
	if elapsed := time.Since(start); elapsed > 150*time.Millisecond {
		t.Errorf("turn took %v: it waited into a backoff that outlasts the deadline", elapsed)
	}
	if got, want := describeAll(evs), "start | call a#1 | failed OVERLOADED | error OVERLOADED retryable=true"; got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	if terr.RetryAfter != time.Second {
		t.Errorf("retry after = %v, want the 1s backoff", terr.RetryAfter)
	}
}

func TestCancelDuringBackoffReturnsFast(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Err: providerErr(llm.KindServerError, 0)})
	m := model("a", p)
	m.Retry.InitialBackoff, m.Retry.MaxBackoff = 10*time.Second, 10*time.Second
	r := newRunner(t, []*runtime.Model{m}, nil)
	ctx, cancel := context.WithCancel(t.Context())
	rec := &recorder{}
	var cancelled atomic.Int64
	sink := runtime.SinkFunc(func(ctx context.Context, ev runtime.Event) error {
		if _, ok := ev.Payload.(*runtime.Retry); ok {
			time.AfterFunc(5*time.Millisecond, func() {
				cancelled.Store(time.Now().UnixNano())
				cancel()
			})
		}
		return rec.Emit(ctx, ev)
	})
	_, err := r.Run(ctx, userTurn("hi"), sink)
	if took := time.Since(time.Unix(0, cancelled.Load())); took > 50*time.Millisecond {
		t.Errorf("Run returned %v after the cancel, want under 50ms (the backoff was 10s)", took)
	}
	var te *runtime.TurnError
	if !errors.As(err, &te) || te.Kind != llm.KindCancelled || *te.Retryable {
		t.Fatalf("err = %v", err)
	}
	checkSequence(t, rec.events)
	if got, want := describeAll(rec.events), "start | call a#1 | failed SERVER_ERROR | retry 2/3 SERVER_ERROR | commit user | error CANCELLED retryable=false"; got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
}

func TestCancelMidStreamStopsProvider(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "thinking..."}}, Hang: true})
	r := newRunner(t, []*runtime.Model{model("a", p)}, nil)
	ctx, cancel := context.WithCancel(t.Context())
	rec := &recorder{}
	sink := runtime.SinkFunc(func(ctx context.Context, ev runtime.Event) error {
		if _, ok := ev.Payload.(*runtime.TextDelta); ok {
			cancel()
		}
		return rec.Emit(ctx, ev)
	})
	_, err := r.Run(ctx, userTurn("hi"), sink)
	if llm.KindOf(err) != llm.KindCancelled && !errors.As(err, new(*runtime.TurnError)) {
		t.Fatalf("err = %v", err)
	}
	if got, want := describeAll(rec.events), "start | call a#1 | text | commit assistant | commit user | error CANCELLED retryable=false"; got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
}

func TestIdleAndFirstTokenTimeouts(t *testing.T) {
	tests := []struct {
		name   string
		chunks []llm.Chunk
		want   string
	}{
		{"first token", nil, "start | call a#1 | failed TIMEOUT | retry 2/3 TIMEOUT | call a#2 | text | finished | usage | commit assistant | completed end_turn"},
		{"idle gap", []llm.Chunk{{Kind: llm.ChunkText, Text: "so"}}, "start | call a#1 | text | failed TIMEOUT | retry 2/3 TIMEOUT discard | call a#2 | text | finished | usage | commit assistant | completed end_turn"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := fake.NewProvider(fake.Reply{Chunks: tt.chunks, Hang: true}, fake.Reply{Chunks: fake.Text("ok")})
			m := model("a", p)
			m.FirstTokenTimeout, m.IdleTimeout = 20*time.Millisecond, 20*time.Millisecond
			r := newRunner(t, []*runtime.Model{m}, nil)
			evs, _, terr := run(t, t.Context(), r, userTurn("hi"))
			if terr != nil {
				t.Fatal(terr)
			}
			if got := describeAll(evs); got != tt.want {
				t.Errorf("events:\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestMaxTokensContinuation: a reply cut by the output limit is continued
// inside the turn — from an assistant prefill where the provider has it,
// else with a continuation prompt the client never sees — and committed
// once, as one assistant message. An incomplete tool call is dropped.
func TestMaxTokensContinuation(t *testing.T) {
	tests := []struct {
		name    string
		prefill bool
		first   string
		// tail is what the second request adds after the user message.
		tail []llm.Message
	}{
		{"prompt", false, "The answer is", []llm.Message{
			{Role: llm.RoleAssistant, Parts: []llm.Part{llm.TextPart("The answer is")}},
			{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(runtime.ContinuationPrompt)}},
		}},
		{"prefill", true, "The answer is", []llm.Message{
			{Role: llm.RoleAssistant, Parts: []llm.Part{llm.TextPart("The answer is")}},
		}},
		{"prefill without trailing space", true, "The answer is ", []llm.Message{
			{Role: llm.RoleAssistant, Parts: []llm.Part{llm.TextPart("The answer is")}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := fake.NewProvider(
				fake.Reply{Chunks: []llm.Chunk{
					{Kind: llm.ChunkText, Text: tt.first},
					{Kind: llm.ChunkToolCallStart, Index: 0, CallID: "x", Name: "lookup"},
					{Kind: llm.ChunkToolCallArgs, Index: 0, Text: `{"q":`},
					{Kind: llm.ChunkStop, Stop: llm.StopMaxTokens},
				}},
				fake.Reply{Chunks: fake.Text(" 42.")},
			)
			p.Caps.Prefill = tt.prefill
			tool := fake.NewTool("lookup", nil)
			r := newRunner(t, []*runtime.Model{model("a", p)}, []llm.Tool{tool})
			evs, res, terr := run(t, t.Context(), r, userTurn("hi"))
			if terr != nil {
				t.Fatal(terr)
			}
			want := "start | call a#1 | text | tooldelta | finished | call a#1 | text | finished | usage | commit assistant | completed end_turn"
			if got := describeAll(evs); got != want {
				t.Errorf("events:\n got %s\nwant %s", got, want)
			}
			if len(res.Messages) != 1 || len(res.Messages[0].Parts) != 1 || res.Messages[0].Text() != "The answer is 42." {
				t.Errorf("messages = %+v, want one assistant message %q", res.Messages, "The answer is 42.")
			}
			if got := shownText(evs); got != "The answer is 42." {
				t.Errorf("text shown = %q", got)
			}
			if diff := cmp.Diff(tt.tail, p.Requests()[1].Messages[1:]); diff != "" {
				t.Errorf("continuation request (-want +got):\n%s", diff)
			}
			if len(tool.Calls()) != 0 {
				t.Error("an incomplete tool call ran")
			}
		})
	}
}

// TestMaxTokensContinuationEndsEarly: a turn that fails, or runs out of
// model calls, while it continues a reply cut by the output limit commits
// the reply as far as it got before its last event.
func TestMaxTokensContinuationEndsEarly(t *testing.T) {
	cut := fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "Part one."}, {Kind: llm.ChunkStop, Stop: llm.StopMaxTokens}}}
	t.Run("failure", func(t *testing.T) {
		p := fake.NewProvider(cut, fake.Reply{Err: providerErr(llm.KindAuth, 0)})
		r := newRunner(t, []*runtime.Model{model("a", p)}, nil)
		evs, _, terr := run(t, t.Context(), r, userTurn("hi"))
		want := "start | call a#1 | text | finished | call a#1 | failed AUTH | commit assistant | error AUTH retryable=false"
		if got := describeAll(evs); got != want {
			t.Errorf("events:\n got %s\nwant %s", got, want)
		}
		if terr == nil {
			t.Fatal("the turn did not fail")
		}
	})
	t.Run("max model calls", func(t *testing.T) {
		p := fake.NewProvider(cut)
		r := newRunner(t, []*runtime.Model{model("a", p)}, nil, withLimits(func(l *runtime.Limits) { l.MaxModelCalls = 2 }))
		evs, res, _ := run(t, t.Context(), r, userTurn("hi"))
		want := "start | call a#1 | text | finished | call a#1 | text | finished | commit assistant | completed max_model_calls"
		if got := describeAll(evs); got != want {
			t.Errorf("events:\n got %s\nwant %s", got, want)
		}
		if len(res.Messages) != 1 || res.Messages[0].Text() != "Part one.Part one." {
			t.Errorf("messages = %+v", res.Messages)
		}
	})
}

// shownText returns the text a client shows from evs: every text delta,
// less those a retry or fallback said to discard.
func shownText(evs []runtime.Event) string {
	var deltas []struct {
		seq  uint64
		text string
	}
	for _, ev := range evs {
		var from uint64
		switch p := ev.Payload.(type) {
		case *runtime.TextDelta:
			deltas = append(deltas, struct {
				seq  uint64
				text string
			}{ev.Seq, p.Text})
		case *runtime.Retry:
			from = p.DiscardFromSeq
		case *runtime.Fallback:
			from = p.DiscardFromSeq
		}
		if from != 0 {
			for len(deltas) > 0 && deltas[len(deltas)-1].seq >= from {
				deltas = deltas[:len(deltas)-1]
			}
		}
	}
	var b strings.Builder
	for _, d := range deltas {
		b.WriteString(d.text)
	}
	return b.String()
}

func TestMaxTokensGivesUpAfterLimit(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: []llm.Chunk{
		{Kind: llm.ChunkText, Text: "more"},
		{Kind: llm.ChunkStop, Stop: llm.StopMaxTokens},
	}})
	r := newRunner(t, []*runtime.Model{model("a", p)}, nil, withLimits(func(l *runtime.Limits) { l.MaxContinuations = 2 }))
	_, res, terr := run(t, t.Context(), r, userTurn("hi"))
	if terr != nil {
		t.Fatal(terr)
	}
	if res.Reason != runtime.EndMaxTokens || p.Calls() != 3 {
		t.Errorf("reason %v after %d calls, want max_tokens after 3", res.Reason, p.Calls())
	}
}

func TestRefusalIsAnOutcome(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: []llm.Chunk{
		{Kind: llm.ChunkText, Text: "I can't help with that."},
		{Kind: llm.ChunkStop, Stop: llm.StopRefusal},
	}})
	r := newRunner(t, []*runtime.Model{model("a", p)}, nil)
	_, res, terr := run(t, t.Context(), r, userTurn("hi"))
	if terr != nil || res.Reason != runtime.EndRefusal {
		t.Fatalf("res %+v err %v", res, terr)
	}
}

func TestCompactionThenSuccess(t *testing.T) {
	big := strings.Repeat("x", 10000)
	msgs := []llm.Message{
		{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("first question")}},
		{Role: llm.RoleAssistant, Parts: []llm.Part{{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "1", Name: "read", Arguments: "{}"}}}},
		{Role: llm.RoleTool, Parts: []llm.Part{{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: "1", Content: big}}}},
		{Role: llm.RoleAssistant, Parts: []llm.Part{llm.TextPart("that file is long")}},
		{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("summarise it")}},
	}
	p := fake.NewProvider(fake.Reply{Err: providerErr(llm.KindContextOverflow, 0)}, fake.Reply{Chunks: fake.Text("summary")})
	r := newRunner(t, []*runtime.Model{model("a", p)}, nil)
	evs, res, terr := run(t, t.Context(), r, &runtime.TurnRequest{Messages: msgs})
	if terr != nil {
		t.Fatal(terr)
	}
	want := "start | call a#1 | failed CONTEXT_OVERFLOW | compaction | call a#2 | text | finished | usage | commit assistant | completed end_turn"
	if got := describeAll(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	var c *runtime.Compaction
	for _, ev := range evs {
		if cp, ok := ev.Payload.(*runtime.Compaction); ok {
			c = cp
		}
	}
	if c.BytesAfter >= c.BytesBefore || c.Strategy != "keep_ends" {
		t.Errorf("compaction %+v", c)
	}
	sent := p.Requests()[1].Messages
	if runtime.ConversationSize(sent) != c.BytesAfter || sent[len(sent)-1].Text() != "summarise it" || sent[0].Text() != "first question" {
		t.Errorf("second request = %+v", sent)
	}
	if res.Counters.Compactions != 1 || len(res.Messages) != 1 {
		t.Errorf("result %+v", res)
	}
}

func TestContextOverflowFallsBackToLargerModel(t *testing.T) {
	small := fake.NewProvider(fake.Reply{Err: providerErr(llm.KindContextOverflow, 0)})
	large := fake.NewProvider(fake.Reply{Chunks: fake.Text("fits")})
	a, b := model("small", small, "large"), model("large", large)
	a.ContextWindow, b.ContextWindow = 8000, 200000
	r := newRunner(t, []*runtime.Model{a, b}, nil)
	evs, _, terr := run(t, t.Context(), r, userTurn("hi"))
	if terr != nil {
		t.Fatal(terr)
	}
	want := "start | call small#1 | failed CONTEXT_OVERFLOW | fallback small>large CONTEXT_OVERFLOW | call large#1 | text | finished | usage | commit assistant | completed end_turn"
	if got := describeAll(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
}

func TestFailureAfterCommittedStepsKeepsThem(t *testing.T) {
	// A later model call fails for good: the error still follows every
	// message the turn committed, so a client can resume from them.
	p := fake.NewProvider(
		fake.Reply{Chunks: fake.Call("c1", "lookup", `{}`)},
		fake.Reply{Err: providerErr(llm.KindAuth, 0)},
	)
	r := newRunner(t, []*runtime.Model{model("a", p)}, []llm.Tool{fake.NewTool("lookup", nil)})
	evs, _, terr := run(t, t.Context(), r, userTurn("hi"))
	want := "start | call a#1 | tooldelta | finished | usage | commit assistant | tool lookup | tooldone lookup | commit tool | call a#1 | failed AUTH | error AUTH retryable=false"
	if got := describeAll(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	if terr == nil || len(terr.Attempts) != 1 || terr.Attempts[0].Attempts != 2 {
		t.Errorf("error %+v", terr)
	}
}

func TestMaxModelCallsIncludesRetries(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Err: providerErr(llm.KindServerError, 0)})
	r := newRunner(t, []*runtime.Model{model("a", p)}, nil)
	req := userTurn("hi")
	req.MaxModelCalls = 2
	evs, _, terr := run(t, t.Context(), r, req)
	if p.Calls() != 2 || terr == nil {
		t.Fatalf("calls %d, err %v", p.Calls(), terr)
	}
	if got, want := describeAll(evs), "start | call a#1 | failed SERVER_ERROR | retry 2/3 SERVER_ERROR | call a#2 | failed SERVER_ERROR | error SERVER_ERROR retryable=true"; got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
}

func TestSlowSinkBackpressure(t *testing.T) {
	// Every Emit blocks until the consumer takes the event: the turn waits,
	// nothing is dropped, nothing piles up.
	var chunks []llm.Chunk
	for range 50 {
		chunks = append(chunks, llm.Chunk{Kind: llm.ChunkText, Text: "x"})
	}
	chunks = append(chunks, llm.Chunk{Kind: llm.ChunkStop, Stop: llm.StopEndTurn})
	p := fake.NewProvider(fake.Reply{Chunks: chunks})
	r := newRunner(t, []*runtime.Model{model("a", p)}, nil)
	ch := make(chan runtime.Event)
	go func() {
		defer close(ch)
		_, _ = r.Run(t.Context(), userTurn("hi"), runtime.SinkFunc(func(ctx context.Context, ev runtime.Event) error {
			select {
			case ch <- ev:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}))
	}()
	var got []runtime.Event
	for ev := range ch {
		time.Sleep(100 * time.Microsecond)
		got = append(got, ev)
	}
	checkSequence(t, got)
	if n := len(got); n != 1+1+50+1+1+1 {
		t.Errorf("got %d events", n)
	}
}

func TestEventsIteratorStopsEarly(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "a"}}, Hang: true})
	r := newRunner(t, []*runtime.Model{model("a", p)}, nil)
	n := 0
	for ev := range r.Events(t.Context(), userTurn("hi")) {
		n++
		if _, ok := ev.Payload.(*runtime.TextDelta); ok {
			break
		}
	}
	if n != 3 {
		t.Errorf("saw %d events before break", n)
	}
}

func TestValidate(t *testing.T) {
	r := newRunner(t, []*runtime.Model{model("a", fake.NewProvider(fake.Reply{}))}, []llm.Tool{fake.NewTool("lookup", nil)})
	tests := []struct {
		req   runtime.TurnRequest
		field string
	}{
		{runtime.TurnRequest{Model: "nope"}, "model"},
		{runtime.TurnRequest{ClientTools: []llm.ToolSpec{{Name: "x"}, {Name: "lookup"}}}, "tools[1].name"},
		{runtime.TurnRequest{Model: "a"}, ""},
	}
	for _, tt := range tests {
		err := r.Validate(&tt.req)
		var fe *runtime.FieldError
		if tt.field == "" {
			if err != nil {
				t.Errorf("Validate(%+v) = %v", tt.req, err)
			}
			continue
		}
		if !errors.As(err, &fe) || fe.Field != tt.field {
			t.Errorf("Validate(%+v) = %v, want field %s", tt.req, err, tt.field)
		}
	}
}

func TestAllModelsCoolingStillTry(t *testing.T) {
	// Cooldowns steer turns to healthy models; when every model of the chain
	// is cooling down, a turn still makes its attempt on the one that is back
	// first, rather than failing without trying.
	var now atomic.Int64
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	a := fake.NewProvider(fake.Reply{Err: providerErr(llm.KindQuotaExhausted, 0)}, fake.Reply{Chunks: fake.Text("quota is back")})
	b := fake.NewProvider(fake.Reply{Err: providerErr(llm.KindAuth, 0)})
	ma, mb := model("a", a, "b"), model("b", b)
	mb.Retry.Cooldown = 2 * time.Minute
	r := newRunner(t, []*runtime.Model{ma, mb}, nil, runtime.WithClock(clock))
	evs, _, _ := run(t, t.Context(), r, userTurn("trip both"))
	if got, want := describeAll(evs), "start | call a#1 | failed QUOTA_EXHAUSTED | fallback a>b QUOTA_EXHAUSTED | call b#1 | failed AUTH | error AUTH retryable=false"; got != want {
		t.Errorf("turn 1:\n got %s\nwant %s", got, want)
	}
	now.Add(int64(20 * time.Second))
	evs, _, terr := run(t, t.Context(), r, userTurn("again"))
	if got, want := describeAll(evs), "start | call a#1 | text | finished | usage | commit assistant | completed end_turn"; got != want || terr != nil {
		t.Errorf("turn 2:\n got %s\nwant %s (%v)", got, want, terr)
	}
}
