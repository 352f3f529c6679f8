package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/providers/openai"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
)

// cancelBound is how long a cancel may take to close the upstream call or
// stop a tool. The server's aim is well under a second; the bound leaves
// slack for a shared, noisy machine.
const cancelBound = 3 * time.Second

// upstream is a fake OpenAI-compatible server: each chat completion gets
// the next scripted reply (the last one repeats). It records each
// request's body, and when a hanging reply's request is closed by the
// client.
type upstream struct {
	*httptest.Server
	replies []func(w http.ResponseWriter, r *http.Request)

	mu     sync.Mutex
	bodies []chatRequest
	closed chan time.Time // a hanging reply's request context ended
}

// chatRequest is what the tests read of a chat completion request.
type chatRequest struct {
	Messages []struct {
		Role       string `json:"role"`
		Content    any    `json:"content"`
		ToolCallID string `json:"tool_call_id"`
		ToolCalls  []struct {
			ID string `json:"id"`
		} `json:"tool_calls"`
	} `json:"messages"`
}

func newUpstream(t *testing.T, replies ...func(w http.ResponseWriter, r *http.Request)) *upstream {
	u := &upstream{replies: replies, closed: make(chan time.Time, 8)}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req chatRequest
		if err := json.Unmarshal(b, &req); err != nil {
			t.Errorf("upstream: request body: %v", err)
		}
		u.mu.Lock()
		n := len(u.bodies)
		u.bodies = append(u.bodies, req)
		u.mu.Unlock()
		u.replies[min(n, len(u.replies)-1)](w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

// calls returns the requests received so far.
func (u *upstream) calls() []chatRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]chatRequest(nil), u.bodies...)
}

// provider returns the real OpenAI adapter pointed at u.
func (u *upstream) provider(t *testing.T) llm.Provider {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	p, err := openai.New(openai.Config{Name: "up", BaseURL: u.URL + "/v1", APIKey: "sk-test", HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// sse writes one server-sent event of a chat completion stream.
func sse(w http.ResponseWriter, data string) {
	fmt.Fprintf(w, "data: %s\n\n", data)
	w.(http.Flusher).Flush()
}

func chunk(delta string, finish string) string {
	f := "null"
	if finish != "" {
		f = `"` + finish + `"`
	}
	return `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-test","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + f + `}]}`
}

const usageChunk = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-test","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}`

// textThenHang streams texts, then holds the request open until the
// client closes it, and records when it did.
func (u *upstream) textThenHang(texts ...string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i, s := range texts {
			role := ""
			if i == 0 {
				role = `"role":"assistant",`
			}
			b, _ := json.Marshal(s)
			sse(w, chunk(`{`+role+`"content":`+string(b)+`}`, ""))
		}
		<-r.Context().Done()
		u.closed <- time.Now()
	}
}

// textReply streams a complete reply saying text.
func textReply(text string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		b, _ := json.Marshal(text)
		sse(w, chunk(`{"role":"assistant","content":`+string(b)+`}`, ""))
		sse(w, chunk(`{}`, "stop"))
		sse(w, usageChunk)
		sse(w, "[DONE]")
	}
}

// toolCallReply streams a complete reply calling tool name with args.
func toolCallReply(id, name, args string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		a, _ := json.Marshal(args)
		sse(w, chunk(`{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"`+id+`","type":"function","function":{"name":"`+name+`","arguments":""}}]}`, ""))
		sse(w, chunk(`{"tool_calls":[{"index":0,"function":{"arguments":`+string(a)+`}}]}`, ""))
		sse(w, chunk(`{}`, "tool_calls"))
		sse(w, usageChunk)
		sse(w, "[DONE]")
	}
}

// unavailable answers 503, which the turn retries after its backoff.
func unavailable(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = io.WriteString(w, `{"error":{"message":"busy","type":"server_error"}}`)
}

// upstreamRunner runs the model "sim" on the upstream u, retrying after
// backoff, with tools.
func upstreamRunner(t *testing.T, u *upstream, backoff time.Duration, tools ...llm.Tool) *runtime.Runner {
	t.Helper()
	retry := policy.DefaultRetry()
	retry.InitialBackoff, retry.MaxBackoff = backoff, backoff
	r, err := runtime.New([]*runtime.Model{{Alias: "sim", ProviderName: "up", Provider: u.provider(t), ID: "gpt-test", Retry: retry}}, "sim", tools)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// until receives the events of stream up to and including the first one
// for which stop is true.
func until(t *testing.T, stream interface {
	Recv() (*turnstilev1.RunTurnResponse, error)
}, stop func(*turnstilev1.AgentEvent) bool) []*turnstilev1.AgentEvent {
	t.Helper()
	var evs []*turnstilev1.AgentEvent
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv after %s: %v", wiretest.Names(evs), err)
		}
		evs = append(evs, resp.GetEvent())
		if stop(resp.GetEvent()) {
			return evs
		}
	}
}

