package client_test

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
)

// gatedReplica returns a replica whose runner serves model "test" on p
// with the tools given, the tool "counter" waiting for approval.
func gatedReplica(t *testing.T, p llm.Provider, tools ...llm.Tool) *replica {
	t.Helper()
	r, err := runtime.New([]*runtime.Model{{
		Alias: "test", ProviderName: "scripted", Provider: p, ID: "scripted-1",
		Retry: policy.Retry{MaxRetries: 0, Multiplier: 1},
	}}, "test", tools, runtime.WithToolRules(runtime.ToolRules{RequireApproval: []string{"counter"}}))
	if err != nil {
		t.Fatal(err)
	}
	return &replica{Runner: r, ended: make(chan error, 8)}
}

// kindsOf names the payload of each server event, "step_retry" for the
// client's.
func kindsOf(evs []*client.Event) []string {
	var out []string
	for _, ev := range evs {
		if ev.StepRetry != nil {
			out = append(out, "step_retry")
			continue
		}
		m := ev.Agent.ProtoReflect()
		out = append(out, string(m.WhichOneof(m.Descriptor().Oneofs().ByName("payload")).Name()))
	}
	return out
}

// withoutDeltas drops the streaming and bookkeeping events, leaving the
// steps a test asserts the order of.
func withoutDeltas(kinds []string) []string {
	return slices.DeleteFunc(slices.Clone(kinds), func(k string) bool {
		switch k {
		case "text_delta", "thinking_delta", "tool_call_delta", "usage", "llm_call_started", "llm_call_finished", "turn_started":
			return true
		}
		return false
	})
}

// askScript asks for the counter on the first model call and answers
// with text after; it records each request the model received.
type askScript struct {
	mu   sync.Mutex
	reqs []*llm.Request
}

func (s *askScript) provider() *scripted {
	return &scripted{fn: func(_ context.Context, call int, req *llm.Request) iter.Seq2[llm.Chunk, error] {
		s.mu.Lock()
		s.reqs = append(s.reqs, req)
		s.mu.Unlock()
		if call == 1 {
			return callTool("call_1", "counter", `{"by":1}`)
		}
		return reply("Done.")
	}}
}

// lastToolResult returns the content of the last tool result the model
// was sent.
func (s *askScript) lastToolResult() (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	req := s.reqs[len(s.reqs)-1]
	for _, m := range slices.Backward(req.Messages) {
		for _, p := range m.Parts {
			if p.ToolResult != nil {
				return p.ToolResult.Content, p.ToolResult.IsError
			}
		}
	}
	return "", false
}

// TestOnApprovalApproves: the hook sees the request once, with the call's
// tool and arguments; its approval runs the tool once and the turn goes on.
func TestOnApprovalApproves(t *testing.T) {
	// Registered first, it runs after the server and client are stopped.
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	tool, s := &counter{}, &askScript{}
	addr, _ := serve(t, gatedReplica(t, s.provider(), tool))
	c := newClient(t, addr)

	var asked []*turnstilev1.ToolApprovalRequested
	turn := c.RunTurn(t.Context(), userRequest("count"), client.OnApproval(
		func(_ context.Context, req *turnstilev1.ToolApprovalRequested) (client.Decision, error) {
			asked = append(asked, req)
			return client.Decision{Approved: true, Reason: "fine"}, nil
		}))
	var evs []*client.Event
	for ev, err := range turn.Events() {
		if err != nil {
			t.Fatalf("turn failed: %v", err)
		}
		evs = append(evs, ev)
	}
	if len(asked) != 1 || asked[0].GetCallId() != "call_1" || asked[0].GetName() != "counter" || asked[0].GetArguments() != `{"by":1}` {
		t.Fatalf("asked %v", asked)
	}
	want := []string{"message_completed", "tool_approval_requested", "tool_approval_decided",
		"tool_started", "tool_finished", "message_completed", "message_completed", "turn_completed"}
	if got := withoutDeltas(kindsOf(evs)); !slices.Equal(got, want) {
		t.Errorf("events %v\nwant %v", got, want)
	}
	for _, ev := range evs {
		if d := ev.Agent.GetToolApprovalDecided(); d != nil && (!d.GetApproved() || d.GetReason() != "fine" || d.GetTimedOut()) {
			t.Errorf("decided %v", d)
		}
	}
	if n := tool.runs.Load(); n != 1 {
		t.Errorf("the tool ran %d times, want 1", n)
	}
	res := turn.Result()
	if got := res.Counters; got.GetApprovalsRequested() != 1 || got.GetApprovalsDenied() != 0 {
		t.Errorf("counters %v", got)
	}
}

