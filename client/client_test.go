package client_test

import (
	"bytes"
	"context"
	"errors"
	"iter"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func userRequest(text string) *turnstilev1.RunTurnRequest {
	return &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{{
		Role:  turnstilev1.Role_ROLE_USER,
		Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: text}}},
	}}}
}

// collect ranges over a turn's events; it returns them and the error the
// sequence ended with.
func collect(t *testing.T, turn *client.Turn) ([]*client.Event, error) {
	t.Helper()
	var evs []*client.Event
	for ev, err := range turn.Events() {
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
	}
	return evs, nil
}

func stepRetries(evs []*client.Event) []*client.StepRetry {
	var out []*client.StepRetry
	for _, ev := range evs {
		if ev.StepRetry != nil {
			out = append(out, ev.StepRetry)
		}
	}
	return out
}

func text(evs []*client.Event, attempt int) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Attempt == attempt {
			b.WriteString(ev.Agent.GetTextDelta().GetText())
		}
	}
	return b.String()
}

// lastIsToolResult reports whether the conversation ends with tool results.
func lastIsToolResult(req *llm.Request) bool {
	m := req.Messages[len(req.Messages)-1]
	return m.Role == llm.RoleTool
}

func serverError() *llm.Error {
	return &llm.Error{Kind: llm.KindServerError, Message: "upstream returned 500", StatusCode: 500}
}