// textSoFar returns a test of whether the text deltas so far say text:
// the server may merge deltas that come while it is busy, so a test that
// waits for streamed text waits for the text, not for a number of deltas.
func textSoFar(text string) func(*turnstilev1.AgentEvent) bool {
	var seen strings.Builder
	return func(ev *turnstilev1.AgentEvent) bool {
		seen.WriteString(ev.GetTextDelta().GetText())
		return seen.String() == text
	}
}

// rest receives the rest of a stream and its status.
func rest(stream interface {
	Recv() (*turnstilev1.RunTurnResponse, error)
}) ([]*turnstilev1.AgentEvent, *status.Status) {
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
	}
}

// committed returns the messages of the message_completed events.
func committed(evs []*turnstilev1.AgentEvent) []*turnstilev1.Message {
	var out []*turnstilev1.Message
	for _, ev := range evs {
		if m := ev.GetMessageCompleted(); m != nil {
			out = append(out, m.GetMessage())
		}
	}
	return out
}

func textOf(m *turnstilev1.Message) string {
	var b strings.Builder
	for _, p := range m.GetParts() {
		b.WriteString(p.GetText())
	}
	return b.String()
}

// TestCancelTurnEndToEnd cancels a turn with CancelTurn mid-reply,
// mid-tool and during a retry's backoff, over real gRPC with the
// embedded store and the OpenAI adapter against a fake upstream: the
// upstream call or the tool stops at once, the turn's log ends with the
// messages that close the conversation and one CANCELLED error, nothing
// more reaches the upstream, WatchTurn replays the same, and the next
// turn, sent with the conversation the events give, is accepted and
// shows the model what happened.
func TestCancelTurnEndToEnd(t *testing.T) {
	t.Parallel()
	toolStopped := make(chan time.Time, 1)
	block := fake.NewTool("block", func(ctx context.Context, _ llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
		<-ctx.Done()
		toolStopped <- time.Now()
		return llm.ToolOutput{}, ctx.Err()
	})
	tests := []struct {
		name string
		// replies script the upstream: the cancelled turn's, then the
		// next turn's.
		replies func(u *upstream) []func(http.ResponseWriter, *http.Request)
		backoff time.Duration
		// cancelAt says when the client cancels.
		cancelAt func(*turnstilev1.AgentEvent) bool
		// stopped receives when what the cancel must stop stopped; nil
		// when nothing runs (a backoff).
		stopped func(u *upstream) <-chan time.Time
		want    string
		// closing are the messages the cancel commits, by role and text
		// (a tool message by its results' content).
		closing []string
		// nextWire is the next turn's conversation as the upstream gets
		// it, by role.
		nextWire string
		// elsewhere sends CancelTurn and WatchTurn to another replica
		// sharing a NATS server with the one running the turn.
		elsewhere bool
	}{
		{
			name: "mid-reply",
			replies: func(u *upstream) []func(http.ResponseWriter, *http.Request) {
				return []func(http.ResponseWriter, *http.Request){u.textThenHang("Hello, ", "wor"), textReply("world.")}
			},
			backoff:  time.Millisecond,
			cancelAt: textSoFar("Hello, wor"),
			stopped:  func(u *upstream) <-chan time.Time { return u.closed },
			want:     "TurnStarted LlmCallStarted TextDelta MessageCompleted MessageCompleted Error",
			closing:  []string{"ROLE_ASSISTANT Hello, wor", "ROLE_USER " + runtime.InterruptedNote},
			nextWire: "user assistant user user",
		},
		{
			name: "mid-reply, cancelled on another replica",
			replies: func(u *upstream) []func(http.ResponseWriter, *http.Request) {
				return []func(http.ResponseWriter, *http.Request){u.textThenHang("Hello, ", "wor"), textReply("world.")}
			},
			backoff:   time.Millisecond,
			cancelAt:  textSoFar("Hello, wor"),
			stopped:   func(u *upstream) <-chan time.Time { return u.closed },
			want:      "TurnStarted LlmCallStarted TextDelta MessageCompleted MessageCompleted Error",
			closing:   []string{"ROLE_ASSISTANT Hello, wor", "ROLE_USER " + runtime.InterruptedNote},
			nextWire:  "user assistant user user",
			elsewhere: true,
		},
		{
			name: "mid-tool",
			replies: func(u *upstream) []func(http.ResponseWriter, *http.Request) {
				return []func(http.ResponseWriter, *http.Request){toolCallReply("call_1", "block", `{"x":1}`), textReply("ok.")}
			},
			backoff:  time.Millisecond,
			cancelAt: func(ev *turnstilev1.AgentEvent) bool { return ev.GetToolStarted() != nil },
			stopped:  func(*upstream) <-chan time.Time { return toolStopped },
			want:     "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted ToolFinished MessageCompleted MessageCompleted Error",
			closing:  []string{"ROLE_TOOL " + runtime.CancelledToolResult, "ROLE_USER " + runtime.InterruptedToolUseNote},
			nextWire: "user assistant tool user user",
		},
		{
			name: "during a retry's backoff",
			replies: func(u *upstream) []func(http.ResponseWriter, *http.Request) {
				return []func(http.ResponseWriter, *http.Request){unavailable, textReply("back.")}
			},
			backoff:  time.Minute,
			cancelAt: func(ev *turnstilev1.AgentEvent) bool { return ev.GetRetry() != nil },
			want:     "TurnStarted LlmCallStarted LlmCallFinished Retry MessageCompleted Error",
			closing:  []string{"ROLE_USER " + runtime.InterruptedNote},
			nextWire: "user user user",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			u := newUpstream(t)
			u.replies = tt.replies(u)
			ts := start(t, upstreamRunner(t, u, tt.backoff, block), server.Options{Store: memStore(t)})
			other := ts
			if tt.elsewhere {
				rs := startReplicas(t, 2, func(int) *runtime.Runner { return upstreamRunner(t, u, tt.backoff, block) }, nil)
				ts, other = rs[0], rs[1]
			}
			stream, err := ts.client.RunTurn(t.Context(), hello())
			if err != nil {
				t.Fatal(err)
			}
			head := until(t, stream, tt.cancelAt)

			cancelledAt := time.Now()
			resp, err := other.client.CancelTurn(t.Context(), &turnstilev1.CancelTurnRequest{TurnId: "turn-1", Attempt: 1})
			if err != nil {
				t.Fatalf("CancelTurn: %v", err)
			}
			took := time.Since(cancelledAt)
			if tt.stopped != nil {
				select {
				case at := <-tt.stopped(u):
					t.Logf("stopped %v after CancelTurn was sent (CancelTurn returned after %v)", at.Sub(cancelledAt), took)
					if d := at.Sub(cancelledAt); d > cancelBound {
						t.Errorf("stopped %v after the cancel, want well under a second", d)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the cancel did not stop the upstream call or the tool")
				}
			} else {
				t.Logf("CancelTurn returned after %v", took)
			}
			if took > cancelBound {
				t.Errorf("CancelTurn took %v", took)
			}
			tail, st := rest(stream)
			evs := append(head, tail...)
			if got := wiretest.Names(evs); got != tt.want {
				t.Fatalf("events:\n got %s\nwant %s", got, tt.want)
			}
			last := evs[len(evs)-1].GetError()
			if last.GetCode() != turnstilev1.ErrorCode_ERROR_CODE_CANCELLED || last.GetRetryable() || !strings.Contains(last.GetMessage(), "CancelTurn") {
				t.Errorf("last event %v, want CANCELLED, not retryable", last)
			}
			if st.Code() != codes.Canceled {
				t.Errorf("RunTurn status %v, want CANCELLED", st)
			}
			assertStatusMatchesEvent(t, st, last)
			if !resp.GetCancelled() || resp.GetLastSeq() != uint64(len(evs)) {
				t.Errorf("CancelTurn = %v, want cancelled with last_seq %d", resp, len(evs))
			}
			msgs := committed(evs)
			var got []string
			for _, m := range msgs[len(msgs)-len(tt.closing):] {
				s := m.GetRole().String() + " " + textOf(m)
				if m.GetRole() == turnstilev1.Role_ROLE_TOOL {
					s = m.GetRole().String() + " " + m.GetParts()[0].GetToolResult().GetContent()
					if !m.GetParts()[0].GetToolResult().GetIsError() {
						t.Errorf("cancelled tool result %v is not an error", m)
					}
				}
				got = append(got, s)
			}
			if strings.Join(got, "\n") != strings.Join(tt.closing, "\n") {
				t.Errorf("closing messages:\n got %q\nwant %q", got, tt.closing)
			}

			w, wst := watch(t, t.Context(), other.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
			sameEvents(t, "WatchTurn", w, evs)
			sameStatus(t, "WatchTurn", wst, st)

			// The next turn continues from the conversation the events
			// give: the server accepts it, and the model sees it all.
			next := hello()
			next.TurnId = "turn-2"
			next.Messages = append(next.Messages, msgs...)
			next.Messages = append(next.Messages, wiretest.UserText("go on")...)
			nevs, nst := wiretest.Collect(t, t.Context(), ts.client, next, nil)
			if nst.Code() != codes.OK || nevs[len(nevs)-1].GetTurnCompleted() == nil {
				t.Fatalf("the next turn: %v, events %s", nst, wiretest.Names(nevs))
			}
			// Nothing more reached the upstream: the cancelled turn's call,
			// then the next turn's.
			calls := u.calls()
			if len(calls) != 2 {
				t.Fatalf("the upstream got %d calls, want the cancelled turn's and the next one's", len(calls))
			}
			var roles []string
			for _, m := range calls[len(calls)-1].Messages {
				roles = append(roles, m.Role)
			}
			if got := strings.Join(roles, " "); got != tt.nextWire {
				t.Errorf("the next turn's messages upstream: %s, want %s", got, tt.nextWire)
			}
		})
	}
}

// TestCancelledTurnHasOneTerminalEvent: of four concurrent CancelTurns
// one cancels, all report the same last seq, and the log holds one
// terminal event, the one the caller received.
func TestCancelledTurnHasOneTerminalEvent(t *testing.T) {
	t.Parallel()
	u := newUpstream(t)
	u.replies = []func(http.ResponseWriter, *http.Request){u.textThenHang("partial")}
	ts := start(t, upstreamRunner(t, u, time.Millisecond), server.Options{Store: memStore(t)})
	stream, err := ts.client.RunTurn(t.Context(), hello())
	if err != nil {
		t.Fatal(err)
	}
	until(t, stream, func(ev *turnstilev1.AgentEvent) bool { return ev.GetTextDelta() != nil })
	var wg sync.WaitGroup
	resps := make([]*turnstilev1.CancelTurnResponse, 4)
	for i := range resps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := ts.client.CancelTurn(t.Context(), &turnstilev1.CancelTurnRequest{TurnId: "turn-1"})
			if err != nil {
				t.Errorf("CancelTurn: %v", err)
			}
			resps[i] = r
		}()
	}
	wg.Wait()
	tail, _ := rest(stream)
	terminals, cancelled := 0, 0
	w, _ := watch(t, t.Context(), ts.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
	for _, ev := range w {
		if ev.GetError() != nil || ev.GetTurnCompleted() != nil {
			terminals++
		}
	}
	for _, r := range resps {
		if r.GetCancelled() {
			cancelled++
		}
		if r.GetLastSeq() != uint64(len(w)) {
			t.Errorf("CancelTurn last_seq %d, want %d", r.GetLastSeq(), len(w))
		}
	}
	if terminals != 1 || cancelled != 1 || !proto.Equal(tail[len(tail)-1], w[len(w)-1]) {
		t.Errorf("%d terminal events, %d calls cancelled; want 1 and 1", terminals, cancelled)
	}
}

