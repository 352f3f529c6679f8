package server_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/providers/openai"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
)

// bigPrompt is a turn whose prompt the runtime estimates at 1000 tokens:
// 4000 bytes of text, a quarter of a token each, no system prompt and no
// tools.
func bigPrompt(id string) *turnstilev1.RunTurnRequest {
	req := hello()
	req.TurnId = id
	req.Messages[0].Parts[0].Kind = &turnstilev1.Part_Text{Text: strings.Repeat("x", 4000)}
	return req
}

// usageThenHang streams a usage chunk (15 tokens; servers such as vLLM
// with continuous usage stats send one before the end) and then a text
// delta, then holds the request open. The usage comes first so that once
// the client has the delta the runtime has read the usage: a cut after
// the delta is a cut after the usage arrived.
func usageThenHang(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	sse(w, usageChunk)
	sse(w, chunk(`{"role":"assistant","content":"Hel"}`, ""))
	<-r.Context().Done()
}

// replyWithoutUsage streams a whole reply, "Hello, w" (8 bytes), and ends
// it without the usage chunk, as an OpenAI-compatible server that ignores
// stream_options.include_usage does.
func replyWithoutUsage(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	sse(w, chunk(`{"role":"assistant","content":"Hello, w"}`, ""))
	sse(w, chunk(`{}`, "stop"))
	sse(w, "[DONE]")
}

// badRequest refuses the call before streaming: HTTP 400.
func badRequest(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	_, _ = w.Write([]byte(`{"error":{"message":"bad request","type":"invalid_request_error"}}`))
}