// A retryable error after a tool ran: the client resumes the turn with the
// messages the first attempt committed, under the same turn id, and the
// tool is not run again.
func TestRetryableErrorResumesWithoutRepeatingTools(t *testing.T) {
	tool := &counter{}
	p := &scripted{fn: func(ctx context.Context, call int, req *llm.Request) iter.Seq2[llm.Chunk, error] {
		switch {
		case call == 1:
			return callTool("call_1", "counter", `{}`)
		case call == 2:
			return fail(serverError(), "The count ", "is")
		case lastIsToolResult(req):
			return reply("The count is ", "1.")
		}
		return fail(&llm.Error{Kind: llm.KindInvalidRequest, Message: "the tool result was not re-sent"})
	}}
	rep := newReplica(t, p, tool)
	addr, _ := serve(t, rep)
	var logs bytes.Buffer
	c := newClient(t, addr, client.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))

	req := userRequest("count once")
	turn := c.RunTurn(t.Context(), req)
	evs, err := collect(t, turn)
	if err != nil {
		t.Fatalf("turn failed: %v", err)
	}

	if n := tool.runs.Load(); n != 1 {
		t.Errorf("the tool ran %d times, want 1", n)
	}
	served := rep.served()
	if len(served) != 2 {
		t.Fatalf("the server received %d requests, want 2", len(served))
	}
	first, second := served[0], served[1]
	if first.attempt != "1" || second.attempt != "2" {
		t.Errorf("attempt headers = %q, %q, want 1, 2", first.attempt, second.attempt)
	}
	if first.req.TurnID == "" || first.req.TurnID != second.req.TurnID || first.req.TurnID != turn.ID() {
		t.Errorf("turn ids = %q, %q (client %q), want one shared id", first.req.TurnID, second.req.TurnID, turn.ID())
	}
	// The second request is the first one plus what the first attempt
	// committed: the assistant's tool call and the tool's result.
	msgs := second.req.Messages
	if len(msgs) != 3 {
		t.Fatalf("second request has %d messages, want 3: %+v", len(msgs), msgs)
	}
	if msgs[0].Role != llm.RoleUser || msgs[0].Text() != "count once" {
		t.Errorf("message 0 = %+v, want the user's", msgs[0])
	}
	if calls := msgs[1].ToolCalls(); msgs[1].Role != llm.RoleAssistant || len(calls) != 1 || calls[0].ID != "call_1" || calls[0].Name != "counter" {
		t.Errorf("message 1 = %+v, want the assistant's call_1 to counter", msgs[1])
	}
	if p := msgs[2].Parts; msgs[2].Role != llm.RoleTool || len(p) != 1 || p[0].ToolResult.CallID != "call_1" || p[0].ToolResult.Content != `{"count":1}` {
		t.Errorf("message 2 = %+v, want counter's result for call_1", msgs[2])
	}
	if len(req.GetMessages()) != 1 {
		t.Errorf("the caller's request was modified: %d messages", len(req.GetMessages()))
	}

	retries := stepRetries(evs)
	if len(retries) != 1 {
		t.Fatalf("got %d step retries, want 1", len(retries))
	}
	sr := retries[0]
	if sr.Attempt != 2 || sr.MaxAttempts != 2 || !sr.DiscardPartial || len(sr.Messages) != 2 {
		t.Errorf("step retry = {Attempt:%d MaxAttempts:%d DiscardPartial:%v Messages:%d}, want {2 2 true 2}",
			sr.Attempt, sr.MaxAttempts, sr.DiscardPartial, len(sr.Messages))
	}
	if sr.Err.Code != turnstilev1.ErrorCode_ERROR_CODE_SERVER_ERROR || !sr.Err.Retryable {
		t.Errorf("step retry cause = %v (retryable %v), want a retryable SERVER_ERROR", sr.Err, sr.Err.Retryable)
	}
	if got := text(evs, 1); got != "The count is" {
		t.Errorf("attempt 1 streamed %q, want the partial %q", got, "The count is")
	}
	if got := text(evs, 2); got != "The count is 1." {
		t.Errorf("attempt 2 streamed %q, want %q", got, "The count is 1.")
	}

	res := turn.Result()
	if res == nil || turn.Err() != nil {
		t.Fatalf("Result() = %v, Err() = %v", res, turn.Err())
	}
	if res.EndReason != turnstilev1.EndReason_END_REASON_END_TURN || res.Attempts != 2 || res.TurnID != turn.ID() {
		t.Errorf("result = %v attempts %d id %q", res.EndReason, res.Attempts, res.TurnID)
	}
	roles := []turnstilev1.Role{}
	for _, m := range res.Messages {
		roles = append(roles, m.GetRole())
	}
	wantRoles := []turnstilev1.Role{turnstilev1.Role_ROLE_ASSISTANT, turnstilev1.Role_ROLE_TOOL, turnstilev1.Role_ROLE_ASSISTANT}
	if len(roles) != 3 || roles[0] != wantRoles[0] || roles[1] != wantRoles[1] || roles[2] != wantRoles[2] {
		t.Errorf("result messages have roles %v, want %v", roles, wantRoles)
	}
	if got := res.Messages[2].GetParts()[0].GetText(); got != "The count is 1." {
		t.Errorf("final message = %q", got)
	}
	if res.Counters.GetModelCalls() != 3 || res.Counters.GetToolCalls() != 1 {
		t.Errorf("counters = %v, want 3 model calls and 1 tool call", res.Counters)
	}
	log := logs.String()
	for _, want := range []string{"retrying turn step", "turn_id=" + turn.ID(), "attempt=2", "code=SERVER_ERROR", "delay="} {
		if !strings.Contains(log, want) {
			t.Errorf("log %q lacks %q", log, want)
		}
	}
}

func alwaysFail(err *llm.Error) *scripted {
	return &scripted{fn: func(context.Context, int, *llm.Request) iter.Seq2[llm.Chunk, error] {
		return fail(err)
	}}
}

// An error event without retry advice is returned at once.
func TestRetryableUnsetIsNotRetried(t *testing.T) {
	rep := newReplica(t, alwaysFail(serverError()))
	rep.clearRetryable = true
	addr, _ := serve(t, rep)
	c := newClient(t, addr, client.WithMaxStepRetries(3))

	evs, err := collect(t, c.RunTurn(t.Context(), userRequest("hi")))
	var te *client.TurnError
	if !errors.As(err, &te) {
		t.Fatalf("err = %v, want a *client.TurnError", err)
	}
	if te.Code != turnstilev1.ErrorCode_ERROR_CODE_SERVER_ERROR || te.Retryable || te.Attempts != 1 {
		t.Errorf("err = %v (retryable %v, attempts %d), want SERVER_ERROR, not retryable, 1 attempt", te, te.Retryable, te.Attempts)
	}
	if n := len(rep.served()); n != 1 {
		t.Errorf("the server received %d requests, want 1", n)
	}
	if n := len(stepRetries(evs)); n != 0 {
		t.Errorf("got %d step retries, want 0", n)
	}
	last := evs[len(evs)-1].Agent.GetError()
	if last == nil || last.Retryable != nil {
		t.Errorf("last event = %v, want an error event with retryable unset", evs[len(evs)-1].Agent)
	}
}