// TestOnApprovalDenies: a denial never runs the tool; the model's next
// request carries an error result with the reason.
func TestOnApprovalDenies(t *testing.T) {
	tool, s := &counter{}, &askScript{}
	addr, _ := serve(t, gatedReplica(t, s.provider(), tool))
	c := newClient(t, addr)

	turn := c.RunTurn(t.Context(), userRequest("count"), client.OnApproval(
		func(context.Context, *turnstilev1.ToolApprovalRequested) (client.Decision, error) {
			return client.Decision{Reason: "not today"}, nil
		}))
	var evs []*client.Event
	for ev, err := range turn.Events() {
		if err != nil {
			t.Fatalf("turn failed: %v", err)
		}
		evs = append(evs, ev)
	}
	want := []string{"message_completed", "tool_approval_requested", "tool_approval_decided",
		"tool_finished", "message_completed", "message_completed", "turn_completed"}
	if got := withoutDeltas(kindsOf(evs)); !slices.Equal(got, want) {
		t.Errorf("events %v\nwant %v", got, want)
	}
	if n := tool.runs.Load(); n != 0 {
		t.Errorf("the tool ran %d times, want 0", n)
	}
	content, isErr := s.lastToolResult()
	if !isErr || !strings.Contains(content, "not today") {
		t.Errorf("the model got the result %q (error %v), want the denial's reason", content, isErr)
	}
	if got := turn.Result().Counters; got.GetApprovalsRequested() != 1 || got.GetApprovalsDenied() != 1 {
		t.Errorf("counters %v", got)
	}
}

// TestOnApprovalErrorCancelsTheTurn: a hook that fails cancels the turn;
// the tool never runs and the hook's error is the turn's cause.
func TestOnApprovalErrorCancelsTheTurn(t *testing.T) {
	tool, s := &counter{}, &askScript{}
	addr, _ := serve(t, gatedReplica(t, s.provider(), tool))
	c := newClient(t, addr)
	boom := errors.New("the approver is away")
	turn := c.RunTurn(t.Context(), userRequest("count"), client.OnApproval(
		func(context.Context, *turnstilev1.ToolApprovalRequested) (client.Decision, error) {
			return client.Decision{}, boom
		}))
	_, err := turn.Wait()
	var te *client.TurnError
	if !errors.As(err, &te) || te.Code != turnstilev1.ErrorCode_ERROR_CODE_CANCELLED || !errors.Is(err, boom) {
		t.Fatalf("err = %v, want CANCELLED caused by the hook's error", err)
	}
	if n := tool.runs.Load(); n != 0 {
		t.Errorf("the tool ran %d times, want 0", n)
	}
}