// openaiRunner returns a runner whose one model, "oai", is the real OpenAI
// adapter at baseURL, priced 3 USD a million input tokens when priced.
func openaiRunner(t *testing.T, baseURL string, priced bool) *runtime.Runner {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	p, err := openai.New(openai.Config{Name: "up", BaseURL: baseURL, APIKey: "sk-test", HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	retry := policy.DefaultRetry()
	retry.InitialBackoff, retry.MaxBackoff = time.Millisecond, 2*time.Millisecond
	m := &runtime.Model{Alias: "oai", ProviderName: "up", Provider: p, ID: "gpt-test", Retry: retry}
	if priced {
		m.Price = &llm.Price{Currency: "USD", Input: int64(*money("3")), Output: int64(*money("15"))}
	}
	r, err := runtime.New([]*runtime.Model{m}, "oai", nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// cutTurn starts req and returns once its first text delta arrived, with a
// function that cancels it (with CancelTurn too when durable) and waits
// for its stream's end.
func cutTurn(t *testing.T, ts *testServer, ctx context.Context, req *turnstilev1.RunTurnRequest, durable bool) (cut func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	stream, err := ts.client.RunTurn(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("the turn ended before its first text delta: %v", err)
		}
		if resp.GetEvent().GetTextDelta() != nil {
			break
		}
	}
	return func() {
		if durable {
			if resp, err := ts.client.CancelTurn(ctx, &turnstilev1.CancelTurnRequest{TurnId: req.TurnId}); err != nil || !resp.GetCancelled() {
				t.Fatalf("CancelTurn = %v, %v", resp, err)
			}
		}
		cancel()
		for {
			if _, err := stream.Recv(); err != nil {
				return
			}
		}
	}
}

// TestCutCallChargesAnEstimate: an OpenAI call cut before its usage
// arrived (OpenAI reports usage only at a stream's end) is charged an
// estimate of its prompt, 1000 tokens here (a call that completed with no
// usage reported, that and its reply's), to the key's token limits and,
// at the model's input price (0.003 USD), to its budgets; a call whose
// usage arrived is charged exactly that; a call the provider refused
// before streaming, or that never reached it, is charged nothing. Each
// key may run one turn at a time, so the second turn starts once the
// first has ended; the limits around the charge show what was charged.
// The limits' clock stands still (atNoon): no bucket refills and no day
// ends while the test runs.
func TestCutCallChargesAnEstimate(t *testing.T) {
	t.Parallel()
	one := 1
	n := func(v int64) *int64 { return &v }
	// A closed port: the connection is refused.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedURL := "http://" + lis.Addr().String() + "/v1"
	lis.Close()
	tests := []struct {
		name string
		// first is the upstream's first reply; nil: the connection is
		// refused.
		first func(u *upstream) func(http.ResponseWriter, *http.Request)
		// cut: the first turn is cancelled after its first text delta;
		// otherwise it runs to its end, and fails unless completes.
		cut, completes bool
		priced         bool
		limits         server.KeyLimits
		// refused is the limit that refuses the second turn; empty: it
		// is admitted.
		refused string
	}{
		{name: "estimate over tokens_per_minute", first: func(u *upstream) func(http.ResponseWriter, *http.Request) { return u.textThenHang("Hel") }, cut: true,
			limits: server.KeyLimits{TokensPerMinute: n(500)}, refused: "tokens_per_minute"},
		{name: "estimate under tokens_per_minute", first: func(u *upstream) func(http.ResponseWriter, *http.Request) { return u.textThenHang("Hel") }, cut: true,
			limits: server.KeyLimits{TokensPerMinute: n(2000)}},
		// These two pin the estimate at 1000 tokens.
		{name: "estimate reaches tokens_per_day", first: func(u *upstream) func(http.ResponseWriter, *http.Request) { return u.textThenHang("Hel") }, cut: true,
			limits: server.KeyLimits{TokensPerDay: n(1000)}, refused: "tokens_per_day"},
		{name: "estimate one token under tokens_per_day", first: func(u *upstream) func(http.ResponseWriter, *http.Request) { return u.textThenHang("Hel") }, cut: true,
			limits: server.KeyLimits{TokensPerDay: n(1001)}},
		{name: "estimate's cost reaches cost_per_day", first: func(u *upstream) func(http.ResponseWriter, *http.Request) { return u.textThenHang("Hel") }, cut: true, priced: true,
			limits: server.KeyLimits{CostPerDay: money("0.003")}, refused: "cost_per_day"},
		{name: "estimate's cost a nano under cost_per_day", first: func(u *upstream) func(http.ResponseWriter, *http.Request) { return u.textThenHang("Hel") }, cut: true, priced: true,
			limits: server.KeyLimits{CostPerDay: money("0.003000001")}},
		// The usage came before the cut: 15 tokens, and no estimate.
		{name: "reported usage reaches tokens_per_day", first: func(*upstream) func(http.ResponseWriter, *http.Request) { return usageThenHang }, cut: true,
			limits: server.KeyLimits{TokensPerDay: n(15)}, refused: "tokens_per_day"},
		{name: "reported usage one token under tokens_per_day", first: func(*upstream) func(http.ResponseWriter, *http.Request) { return usageThenHang }, cut: true,
			limits: server.KeyLimits{TokensPerDay: n(16)}},
		// Completed with no usage reported: the prompt's 1000 tokens and
		// the reply's 2.
		{name: "completed, no usage: estimate reaches tokens_per_day", first: func(*upstream) func(http.ResponseWriter, *http.Request) { return replyWithoutUsage }, completes: true,
			limits: server.KeyLimits{TokensPerDay: n(1002)}, refused: "tokens_per_day"},
		{name: "completed, no usage: estimate one token under tokens_per_day", first: func(*upstream) func(http.ResponseWriter, *http.Request) { return replyWithoutUsage }, completes: true,
			limits: server.KeyLimits{TokensPerDay: n(1003)}},
		{name: "refused before streaming", first: func(*upstream) func(http.ResponseWriter, *http.Request) { return badRequest },
			limits: server.KeyLimits{TokensPerDay: n(1)}},
		{name: "connection refused",
			limits: server.KeyLimits{TokensPerDay: n(1)}},
	}
	for _, durable := range []bool{false, true} {
		for _, tt := range tests {
			name := map[bool]string{false: "store off/", true: "store on/"}[durable] + tt.name
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				baseURL := refusedURL
				if tt.first != nil {
					u := newUpstream(t)
					u.replies = append(u.replies, tt.first(u), textReply("hi"))
					baseURL = u.URL + "/v1"
				}
				k := keyed("limited", "tok-limited-0123")
				k.Limits = tt.limits
				// Each call holds its prompt alone, and the second turn's
				// prompt is three bytes, none of a token: only what the
				// first turn was charged stands in the second's way.
				k.Limits.ConcurrentTurns, k.Limits.ReserveOutputTokens = &one, n(0)
				opts := server.Options{Keys: []server.Key{k}, Clock: atNoon}
				if durable {
					opts.Store = memStore(t)
				}
				ts := start(t, openaiRunner(t, baseURL, tt.priced), opts)
				ctx := bearer(t.Context(), "tok-limited-0123")
				if tt.cut {
					cutTurn(t, ts, ctx, bigPrompt("turn-1"), durable)()
				} else {
					evs, st := wiretest.Collect(t, ctx, ts.client, bigPrompt("turn-1"), nil)
					if (st.Code() == codes.OK) != tt.completes || len(evs) == 0 {
						t.Fatalf("the first turn: %v after %s; want it completed: %v", st, wiretest.Names(evs), tt.completes)
					}
				}
				// The second turn, once the first has ended.
				var (
					evs []*turnstilev1.AgentEvent
					st  *status.Status
				)
				second := hello()
				second.TurnId = "turn-2"
				second.Messages[0].Parts[0].Kind = &turnstilev1.Part_Text{Text: "hi?"}
				eventually(t, "the first turn ends and frees its key's slot", func() bool {
					cctx, cancel := context.WithTimeout(ctx, waitBound)
					defer cancel()
					evs, st = wiretest.Collect(t, cctx, ts.client, second, nil)
					return limitOf(st) != "concurrent_turns"
				})
				if tt.refused == "" {
					if len(evs) == 0 {
						t.Fatalf("the second turn was refused: %v", st)
					}
					return
				}
				if len(evs) != 0 || st.Code() != codes.ResourceExhausted || limitOf(st) != tt.refused {
					t.Fatalf("the second turn: %v after %s; want RESOURCE_EXHAUSTED by %s before any event", st, wiretest.Names(evs), tt.refused)
				}
			})
		}
	}
}

// limitOf returns the limit st's ErrorInfo names, empty when none.
func limitOf(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetMetadata()["limit"]
		}
	}
	return ""
}
