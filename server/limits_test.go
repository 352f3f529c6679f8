package server_test

import (
	"context"
	"iter"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/server"
)

// hanging returns a runner whose turns stream "..." and hang until
// cancelled.
func hanging(t *testing.T) *fake.Provider {
	t.Helper()
	return fake.NewProvider(fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "..."}}, Hang: true})
}

// holdTurn starts a turn and returns once its first text delta arrived,
// with a function that cancels it and waits for its end.
func holdTurn(t *testing.T, c turnstilev1.AgentServiceClient, ctx context.Context) (release func()) {
	t.Helper()
	return holdRequest(t, c, ctx, hello())
}

// holdRequest is holdTurn with req as the turn's request.
func holdRequest(t *testing.T, c turnstilev1.AgentServiceClient, ctx context.Context, req *turnstilev1.RunTurnRequest) (release func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	started := make(chan struct{})
	done := make(chan struct{})
	var once sync.Once
	go func() {
		defer close(done)
		stream, err := c.RunTurn(ctx, req)
		if err != nil {
			once.Do(func() { close(started) })
			return
		}
		for {
			resp, err := stream.Recv()
			if err != nil {
				once.Do(func() { close(started) })
				return
			}
			if resp.GetEvent().GetTextDelta() != nil {
				once.Do(func() { close(started) })
			}
		}
	}()
	<-started
	return func() { cancel(); <-done }
}

// refusedWith checks st is a refusal by limit, before any event, with
// RetryInfo exactly when retry.
func refusedWith(t *testing.T, evs []*turnstilev1.AgentEvent, st *status.Status, limit string, retry bool) {
	t.Helper()
	if len(evs) != 0 {
		t.Errorf("%d events before the refusal", len(evs))
	}
	var info *errdetails.ErrorInfo
	var ri *errdetails.RetryInfo
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			ri = d
		}
	}
	if st.Code() != codes.ResourceExhausted || info.GetReason() != "LIMIT_EXCEEDED" || info.GetMetadata()["limit"] != limit {
		t.Fatalf("status %v %q, ErrorInfo %v; want RESOURCE_EXHAUSTED LIMIT_EXCEEDED limit=%s", st.Code(), st.Message(), info, limit)
	}
	if (ri != nil) != retry {
		t.Errorf("RetryInfo %v, want one: %v", ri, retry)
	}
	if ri != nil && ri.GetRetryDelay().AsDuration() <= 0 {
		t.Errorf("RetryInfo delay %v", ri.GetRetryDelay().AsDuration())
	}
}

// TestServerTurnCap: beyond max_concurrent_turns a turn is refused at
// once with RetryInfo; once a turn ends, the next runs.
func TestServerTurnCap(t *testing.T) {
	t.Parallel()
	m := newMeter()
	ts := start(t, runner(t, hanging(t)), server.Options{MaxConcurrentTurns: 2, MeterProvider: m})
	first := holdTurn(t, ts.client, t.Context())
	second := holdTurn(t, ts.client, t.Context())
	defer second()
	start := time.Now()
	evs, st := wiretest.Collect(t, t.Context(), ts.client, hello(), nil)
	refusedWith(t, evs, st, "max_concurrent_turns", true)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the refusal took %s", d)
	}
	// Without keys, counted under the client "".
	if n := m.sum(t, "turnstile.turns.refused", attribute.String("turnstile.limit", "max_concurrent_turns"), attribute.String("turnstile.client", "")); n != 1 {
		t.Errorf("turnstile.turns.refused{max_concurrent_turns} = %d, want 1", n)
	}
	first()
	third := holdTurn(t, ts.client, t.Context())
	third()
}