// TestApproveFromElsewhere: without a hook, another goroutine decides the
// call with Turn.Approve; deciding it again, through a client of another
// replica sharing the store, is not applied and returns the decision that
// stands.
func TestApproveFromElsewhere(t *testing.T) {
	tool, s := &counter{}, &askScript{}
	p := s.provider()
	stores := sharedStores(t, 2)
	c := newClient(t, serveDurable(t, gatedReplica(t, p, tool), stores[0]))
	other := newClient(t, serveDurable(t, gatedReplica(t, p, tool), stores[1]))
	turn := c.RunTurn(t.Context(), userRequest("count"))
	if _, err := turn.Approve(t.Context(), "call_1", client.Decision{Approved: true}); !errors.Is(err, client.ErrNotStarted) {
		t.Errorf("Approve before the first event = %v, want ErrNotStarted", err)
	}
	var again atomic.Pointer[turnstilev1.ApproveToolCallResponse]
	var wg sync.WaitGroup
	for ev, err := range turn.Events() {
		if err != nil {
			t.Fatalf("turn failed: %v", err)
		}
		if r := ev.Agent.GetToolApprovalRequested(); r != nil {
			wg.Go(func() {
				applied, err := turn.Approve(context.Background(), r.GetCallId(), client.Decision{Approved: true})
				if err != nil || !applied {
					t.Errorf("Approve = %v, %v", applied, err)
				}
				resp, err := other.ApproveToolCall(context.Background(), &turnstilev1.ApproveToolCallRequest{
					TurnId: turn.ID(), CallId: r.GetCallId(), Approved: false, Reason: "changed my mind",
				})
				if err != nil {
					t.Errorf("ApproveToolCall again: %v", err)
				}
				again.Store(resp)
			})
		}
	}
	wg.Wait()
	if n := tool.runs.Load(); n != 1 {
		t.Errorf("the tool ran %d times, want 1", n)
	}
	if r := again.Load(); r == nil || r.GetApplied() || !r.GetApproved() || r.GetAttempt() != 1 {
		t.Errorf("second decision = %v, want not applied, approved standing, attempt 1", r)
	}
}

// TestApproveToolCallErrors: the plain call returns the server's status
// wrapped, for status.Code.
func TestApproveToolCallErrors(t *testing.T) {
	tool, s := &counter{}, &askScript{}
	addr, _ := serve(t, gatedReplica(t, s.provider(), tool))
	c := newClient(t, addr)
	_, err := c.ApproveToolCall(t.Context(), &turnstilev1.ApproveToolCallRequest{TurnId: "t1"})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "call_id") {
		t.Errorf("no call_id: %v", err)
	}
	res, err := c.RunTurn(t.Context(), userRequest("count"), client.OnApproval(
		func(context.Context, *turnstilev1.ToolApprovalRequested) (client.Decision, error) {
			return client.Decision{Approved: true}, nil
		})).Wait()
	if err != nil {
		t.Fatal(err)
	}
	// Without a turn log the server holds only running turns.
	_, err = c.ApproveToolCall(t.Context(), &turnstilev1.ApproveToolCallRequest{TurnId: res.TurnID, Attempt: 1, CallId: "call_1", Approved: true})
	if c := status.Code(err); c != codes.FailedPrecondition && c != codes.NotFound {
		t.Errorf("deciding a finished turn's call: %v", err)
	}
}

// stepTool is a server-side tool that closes started and returns once
// release is closed.
type stepTool struct {
	started, release chan struct{}
}

func (s *stepTool) Spec() llm.ToolSpec {
	return llm.ToolSpec{Name: "step", Description: "Does one step."}
}

func (s *stepTool) Call(ctx context.Context, _ llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
	close(s.started)
	select {
	case <-s.release:
	case <-ctx.Done():
		return llm.ToolOutput{}, ctx.Err()
	}
	return llm.ToolOutput{Content: "stepped"}, nil
}