// An error event with retryable false is returned at once.
func TestNotRetryableIsNotRetried(t *testing.T) {
	rep := newReplica(t, alwaysFail(&llm.Error{Kind: llm.KindInvalidRequest, Message: "messages: bad", StatusCode: 400}))
	addr, _ := serve(t, rep)
	c := newClient(t, addr, client.WithMaxStepRetries(3))

	evs, err := collect(t, c.RunTurn(t.Context(), userRequest("hi")))
	var te *client.TurnError
	if !errors.As(err, &te) {
		t.Fatalf("err = %v, want a *client.TurnError", err)
	}
	if te.Code != turnstilev1.ErrorCode_ERROR_CODE_INVALID_REQUEST || te.Retryable || te.Attempts != 1 || te.Model != "test" {
		t.Errorf("err = %v (retryable %v, attempts %d, model %q), want INVALID_REQUEST, not retryable, 1 attempt, model test",
			te, te.Retryable, te.Attempts, te.Model)
	}
	if te.Status == nil || te.Status.Code() != codes.InvalidArgument {
		t.Errorf("status = %v, want INVALID_ARGUMENT", te.Status)
	}
	if n := len(rep.served()); n != 1 {
		t.Errorf("the server received %d requests, want 1", n)
	}
	if n := len(stepRetries(evs)); n != 0 {
		t.Errorf("got %d step retries, want 0", n)
	}
}

// When every attempt fails, the last failure is returned with the attempts
// made.
func TestRetriesExhausted(t *testing.T) {
	rep := newReplica(t, alwaysFail(serverError()))
	addr, _ := serve(t, rep)
	c := newClient(t, addr, client.WithMaxStepRetries(2))

	turn := c.RunTurn(t.Context(), userRequest("hi"))
	evs, err := collect(t, turn)
	var te *client.TurnError
	if !errors.As(err, &te) {
		t.Fatalf("err = %v, want a *client.TurnError", err)
	}
	if te.Attempts != 3 || !te.Retryable || te.Code != turnstilev1.ErrorCode_ERROR_CODE_SERVER_ERROR || te.TurnID != turn.ID() {
		t.Errorf("err = %v (attempts %d, retryable %v, turn %q), want 3 attempts at a retryable SERVER_ERROR", te, te.Attempts, te.Retryable, te.TurnID)
	}
	if te.Status == nil || te.Status.Code() != codes.Unavailable {
		t.Errorf("status = %v, want UNAVAILABLE", te.Status)
	}
	if len(te.ModelAttempts) != 1 || te.ModelAttempts[0].GetModel() != "test" {
		t.Errorf("model attempts = %v", te.ModelAttempts)
	}
	if !strings.Contains(err.Error(), "after 3 attempts") {
		t.Errorf("Error() = %q, want it to say the attempts", err)
	}
	if turn.Err() != err || turn.Result() != nil {
		t.Errorf("Err() = %v, Result() = %v", turn.Err(), turn.Result())
	}
	served := rep.served()
	if len(served) != 3 {
		t.Fatalf("the server received %d requests, want 3", len(served))
	}
	for i, s := range served {
		if want := string(rune('1' + i)); s.attempt != want || s.req.TurnID != turn.ID() {
			t.Errorf("request %d: attempt %q turn %q, want %q %q", i, s.attempt, s.req.TurnID, want, turn.ID())
		}
	}
	if n := len(stepRetries(evs)); n != 2 {
		t.Errorf("got %d step retries, want 2", n)
	}
}