func TestKeyLimits(t *testing.T) {
	t.Parallel()
	one, two, none := 1, 2, 0
	var twenty, zero int64 = 20, 0
	tests := []struct {
		name   string
		limits server.KeyLimits
		// hold keeps a turn running meanwhile.
		hold bool
		// ok is how many turns run before the refusal.
		ok    int
		limit string
		retry bool
	}{
		{name: "concurrent turns", limits: server.KeyLimits{ConcurrentTurns: &one}, hold: true, limit: "concurrent_turns", retry: true},
		{name: "turns per minute", limits: server.KeyLimits{TurnsPerMinute: &two}, ok: 2, limit: "turns_per_minute", retry: true},
		{name: "suspended key", limits: server.KeyLimits{TurnsPerMinute: &none}, limit: "turns_per_minute"},
		// Each turn uses 15 tokens. Its call holds the whole bucket (its
		// prompt and 4096 output tokens, more than 20): the second waits
		// for the bucket to refill.
		{name: "tokens per minute", limits: server.KeyLimits{TokensPerMinute: &twenty}, ok: 1, limit: "tokens_per_minute", retry: true},
		{name: "tokens per day", limits: server.KeyLimits{TokensPerDay: &twenty}, ok: 1, limit: "tokens_per_day", retry: true},
		// Holding its prompt alone (1 token), the second starts and goes
		// into debt.
		{name: "tokens per minute, prompt held", limits: server.KeyLimits{TokensPerMinute: &twenty, ReserveOutputTokens: &zero}, ok: 2, limit: "tokens_per_minute", retry: true},
		{name: "tokens per day, prompt held", limits: server.KeyLimits{TokensPerDay: &twenty, ReserveOutputTokens: &zero}, ok: 2, limit: "tokens_per_day", retry: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := fake.NewProvider(fake.Reply{Chunks: fake.Text("hi")})
			if tt.hold {
				p = hanging(t)
			}
			k := keyed("limited", "tok-limited-0123")
			k.Limits = tt.limits
			other := keyed("other", "tok-other-0123")
			m := newMeter()
			ts := start(t, runner(t, p), server.Options{Keys: []server.Key{k, other}, MeterProvider: m})
			ctx := bearer(t.Context(), "tok-limited-0123")
			if tt.hold {
				defer holdTurn(t, ts.client, ctx)()
			}
			for i := range tt.ok {
				if _, st := wiretest.Collect(t, ctx, ts.client, hello(), nil); st.Code() != codes.OK {
					t.Fatalf("turn %d: %v", i+1, st)
				}
			}
			evs, st := wiretest.Collect(t, ctx, ts.client, hello(), nil)
			refusedWith(t, evs, st, tt.limit, tt.retry)
			// Counted once, under its limit and key, before its status.
			if n := m.sum(t, "turnstile.turns.refused", attribute.String("turnstile.limit", tt.limit), attribute.String("turnstile.client", "limited")); n != 1 {
				t.Errorf("turnstile.turns.refused{%s, limited} = %d, want 1", tt.limit, n)
			}
			if n := m.sum(t, "turnstile.turns.refused"); n != 1 {
				t.Errorf("turnstile.turns.refused = %d in all, want 1", n)
			}
			// Another key is not held back.
			if tt.hold {
				return
			}
			if _, st := wiretest.Collect(t, bearer(t.Context(), "tok-other-0123"), ts.client, hello(), nil); st.Code() != codes.OK {
				t.Errorf("another key's turn: %v", st)
			}
		})
	}
}

func TestKeyLimitsProblems(t *testing.T) {
	t.Parallel()
	neg := -1
	l := server.KeyLimits{ConcurrentTurns: &neg}
	if ps := l.Problems(); len(ps) != 1 || ps[0].Field != "concurrent_turns" {
		t.Errorf("problems of a negative limit: %v", ps)
	}
	if ps := (server.KeyLimits{}).Problems(); len(ps) != 0 {
		t.Errorf("no limits has problems: %v", ps)
	}
}

// TestCutCallChargesItsKey: the tokens a provider reported for a call the
// turn's cancel cut short count against the key's token limits, whether
// the client left the stream (no store) or cancelled the turn (a store):
// before, only the running totals sent after a finished call were charged,
// so cancelling each turn mid-call used the model for free.
func TestCutCallChargesItsKey(t *testing.T) {
	t.Parallel()
	for _, durable := range []bool{false, true} {
		t.Run(map[bool]string{false: "store off, the client leaves", true: "store on, CancelTurn"}[durable], func(t *testing.T) {
			t.Parallel()
			var twenty int64 = 20
			k := keyed("limited", "tok-limited-0123")
			k.Limits = server.KeyLimits{TokensPerMinute: &twenty}
			// The prompt's tokens are reported at the call's start, as
			// Anthropic's message_start does; then the reply never ends.
			p := &byCall{script: func(ctx context.Context, n int) iter.Seq2[llm.Chunk, error] {
				return chunks(ctx, true, llm.Chunk{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 30}}, textChunk("Hel"))
			}}
			opts := server.Options{Keys: []server.Key{k}}
			if durable {
				opts.Store = memStore(t)
			}
			ts := start(t, runner(t, p), opts)
			ctx := bearer(t.Context(), "tok-limited-0123")
			release := holdTurn(t, ts.client, ctx)
			if durable {
				if resp, err := ts.client.CancelTurn(ctx, &turnstilev1.CancelTurnRequest{TurnId: "turn-1"}); err != nil || !resp.GetCancelled() {
					t.Fatalf("CancelTurn = %v, %v", resp, err)
				}
			}
			release()
			if !durable {
				// The client left: the handler charges the cut call
				// before it returns, and the RPC's line is written after.
				ts.logs.awaitCalls(t, "RunTurn", 1)
			}
			// The cut call's 30 tokens are over the key's 20 a minute: the
			// next turn is refused. (With a store, the turn's use is
			// charged before its last event is stored, and CancelTurn
			// returned once it was.)
			second := hello()
			second.TurnId = "turn-2"
			evs, st := wiretest.Collect(t, ctx, ts.client, second, nil)
			refusedWith(t, evs, st, "tokens_per_minute", true)
		})
	}
}
