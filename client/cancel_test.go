package client_test

import (
	"context"
	"errors"
	"io"
	"iter"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
)

// upstream is a scripted model whose first call streams a few words, then
// hangs until its request is closed (its context ends), which it records;
// any later call answers at once.
type upstream struct {
	*scripted
	streaming chan struct{} // closed once the first call streamed its words
	closed    chan struct{} // closed once the first call's request was closed
	closedAt  time.Time     // when, set before closed is closed
}

func newUpstream() *upstream {
	u := &upstream{streaming: make(chan struct{}), closed: make(chan struct{})}
	u.scripted = &scripted{fn: func(ctx context.Context, call int, _ *llm.Request) iter.Seq2[llm.Chunk, error] {
		if call > 1 {
			return reply("a later call")
		}
		return func(yield func(llm.Chunk, error) bool) {
			defer func() {
				u.closedAt = time.Now()
				close(u.closed)
			}()
			for c, err := range hang(ctx, u.streaming, "Once upon ", "a time") {
				if !yield(c, err) {
					return
				}
			}
		}
	}}
	return u
}

func (u *upstream) calls() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.scripted.calls
}

// waitClosed fails the test unless the first call's request is closed
// within a generous bound.
func (u *upstream) waitClosed(t *testing.T) {
	t.Helper()
	select {
	case <-u.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream request is still open")
	}
}

// storedLog reads the run's whole log with WatchTurn.
func storedLog(t *testing.T, c *client.Client, turnID string) []*turnstilev1.AgentEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	w, err := turnstilev1.NewAgentServiceClient(c.Conn()).WatchTurn(ctx, &turnstilev1.WatchTurnRequest{TurnId: turnID, Attempt: 1})
	if err != nil {
		t.Fatal(err)
	}
	var out []*turnstilev1.AgentEvent
	for {
		r, err := w.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) && len(out) == 0 {
				t.Fatalf("WatchTurn: %v", err)
			}
			return out
		}
		out = append(out, r.GetEvent())
	}
}

// terminal returns the events among evs that end an attempt.
func terminal(evs []*client.Event) []*turnstilev1.AgentEvent {
	var out []*turnstilev1.AgentEvent
	for _, ev := range evs {
		if ev.Agent.GetError() != nil || ev.Agent.GetTurnCompleted() != nil {
			out = append(out, ev.Agent)
		}
	}
	return out
}

// committed returns the messages of the message_completed events in evs.
func committed(evs []*client.Event) []*turnstilev1.Message {
	var out []*turnstilev1.Message
	for _, ev := range evs {
		if m := ev.Agent.GetMessageCompleted(); m != nil {
			out = append(out, m.GetMessage())
		}
	}
	return out
}

// checkCancelledLog checks that the run's stored log made one model call
// and ends with its CANCELLED error.
func checkCancelledLog(t *testing.T, c *client.Client, turnID string) {
	t.Helper()
	log := storedLog(t, c, turnID)
	calls := 0
	for _, ev := range log {
		if ev.GetLlmCallStarted() != nil {
			calls++
		}
	}
	if calls != 1 {
		t.Errorf("the stored run made %d model calls, want 1", calls)
	}
	if len(log) == 0 || log[len(log)-1].GetError().GetCode() != turnstilev1.ErrorCode_ERROR_CODE_CANCELLED {
		t.Errorf("the stored run does not end with a CANCELLED error: %v", log)
	}
}