// A replica killed mid-turn breaks the stream at the transport level; the
// client resumes the turn on the other replica with what was committed.
func TestTransportFailureMovesToAnotherReplica(t *testing.T) {
	tool := &counter{}
	streaming := make(chan struct{})
	p := &scripted{fn: func(ctx context.Context, call int, req *llm.Request) iter.Seq2[llm.Chunk, error] {
		switch call {
		case 1:
			return callTool("call_1", "counter", `{}`)
		case 2:
			return hang(ctx, streaming, "Half an ")
		}
		if !lastIsToolResult(req) {
			return fail(&llm.Error{Kind: llm.KindInvalidRequest, Message: "the tool result was not re-sent"})
		}
		return reply("The count ", "is 1.")
	}}
	// Two replicas of one deployment: separate runners and servers sharing
	// the upstream and the tool's side effects.
	a, b := newReplica(t, p, tool), newReplica(t, p, tool)
	addrA, srvA := serve(t, a)
	addrB, srvB := serve(t, b)
	c := newClient(t, addrA+","+addrB, client.WithMaxStepRetries(2))

	turn := c.RunTurn(t.Context(), userRequest("count once"))
	var evs []*client.Event
	for ev, err := range turn.Events() {
		if err != nil {
			t.Fatalf("turn failed: %v", err)
		}
		evs = append(evs, ev)
		if ev.Attempt == 1 && ev.Agent.GetTextDelta() != nil {
			<-streaming
			// Kill the replica serving the turn.
			if len(a.served()) == 1 {
				srvA.Stop()
			} else {
				srvB.Stop()
			}
		}
	}
	killed, survivor := a, b
	if s := b.served(); len(s) > 0 && s[0].attempt == "1" {
		killed, survivor = b, a
	}
	if k, s := killed.served(), survivor.served(); len(k) != 1 || len(s) != 1 || k[0].attempt != "1" || s[0].attempt != "2" {
		t.Fatalf("killed replica served %d (%v), survivor %d (%v); want attempt 1 then attempt 2", len(k), k, len(s), s)
	}
	resumed := survivor.served()[0].req
	if len(resumed.Messages) != 3 || resumed.Messages[2].Role != llm.RoleTool {
		t.Errorf("the resumed request has %d messages (%+v), want user, assistant, tool", len(resumed.Messages), resumed.Messages)
	}
	if resumed.TurnID != turn.ID() || killed.served()[0].req.TurnID != turn.ID() {
		t.Errorf("turn ids differ across replicas")
	}
	if n := tool.runs.Load(); n != 1 {
		t.Errorf("the tool ran %d times, want 1", n)
	}
	retries := stepRetries(evs)
	if len(retries) != 1 {
		t.Fatalf("got %d step retries, want 1", len(retries))
	}
	if sr := retries[0]; sr.Err.Code != turnstilev1.ErrorCode_ERROR_CODE_UNAVAILABLE || !sr.DiscardPartial || len(sr.Messages) != 2 {
		t.Errorf("step retry = code %v discard %v messages %d, want UNAVAILABLE, true, 2", sr.Err.Code, sr.DiscardPartial, len(sr.Messages))
	}
	res := turn.Result()
	if res == nil || len(res.Messages) != 3 || res.Attempts != 2 {
		t.Fatalf("result = %v", res)
	}
	if got := res.Messages[2].GetParts()[0].GetText(); got != "The count is 1." {
		t.Errorf("final message = %q", got)
	}
}