// TestSteerWhileAToolRuns: a message steered from another goroutine while
// a tool runs reaches the next model request, is committed, and is in the
// result's messages; steering the finished turn is FAILED_PRECONDITION.
func TestSteerWhileAToolRuns(t *testing.T) {
	tool := &stepTool{started: make(chan struct{}), release: make(chan struct{})}
	var mu sync.Mutex
	var second *llm.Request
	p := &scripted{fn: func(_ context.Context, call int, req *llm.Request) iter.Seq2[llm.Chunk, error] {
		if call == 1 {
			return callTool("call_1", "step", `{}`)
		}
		mu.Lock()
		second = req
		mu.Unlock()
		return reply("Staging it is.")
	}}
	addr, _ := serve(t, newReplica(t, p, tool))
	c := newClient(t, addr)
	turn := c.RunTurn(t.Context(), userRequest("deploy"))
	if err := turn.Steer(t.Context(), "too early"); !errors.Is(err, client.ErrNotStarted) {
		t.Errorf("Steer before the first event = %v, want ErrNotStarted", err)
	}
	evs := steerWhileToolRuns(t, turn, tool)
	got := withoutDeltas(kindsOf(evs))
	i := slices.Index(got, "steered")
	if i < 0 || slices.Index(got, "tool_finished") < 0 {
		t.Fatalf("events %v: no steered or tool_finished", got)
	}
	var steeredMsg *turnstilev1.Message
	for _, ev := range evs {
		if s := ev.Agent.GetSteered(); s != nil {
			steeredMsg = s.GetMessage()
		}
	}
	if steeredMsg.GetParts()[0].GetText() != "use staging instead" {
		t.Errorf("steered %v", steeredMsg)
	}
	mu.Lock()
	req := second
	mu.Unlock()
	if req == nil || req.Messages[len(req.Messages)-1].Text() != "use staging instead" {
		t.Errorf("the second model request does not end with the steering message: %+v", req)
	}
	res := turn.Result()
	if !slices.ContainsFunc(res.Messages, func(m *turnstilev1.Message) bool { return proto.Equal(m, steeredMsg) }) {
		t.Errorf("the result's messages lack the steering message")
	}
	if res.Counters.GetSteered() != 1 {
		t.Errorf("counters %v", res.Counters)
	}
	_, err := c.SteerTurn(t.Context(), &turnstilev1.SteerTurnRequest{TurnId: turn.ID(), Attempt: 1, Message: steeredMsg})
	if code := status.Code(err); code != codes.FailedPrecondition && code != codes.NotFound {
		t.Errorf("steering a finished turn: %v", err)
	}
}

// cutConns cuts every connection p forwards, and goes on taking new ones,
// as a load balancer restarting would.
func cutConns(p *proxy) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestQuietReattachedStreamOutlastsTheTimeout: a turn waits for approval
// longer than the re-attach timeout on a stream re-attached to another
// replica, and that stream breaks too: the client takes it for a break of
// its own and re-attaches again, rather than giving the attempt up as the
// first break's clock would say. The decision, made meanwhile on a
// replica, reaches the turn, which runs the tool once and completes.
func TestQuietReattachedStreamOutlastsTheTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	tool, s := &counter{}, &askScript{}
	p := s.provider()
	stores := sharedStores(t, 2)
	a, b := gatedReplica(t, p, tool), gatedReplica(t, p, tool)
	addrA, addrB := serveDurable(t, a, stores[0]), serveDurable(t, b, stores[1])
	pa, pb := newProxy(t, addrA), newProxy(t, addrB)
	var logs lockedBuffer
	c := newClient(t, pa.addr()+","+pb.addr(), client.WithMaxStepRetries(0), client.WithReattachTimeout(timeout),
		client.WithReattachBackoff(client.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond, Multiplier: 2}),
		client.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))

	turn := c.RunTurn(t.Context(), userRequest("count"))
	var wg sync.WaitGroup
	var evs []*client.Event
	for ev, err := range turn.Events() {
		if err != nil {
			t.Fatalf("turn failed: %v\nclient log:\n%s", err, logs.String())
		}
		evs = append(evs, ev)
		r := ev.Agent.GetToolApprovalRequested()
		if r == nil {
			continue
		}
		// Cut the owner off: the client re-attaches on the other
		// replica, whose stream stays quiet while the call waits.
		owner, watcher, watcherAddr := pa, pb, addrB
		if len(a.served()) == 0 {
			owner, watcher, watcherAddr = pb, pa, addrA
		}
		owner.close()
		wg.Go(func() {
			for !strings.Contains(logs.String(), "re-attaching to the turn") {
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(3 * timeout)
			cutConns(watcher)
			resp, err := newClient(t, watcherAddr).ApproveToolCall(context.Background(), &turnstilev1.ApproveToolCallRequest{
				TurnId: turn.ID(), Attempt: 1, CallId: r.GetCallId(), Approved: true,
			})
			if err != nil || !resp.GetApplied() {
				t.Errorf("ApproveToolCall = %v, %v", resp, err)
			}
		})
	}
	wg.Wait()
	if n := strings.Count(logs.String(), "re-attaching to the turn"); n < 2 {
		t.Errorf("%d re-attaches, want at least 2; client log:\n%s", n, logs.String())
	}
	if n := len(stepRetries(evs)); n != 0 {
		t.Errorf("%d step retries, want 0", n)
	}
	if n := tool.runs.Load(); n != 1 {
		t.Errorf("the tool ran %d times, want 1", n)
	}
	if res := turn.Result(); res == nil || res.Attempts != 1 {
		t.Errorf("result = %+v", res)
	}
}