// Cancelling the turn's context cancels the run on a server with a turn
// store, where dropping the stream would only leave it: the client calls
// CancelTurn, the upstream request is closed, the caller gets the run's
// one terminal event, and no model call follows. The messages the server
// committed as it stopped the turn are the error's, for the next turn.
func TestCancelStopsTheRun(t *testing.T) {
	u := newUpstream()
	st := sharedStores(t, 1)
	addr := serveDurable(t, newReplica(t, u), st[0])
	var logs lockedBuffer
	c := newClient(t, addr, client.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	turn := c.RunTurn(ctx, userRequest("tell me a story"))
	var evs []*client.Event
	var err error
	var cancelled time.Time
	for ev, e := range turn.Events() {
		if e != nil {
			err = e
			break
		}
		evs = append(evs, ev)
		if ev.Agent.GetTextDelta() != nil && ctx.Err() == nil {
			<-u.streaming
			cancelled = time.Now()
			cancel()
		}
	}
	ended := time.Since(cancelled)
	var te *client.TurnError
	if !errors.As(err, &te) || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want a *client.TurnError wrapping context.Canceled", err)
	}
	if te.Code != turnstilev1.ErrorCode_ERROR_CODE_CANCELLED || te.Attempts != 1 || te.Retryable {
		t.Errorf("err = %v (attempts %d, retryable %v), want CANCELLED after 1 attempt, not retryable", te, te.Attempts, te.Retryable)
	}
	u.waitClosed(t)
	t.Logf("after the cancel, the upstream request was closed in %v and the turn ended in %v", u.closedAt.Sub(cancelled), ended)
	ends := terminal(evs)
	if len(ends) != 1 || ends[0].GetError().GetCode() != turnstilev1.ErrorCode_ERROR_CODE_CANCELLED {
		t.Errorf("terminal events = %v, want one CANCELLED error", ends)
	}
	if n := u.calls(); n != 1 {
		t.Errorf("the upstream got %d calls, want 1", n)
	}
	if got, want := len(te.Messages), len(committed(evs)); got != want {
		t.Errorf("the error holds %d messages, the server committed %d", got, want)
	}
	checkCancelledLog(t, c, turn.ID())
	if strings.Contains(logs.String(), "could not cancel") {
		t.Errorf("the client could not cancel the turn:\n%s", logs.String())
	}
}

// Breaking out of the iteration leaves the run; a Close then cancels it.
func TestCloseAfterBreakCancelsTheRun(t *testing.T) {
	u := newUpstream()
	st := sharedStores(t, 1)
	addr := serveDurable(t, newReplica(t, u), st[0])
	c := newClient(t, addr)

	turn := c.RunTurn(t.Context(), userRequest("tell me a story"))
	for ev, err := range turn.Events() {
		if err != nil {
			t.Fatalf("turn failed: %v", err)
		}
		if ev.Agent.GetTextDelta() != nil {
			<-u.streaming
			break
		}
	}
	if !errors.Is(turn.Err(), client.ErrStopped) {
		t.Fatalf("Err() = %v, want ErrStopped", turn.Err())
	}
	if err := turn.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	u.waitClosed(t)
	checkCancelledLog(t, c, turn.ID())
	if err := turn.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}

// Close from another goroutine while the turn runs cancels it as
// cancelling its context does, with ErrClosed as the cause.
func TestCloseWhileRunning(t *testing.T) {
	u := newUpstream()
	st := sharedStores(t, 1)
	addr := serveDurable(t, newReplica(t, u), st[0])
	c := newClient(t, addr)

	turn := c.RunTurn(t.Context(), userRequest("tell me a story"))
	go func() {
		<-u.streaming
		_ = turn.Close()
	}()
	evs, err := collect(t, turn)
	if !errors.Is(err, client.ErrClosed) || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want one wrapping ErrClosed and context.Canceled", err)
	}
	u.waitClosed(t)
	if ends := terminal(evs); len(ends) != 1 {
		t.Errorf("terminal events = %v, want one", ends)
	}
	checkCancelledLog(t, c, turn.ID())
}