// Breaking out of the loop cancels the RPC at once and leaves no goroutine
// behind.
func TestBreakCancelsTheTurn(t *testing.T) {
	streaming := make(chan struct{})
	p := &scripted{fn: func(ctx context.Context, call int, _ *llm.Request) iter.Seq2[llm.Chunk, error] {
		if call == 1 {
			return reply("warm")
		}
		return hang(ctx, streaming, "A long ", "story")
	}}
	rep := newReplica(t, p)
	addr, _ := serve(t, rep)
	c := newClient(t, addr)
	// Connect first, so only the turn's goroutines are new.
	if _, err := c.RunTurn(t.Context(), userRequest("warm up")).Wait(); err != nil {
		t.Fatal(err)
	}
	<-rep.ended
	before := goleak.IgnoreCurrent()

	turn := c.RunTurn(t.Context(), userRequest("tell me a story"))
	n := 0
	for ev, err := range turn.Events() {
		if err != nil {
			t.Fatalf("turn failed: %v", err)
		}
		n++
		if ev.Agent.GetTextDelta() != nil {
			<-streaming
			break
		}
	}
	if !errors.Is(turn.Err(), client.ErrStopped) || turn.Result() != nil {
		t.Errorf("after break: Err() = %v, Result() = %v; want ErrStopped", turn.Err(), turn.Result())
	}
	select {
	case err := <-rep.ended:
		if err == nil {
			t.Errorf("the server's turn ended without its context cancelled")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server's turn still runs after the caller broke out")
	}
	goleak.VerifyNone(t, before)
}

// Cancelling the context during a retry delay ends the turn at once.
func TestCancelDuringRetryDelay(t *testing.T) {
	e := serverError()
	e.RetryAfter, e.Hint = 30*time.Second, llm.HintAfter
	rep := newReplica(t, alwaysFail(e))
	addr, _ := serve(t, rep)
	c := newClient(t, addr)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var cancelled time.Time
	turn := c.RunTurn(ctx, userRequest("hi"))
	var err error
	for ev, e := range turn.Events() {
		if e != nil {
			err = e
			break
		}
		if sr := ev.StepRetry; sr != nil {
			if sr.Delay != 30*time.Second {
				t.Errorf("delay = %v, want the server's 30s", sr.Delay)
			}
			cancelled = time.Now()
			cancel()
		}
	}
	if cancelled.IsZero() {
		t.Fatalf("no step retry; err = %v", err)
	}
	if d := time.Since(cancelled); d > 5*time.Second {
		t.Errorf("the turn ended %v after the cancellation", d)
	}
	var te *client.TurnError
	if !errors.As(err, &te) || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want a *client.TurnError wrapping context.Canceled", err)
	}
	if te.Code != turnstilev1.ErrorCode_ERROR_CODE_CANCELLED || te.Attempts != 1 {
		t.Errorf("err = %v (attempts %d), want CANCELLED after 1 attempt", te, te.Attempts)
	}
	if n := len(rep.served()); n != 1 {
		t.Errorf("the server received %d requests, want 1", n)
	}
}

// A server that is not there: the dial failure is a transport failure,
// retried and then returned as a retryable UNAVAILABLE.
func TestNoServer(t *testing.T) {
	rep := newReplica(t, alwaysFail(serverError()))
	addr, _, stop := startServer(rep)
	stop()
	c := newClient(t, addr)
	_, err := c.RunTurn(t.Context(), userRequest("hi")).Wait()
	var te *client.TurnError
	if !errors.As(err, &te) {
		t.Fatalf("err = %v, want a *client.TurnError", err)
	}
	if te.Code != turnstilev1.ErrorCode_ERROR_CODE_UNAVAILABLE || !te.Retryable || te.Attempts != 2 {
		t.Errorf("err = %v (retryable %v, attempts %d), want a retryable UNAVAILABLE after 2 attempts", te, te.Retryable, te.Attempts)
	}
}

// A request the server rejects before any event comes back as a status
// with ErrorInfo: not retried.
func TestInvalidRequestStatus(t *testing.T) {
	rep := newReplica(t, alwaysFail(serverError()))
	addr, _ := serve(t, rep)
	c := newClient(t, addr, client.WithMaxStepRetries(3))
	req := userRequest("hi")
	req.Model = "nope"
	evs, err := collect(t, c.RunTurn(t.Context(), req))
	var te *client.TurnError
	if !errors.As(err, &te) {
		t.Fatalf("err = %v, want a *client.TurnError", err)
	}
	if te.Code != turnstilev1.ErrorCode_ERROR_CODE_INVALID_REQUEST || te.Retryable || te.Attempts != 1 || len(evs) != 0 {
		t.Errorf("err = %v (retryable %v, attempts %d, %d events)", te, te.Retryable, te.Attempts, len(evs))
	}
}