// TestOnApprovalOnceAcrossATakeover: the replica running a turn dies while
// the hook decides its call; the replica that takes the turn over emits
// the request again. The hook's decision reaches the new owner (the
// client makes the call again while no replica answers), the client
// re-attaches, and the request emitted again does not call the hook a
// second time: the tool runs once.
func TestOnApprovalOnceAcrossATakeover(t *testing.T) {
	tool, s := &counter{}, &askScript{}
	p := s.provider()
	stores := sharedStores(t, 2)
	a, b := gatedReplica(t, p, tool), gatedReplica(t, p, tool)
	addrA, addrB := serveDurable(t, a, stores[0]), serveDurable(t, b, stores[1])
	pa, pb := newProxy(t, addrA), newProxy(t, addrB)
	c := newClient(t, pa.addr()+","+pb.addr())

	var calls atomic.Int32
	req := userRequest("count")
	req.TurnId = "takeover-1"
	turn := c.RunTurn(t.Context(), req, client.OnApproval(
		func(ctx context.Context, req *turnstilev1.ToolApprovalRequested) (client.Decision, error) {
			if calls.Add(1) > 1 {
				return client.Decision{Reason: "asked twice"}, nil
			}
			// Kill the owner: its store and its clients' connections.
			ownerStore, ownerProxy, otherAddr := stores[0], pa, addrB
			if len(a.served()) == 0 {
				ownerStore, ownerProxy, otherAddr = stores[1], pb, addrA
			}
			ownerStore.Close()
			ownerProxy.close()
			// Decide once the other replica asked again.
			rpc := turnstilev1.NewAgentServiceClient(newClient(t, otherAddr).Conn())
			for asked := 0; asked < 2; {
				asked = 0
				w, err := rpc.WatchTurn(ctx, &turnstilev1.WatchTurnRequest{TurnId: "takeover-1", Attempt: 1})
				if err != nil {
					return client.Decision{}, err
				}
				for {
					r, err := w.Recv()
					if err != nil {
						break
					}
					if r.GetEvent().GetToolApprovalRequested() != nil {
						if asked++; asked == 2 {
							break
						}
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
			return client.Decision{Approved: true}, nil
		}))
	var requested int
	for ev, err := range turn.Events() {
		if err != nil {
			t.Fatalf("turn failed: %v", err)
		}
		if ev.Agent.GetToolApprovalRequested() != nil {
			requested++
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the hook was called %d times, want 1", n)
	}
	if requested != 2 {
		t.Errorf("%d tool_approval_requested events, want 2 (the new owner's again)", requested)
	}
	if n := tool.runs.Load(); n != 1 {
		t.Errorf("the tool ran %d times, want 1", n)
	}
}

// steerWhileToolRuns reads turn's events, steering it with "use staging
// instead" once tool has started, then letting the tool finish; it
// returns the events.
func steerWhileToolRuns(t *testing.T, turn *client.Turn, tool *stepTool) []*client.Event {
	t.Helper()
	var wg sync.WaitGroup
	var evs []*client.Event
	for ev, err := range turn.Events() {
		if err != nil {
			t.Fatalf("turn failed: %v", err)
		}
		evs = append(evs, ev)
		if ev.Agent.GetToolStarted() != nil {
			wg.Go(func() {
				<-tool.started
				if err := turn.Steer(context.Background(), "use staging instead"); err != nil {
					t.Errorf("Steer: %v", err)
				}
				close(tool.release)
			})
		}
	}
	wg.Wait()
	return evs
}