// With a cancel timeout of 0 the client does not call CancelTurn: the
// server keeps running the turn it left.
func TestCancelTimeoutZeroLeavesTheRun(t *testing.T) {
	u := newUpstream()
	st := sharedStores(t, 1)
	addr := serveDurable(t, newReplica(t, u), st[0])
	c := newClient(t, addr, client.WithCancelTimeout(0))

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	turn := c.RunTurn(ctx, userRequest("tell me a story"))
	var err error
	for ev, e := range turn.Events() {
		if e != nil {
			err = e
			break
		}
		if ev.Agent.GetTextDelta() != nil && ctx.Err() == nil {
			<-u.streaming
			cancel()
		}
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	// The run still goes on: this CancelTurn is the one that stops it.
	res, cerr := turnstilev1.NewAgentServiceClient(c.Conn()).CancelTurn(t.Context(), &turnstilev1.CancelTurnRequest{TurnId: turn.ID(), Attempt: 1})
	if cerr != nil || !res.GetCancelled() {
		t.Errorf("CancelTurn after the client left = %v, %v; want cancelled true", res, cerr)
	}
	u.waitClosed(t)
}

// On a server without a turn store, CancelTurn answers
// FAILED_PRECONDITION; the client drops the stream, which cancels the
// turn there, and says nothing of it.
func TestCancelWithoutStore(t *testing.T) {
	u := newUpstream()
	rep := newReplica(t, u)
	addr, _ := serve(t, rep)
	var logs lockedBuffer
	c := newClient(t, addr, client.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	turn := c.RunTurn(ctx, userRequest("tell me a story"))
	var err error
	for ev, e := range turn.Events() {
		if e != nil {
			err = e
			break
		}
		if ev.Agent.GetTextDelta() != nil && ctx.Err() == nil {
			<-u.streaming
			cancel()
		}
	}
	var te *client.TurnError
	if !errors.As(err, &te) || te.Code != turnstilev1.ErrorCode_ERROR_CODE_CANCELLED {
		t.Fatalf("err = %v, want CANCELLED", err)
	}
	u.waitClosed(t)
	if logs.String() != "" {
		t.Errorf("the client logged:\n%s", logs.String())
	}
}

// A turn cancelled while a server-side tool runs leaves a conversation the
// next turn continues from: the messages the turn committed that stand are
// the error's, and a request made of them and a new user message runs.
func TestContinueAfterCancelDuringTool(t *testing.T) {
	b := &blocker{started: make(chan struct{})}
	p := &scripted{fn: func(ctx context.Context, call int, _ *llm.Request) iter.Seq2[llm.Chunk, error] {
		if call == 1 {
			return callTool("call_1", "deploy", `{}`)
		}
		return reply("Stopped as asked.")
	}}
	st := sharedStores(t, 1)
	addr := serveDurable(t, newReplica(t, p, b), st[0])
	c := newClient(t, addr)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req := userRequest("deploy it")
	turn := c.RunTurn(ctx, req)
	var evs []*client.Event
	var err error
	for ev, e := range turn.Events() {
		if e != nil {
			err = e
			break
		}
		evs = append(evs, ev)
		if ev.Agent.GetToolStarted() != nil {
			<-b.started
			cancel()
		}
	}
	var te *client.TurnError
	if !errors.As(err, &te) || te.Code != turnstilev1.ErrorCode_ERROR_CODE_CANCELLED {
		t.Fatalf("err = %v, want CANCELLED", err)
	}
	if ends := terminal(evs); len(ends) != 1 {
		t.Errorf("terminal events = %v, want one", ends)
	}
	// Every message the server committed stands, but a tool call it left
	// unanswered, which no server would take back.
	want := committed(evs)
	if n := len(want); n > 0 && want[n-1].GetRole() == turnstilev1.Role_ROLE_ASSISTANT && hasToolCall(want[n-1]) {
		want = want[:n-1]
	}
	if len(te.Messages) != len(want) {
		t.Fatalf("the error holds %d messages, want %d: %v", len(te.Messages), len(want), te.Messages)
	}
	for i := range want {
		if !proto.Equal(te.Messages[i], want[i]) {
			t.Errorf("message %d = %v, want %v", i, te.Messages[i], want[i])
		}
	}

	next := userRequest("deploy it")
	next.Messages = append(next.Messages, te.Messages...)
	next.Messages = append(next.Messages, userRequest("never mind").Messages...)
	res, err := c.RunTurn(t.Context(), next).Wait()
	if err != nil {
		t.Fatalf("the next turn: %v", err)
	}
	if res.EndReason != turnstilev1.EndReason_END_REASON_END_TURN {
		t.Errorf("the next turn ended %v", res.EndReason)
	}
}

func hasToolCall(m *turnstilev1.Message) bool {
	for _, p := range m.GetParts() {
		if p.GetToolCall() != nil {
			return true
		}
	}
	return false
}