// TestDetachGraceClosesLikeACancel: a turn nobody watches for the detach
// grace is cancelled, and closes its conversation in its log as a
// CancelTurn does, so a client back later can continue from it.
func TestDetachGraceClosesLikeACancel(t *testing.T) {
	t.Parallel()
	toolStopped := make(chan struct{})
	block := fake.NewTool("block", func(ctx context.Context, _ llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
		<-ctx.Done()
		close(toolStopped)
		return llm.ToolOutput{}, ctx.Err()
	})
	u := newUpstream(t, toolCallReply("call_1", "block", `{}`))
	const grace = 200 * time.Millisecond
	ts := start(t, upstreamRunner(t, u, time.Millisecond, block), server.Options{Store: memStore(t), DetachGrace: grace})
	ctx, cancel := context.WithCancel(t.Context())
	stream, err := ts.client.RunTurn(ctx, hello())
	if err != nil {
		t.Fatal(err)
	}
	until(t, stream, func(ev *turnstilev1.AgentEvent) bool { return ev.GetToolStarted() != nil })
	cancel() // a disconnect: the turn goes on until the grace ends
	select {
	case <-toolStopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the turn nobody watches was not cancelled")
	}
	evs, st := watch(t, t.Context(), ts.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
	if got, want := wiretest.Names(evs), "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted ToolFinished MessageCompleted MessageCompleted Error"; got != want {
		t.Fatalf("events:\n got %s\nwant %s", got, want)
	}
	msgs := committed(evs)
	if r := msgs[1].GetParts()[0].GetToolResult(); r.GetContent() != runtime.CancelledToolResult || !r.GetIsError() {
		t.Errorf("tool result %v, want the cancelled one", r)
	}
	if got := textOf(msgs[2]); got != runtime.InterruptedToolUseNote {
		t.Errorf("note %q", got)
	}
	if last := evs[len(evs)-1].GetError(); st.Code() != codes.Canceled || last.GetCode() != turnstilev1.ErrorCode_ERROR_CODE_CANCELLED || !strings.Contains(last.GetMessage(), "detach grace") {
		t.Errorf("ended with %v, last event %v", st, last)
	}
}