// Concurrent turns on one client.
func TestConcurrentTurns(t *testing.T) {
	p := &scripted{fn: func(context.Context, int, *llm.Request) iter.Seq2[llm.Chunk, error] {
		return reply("ok")
	}}
	addr, _ := serve(t, newReplica(t, p))
	c := newClient(t, addr)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if _, err := c.RunTurn(t.Context(), userRequest("hi")).Wait(); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

// A transport break while a server-side tool runs is not retried: the tool
// may have had its effect, and resuming would run it again.
func TestTransportFailureDuringToolIsNotRetried(t *testing.T) {
	tool := &blocker{started: make(chan struct{})}
	p := &scripted{fn: func(context.Context, int, *llm.Request) iter.Seq2[llm.Chunk, error] {
		return callTool("call_1", "deploy", `{}`)
	}}
	rep := newReplica(t, p, tool)
	addr, srv := serve(t, rep)
	// The server does not come back: the client re-attaches for a second,
	// not the default 30, before it reports the break.
	c := newClient(t, addr, client.WithMaxStepRetries(3), client.WithReattachTimeout(time.Second))

	turn := c.RunTurn(t.Context(), userRequest("deploy it"))
	var err error
	for ev, e := range turn.Events() {
		if e != nil {
			err = e
			break
		}
		if ev.Agent.GetToolStarted() != nil {
			<-tool.started
			srv.Stop()
		}
	}
	var te *client.TurnError
	if !errors.As(err, &te) {
		t.Fatalf("err = %v, want a *client.TurnError", err)
	}
	if te.Code != turnstilev1.ErrorCode_ERROR_CODE_TOOLS_UNSAFE || te.Retryable || te.Attempts != 1 || !strings.Contains(te.Message, "deploy") {
		t.Errorf("err = %v (retryable %v, attempts %d), want TOOLS_UNSAFE naming deploy, not retryable, 1 attempt", te, te.Retryable, te.Attempts)
	}
	// The assistant's tool call has no result: it does not stand.
	if len(te.Messages) != 0 {
		t.Errorf("standing messages = %v, want none", te.Messages)
	}
}

type token string

func (tk token) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(tk)}, nil
}

func (token) RequireTransportSecurity() bool { return false }

// Per-RPC credentials reach the server on every attempt.
func TestPerRPCCredentials(t *testing.T) {
	p := &scripted{fn: func(_ context.Context, call int, _ *llm.Request) iter.Seq2[llm.Chunk, error] {
		if call == 1 {
			return fail(serverError())
		}
		return reply("ok")
	}}
	rep := newReplica(t, p)
	addr, _ := serve(t, rep)
	c := newClient(t, addr, client.WithPerRPCCredentials(token("s3cret")))
	if _, err := c.RunTurn(t.Context(), userRequest("hi")).Wait(); err != nil {
		t.Fatal(err)
	}
	served := rep.served()
	if len(served) != 2 {
		t.Fatalf("the server received %d requests, want 2", len(served))
	}
	for i, s := range served {
		if s.auth != "Bearer s3cret" {
			t.Errorf("request %d: authorization = %q", i, s.auth)
		}
	}
}

// A multi-address target spreads turns over every replica.
func TestMultiAddressTargetSpreadsTurns(t *testing.T) {
	p := &scripted{fn: func(context.Context, int, *llm.Request) iter.Seq2[llm.Chunk, error] {
		return reply("ok")
	}}
	a, b := newReplica(t, p), newReplica(t, p)
	addrA, _ := serve(t, a)
	addrB, _ := serve(t, b)
	c := newClient(t, addrA+", "+addrB)
	for i := 0; i < 50 && (len(a.served()) == 0 || len(b.served()) == 0); i++ {
		if _, err := c.RunTurn(t.Context(), userRequest("hi")).Wait(); err != nil {
			t.Fatal(err)
		}
	}
	if len(a.served()) == 0 || len(b.served()) == 0 {
		t.Errorf("replicas served %d and %d turns, want both some", len(a.served()), len(b.served()))
	}
}
