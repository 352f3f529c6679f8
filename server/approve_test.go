package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/tools/mcp"
)

// opsMCP is an in-process MCP server over streamable HTTP whose tools
// count their runs: deploy (a side effect), finish (ends turns where the
// rules say so) and slow (returns once release is closed).
type opsMCP struct {
	deploys, finishes, slows atomic.Int32
	release                  chan struct{}
	url                      string
}

func newOpsMCP(t *testing.T) *opsMCP {
	t.Helper()
	o := &opsMCP{release: make(chan struct{})}
	s := sdk.NewServer(&sdk.Implementation{Name: "ops", Version: "1"}, nil)
	schema := json.RawMessage(`{"type":"object","properties":{"env":{"type":"string"}}}`)
	s.AddTool(&sdk.Tool{Name: "deploy", Description: "Deploys.", InputSchema: schema},
		func(_ context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			o.deploys.Add(1)
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "deployed " + string(req.Params.Arguments)}}}, nil
		})
	s.AddTool(&sdk.Tool{Name: "finish", Description: "Files the report.", InputSchema: schema},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			o.finishes.Add(1)
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "filed"}}}, nil
		})
	s.AddTool(&sdk.Tool{Name: "slow", Description: "Waits.", InputSchema: schema, Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, _ *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			o.slows.Add(1)
			select {
			case <-o.release:
			case <-ctx.Done():
			}
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "waited"}}}, nil
		})
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, nil)
	hs := httptest.NewServer(h)
	t.Cleanup(func() {
		for ss := range s.Sessions() {
			_ = ss.Close()
		}
		hs.CloseClientConnections()
		hs.Close()
	})
	o.url = hs.URL
	return o
}

// tools connects to o as turnstile does and returns its tools.
func (o *opsMCP) tools(t *testing.T) []llm.Tool {
	t.Helper()
	ts, err := mcp.New(t.Context(), []mcp.ServerConfig{{Name: "ops", URL: o.url}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ts.Close() })
	return ts.Tools()
}

// hitlRunner runs the model "sim" on u with o's tools and the rules.
func hitlRunner(t *testing.T, u *upstream, o *opsMCP, rules runtime.ToolRules, edit func(*runtime.Limits)) *runtime.Runner {
	t.Helper()
	retry := policy.DefaultRetry()
	retry.InitialBackoff, retry.MaxBackoff = time.Millisecond, time.Millisecond
	limits := runtime.DefaultLimits()
	if edit != nil {
		edit(&limits)
	}
	r, err := runtime.New([]*runtime.Model{{Alias: "sim", ProviderName: "up", Provider: u.provider(t), ID: "gpt-test", Retry: retry}}, "sim",
		o.tools(t), runtime.WithToolRules(rules), runtime.WithLimits(limits))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// callsReply streams a complete reply calling each tool of calls, given
// as id, name and arguments in turn.
func callsReply(calls ...string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i+2 < len(calls); i += 3 {
			a, _ := json.Marshal(calls[i+2])
			role := ""
			if i == 0 {
				role = `"role":"assistant","content":null,`
			}
			idx := string(rune('0' + i/3))
			sse(w, chunk(`{`+role+`"tool_calls":[{"index":`+idx+`,"id":"`+calls[i]+`","type":"function","function":{"name":"`+calls[i+1]+`","arguments":`+string(a)+`}}]}`, ""))
		}
		sse(w, chunk(`{}`, "tool_calls"))
		sse(w, usageChunk)
		sse(w, "[DONE]")
	}
}

// toolContents returns the content of each tool message of a recorded
// chat request, in order.
func toolContents(req chatRequest) []string {
	var out []string
	for _, m := range req.Messages {
		if m.Role == "tool" {
			s, _ := m.Content.(string)
			out = append(out, s)
		}
	}
	return out
}

// untilPayload returns a stream stop test for the first event with the
// named payload (as wiretest.Names names it).
func untilPayload(name string) func(*turnstilev1.AgentEvent) bool {
	return func(ev *turnstilev1.AgentEvent) bool {
		return strings.TrimPrefix(fmt.Sprintf("%T", ev.GetPayload()), "*turnstilev1.AgentEvent_") == name
	}
}

func approve(t *testing.T, ctx context.Context, c turnstilev1.AgentServiceClient, callID string, ok bool, reason string) (*turnstilev1.ApproveToolCallResponse, error) {
	t.Helper()
	return c.ApproveToolCall(ctx, &turnstilev1.ApproveToolCallRequest{TurnId: "turn-1", CallId: callID, Approved: ok, Reason: reason})
}

func TestApproval(t *testing.T) {
	t.Parallel()
	head := "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolApprovalRequested ToolApprovalDecided"
	tail := "MessageCompleted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
	tests := []struct {
		name     string
		approved bool
		reason   string
		timeout  time.Duration
		events   string
		deploys  int32
		result   string // the tool result the model's next request carries
		counters *turnstilev1.TurnCounters
	}{
		{
			name: "approved", approved: true, reason: "go ahead", deploys: 1,
			events: head + " ToolStarted ToolFinished " + tail, result: `deployed {"env":"prod"}`,
			counters: &turnstilev1.TurnCounters{ModelCalls: 2, ToolCalls: 1, ApprovalsRequested: 1},
		},
		{
			name: "denied", reason: "not on a friday", deploys: 0,
			events: head + " ToolFinished " + tail, result: "denied by the user: not on a friday",
			counters: &turnstilev1.TurnCounters{ModelCalls: 2, ToolCalls: 1, ToolErrors: 1, ApprovalsRequested: 1, ApprovalsDenied: 1},
		},
		{
			name: "timed out", timeout: 300 * time.Millisecond, deploys: 0,
			events: head + " ToolFinished " + tail, result: "denied: nobody decided within the approval timeout (300ms, turn.approval_timeout)",
			counters: &turnstilev1.TurnCounters{ModelCalls: 2, ToolCalls: 1, ToolErrors: 1, ApprovalsRequested: 1, ApprovalsDenied: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			u := newUpstream(t, callsReply("c1", "deploy", `{"env":"prod"}`), textReply("done"))
			o := newOpsMCP(t)
			r := hitlRunner(t, u, o, runtime.ToolRules{RequireApproval: []string{"deploy"}}, func(l *runtime.Limits) {
				if tt.timeout > 0 {
					l.ApprovalTimeout = tt.timeout
				}
			})
			ts := start(t, r, server.Options{Store: memStore(t), Keys: []server.Key{keyed("alice", "tok-a"), keyed("bob", "tok-b")}})
			ctx := bearer(t.Context(), "tok-a")
			stream, err := ts.client.RunTurn(ctx, hello())
			if err != nil {
				t.Fatal(err)
			}
			evs := until(t, stream, untilPayload("ToolApprovalRequested"))
			req := evs[len(evs)-1].GetToolApprovalRequested()
			if req.GetCallId() != "c1" || req.GetName() != "deploy" || req.GetArguments() != `{"env":"prod"}` || req.GetDeadline() == nil {
				t.Fatalf("tool_approval_requested = %v", req)
			}
			if tt.timeout == 0 {
				// Another key's turn ids are not the caller's.
				_, err := approve(t, bearer(t.Context(), "tok-b"), ts.client, "c1", true, "")
				if st := status.Convert(err); st.Code() != codes.NotFound {
					t.Fatalf("another key's ApproveToolCall: %v, want NOT_FOUND", st)
				}
				// A call the turn never asked about.
				_, err = approve(t, ctx, ts.client, "c9", true, "")
				if st := status.Convert(err); st.Code() != codes.NotFound {
					t.Fatalf("ApproveToolCall of an unknown call: %v, want NOT_FOUND", st)
				}
				resp, err := approve(t, ctx, ts.client, "c1", tt.approved, tt.reason)
				if err != nil || !resp.GetApplied() || resp.GetApproved() != tt.approved || resp.GetAttempt() != 1 {
					t.Fatalf("ApproveToolCall = %v, %v", resp, err)
				}
				// Again, the other way: the first decision stands.
				again, err := approve(t, ctx, ts.client, "c1", !tt.approved, "changed my mind")
				if err != nil || again.GetApplied() || again.GetApproved() != tt.approved || again.GetSeq() != resp.GetSeq() {
					t.Fatalf("second ApproveToolCall = %v, %v; want applied false, approved %v, seq %d", again, err, tt.approved, resp.GetSeq())
				}
			}
			more, st := rest(stream)
			evs = append(evs, more...)
			if st.Code() != codes.OK {
				t.Fatalf("status %v after %s", st, wiretest.Names(evs))
			}
			if got := wiretest.Names(evs); got != tt.events {
				t.Errorf("events:\n got %s\nwant %s", got, tt.events)
			}
			for _, ev := range evs {
				if d := ev.GetToolApprovalDecided(); d != nil {
					want := &turnstilev1.ToolApprovalDecided{CallId: "c1", Name: "deploy", Approved: tt.approved, Reason: tt.reason, DecidedBy: "alice"}
					if tt.timeout > 0 {
						want = &turnstilev1.ToolApprovalDecided{CallId: "c1", Name: "deploy", TimedOut: true, Reason: "nobody decided within the approval timeout (300ms, turn.approval_timeout)"}
					}
					if d.String() != want.String() {
						t.Errorf("tool_approval_decided = %v, want %v", d, want)
					}
				}
			}
			if n := o.deploys.Load(); n != tt.deploys {
				t.Errorf("deploy ran %d times, want %d", n, tt.deploys)
			}
			calls := u.calls()
			if len(calls) != 2 {
				t.Fatalf("upstream got %d requests, want 2", len(calls))
			}
			if got := toolContents(calls[1]); len(got) != 1 || got[0] != tt.result {
				t.Errorf("the model's next request carries tool results %q, want [%q]", got, tt.result)
			}
			tc := evs[len(evs)-1].GetTurnCompleted()
			if tc.GetCounters().String() != tt.counters.String() {
				t.Errorf("counters = %v, want %v", tc.GetCounters(), tt.counters)
			}
			// The turn has ended: its decision stands, a call it never
			// asked about is not found, a steer is refused.
			again, err := approve(t, ctx, ts.client, "c1", !tt.approved, "")
			if err != nil || again.GetApplied() || again.GetApproved() != tt.approved {
				t.Errorf("ApproveToolCall after the end = %v, %v; want the standing decision", again, err)
			}
			_, err = approve(t, ctx, ts.client, "c9", true, "")
			if st := status.Convert(err); st.Code() != codes.NotFound {
				t.Errorf("ApproveToolCall of an unknown call after the end: %v, want NOT_FOUND", st)
			}
			_, err = ts.client.SteerTurn(ctx, &turnstilev1.SteerTurnRequest{TurnId: "turn-1", Message: wiretest.UserText("wait")[0]})
			if st := status.Convert(err); st.Code() != codes.FailedPrecondition {
				t.Errorf("SteerTurn of a finished turn: %v, want FAILED_PRECONDITION", st)
			}
		})
	}
}

func TestApprovalInvalidArgument(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, textReply("hi"))
	ts := start(t, hitlRunner(t, u, newOpsMCP(t), runtime.ToolRules{}, nil), server.Options{Store: memStore(t)})
	long := strings.Repeat("x", 4097)
	_, err := ts.client.ApproveToolCall(t.Context(), &turnstilev1.ApproveToolCallRequest{Reason: long})
	wantFields(t, err, "turn_id", "call_id", "reason")
	_, err = ts.client.SteerTurn(t.Context(), &turnstilev1.SteerTurnRequest{TurnId: "t", Message: &turnstilev1.Message{
		Role: turnstilev1.Role_ROLE_ASSISTANT, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_ToolCall{ToolCall: &turnstilev1.ToolCall{Id: "x", Name: "y"}}}},
	}})
	wantFields(t, err, "message.role", "message.parts[0]")
	_, err = ts.client.SteerTurn(t.Context(), &turnstilev1.SteerTurnRequest{})
	wantFields(t, err, "turn_id", "message")
	_, err = ts.client.SteerTurn(t.Context(), &turnstilev1.SteerTurnRequest{TurnId: "t", Message: wiretest.UserText(strings.Repeat("x", 257<<10))[0]})
	wantFields(t, err, "message.parts")
	_, err = ts.client.SteerTurn(t.Context(), &turnstilev1.SteerTurnRequest{TurnId: "nope", Message: wiretest.UserText("hi")[0]})
	if st := status.Convert(err); st.Code() != codes.NotFound {
		t.Errorf("SteerTurn of an unknown turn: %v, want NOT_FOUND", st)
	}
}

// TestApprovalNeedsAKey calls both RPCs without a client key, and with a
// request over max_request_bytes: the interceptors and the codec answer
// them as they answer CancelTurn.
func TestApprovalNeedsAKey(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, textReply("hi"))
	ts := start(t, hitlRunner(t, u, newOpsMCP(t), runtime.ToolRules{}, nil), server.Options{
		Store: memStore(t), Keys: []server.Key{keyed("alice", "tok-a")}, MaxRequestBytes: 64 << 10,
	})
	_, err := ts.client.ApproveToolCall(t.Context(), &turnstilev1.ApproveToolCallRequest{TurnId: "t", CallId: "c"})
	if st := status.Convert(err); st.Code() != codes.Unauthenticated {
		t.Errorf("ApproveToolCall without a key: %v, want UNAUTHENTICATED", st)
	}
	_, err = ts.client.SteerTurn(t.Context(), &turnstilev1.SteerTurnRequest{TurnId: "t", Message: wiretest.UserText("hi")[0]})
	if st := status.Convert(err); st.Code() != codes.Unauthenticated {
		t.Errorf("SteerTurn without a key: %v, want UNAUTHENTICATED", st)
	}
	big := wiretest.UserText(strings.Repeat("x", 70<<10))[0]
	_, err = ts.client.SteerTurn(bearer(t.Context(), "tok-a"), &turnstilev1.SteerTurnRequest{TurnId: "t", Message: big})
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || reasonOf(st) != "REQUEST_TOO_LARGE" {
		t.Errorf("SteerTurn over max_request_bytes: %v, want RESOURCE_EXHAUSTED REQUEST_TOO_LARGE", st)
	}
}

// wantFields checks that err is INVALID_ARGUMENT whose BadRequest names
// exactly fields.
func wantFields(t *testing.T, err error, fields ...string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("status %v, want INVALID_ARGUMENT", st)
	}
	var got []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				got = append(got, v.GetField())
			}
		}
	}
	if strings.Join(got, ",") != strings.Join(fields, ",") {
		t.Errorf("violations %v, want %v (%v)", got, fields, st.Message())
	}
}

func TestSteering(t *testing.T) {
	t.Parallel()
	// The model calls slow and deploy; one tool runs at a time, so deploy
	// has not started when the message comes during slow.
	u := newUpstream(t, callsReply("c1", "slow", `{}`, "c2", "deploy", `{"env":"prod"}`), textReply("staging it is"))
	o := newOpsMCP(t)
	r := hitlRunner(t, u, o, runtime.ToolRules{}, func(l *runtime.Limits) { l.ToolConcurrency = 1 })
	ts := start(t, r, server.Options{Store: memStore(t)})
	stream, err := ts.client.RunTurn(t.Context(), hello())
	if err != nil {
		t.Fatal(err)
	}
	evs := until(t, stream, untilPayload("ToolStarted"))
	resp, err := ts.client.SteerTurn(t.Context(), &turnstilev1.SteerTurnRequest{TurnId: "turn-1", Message: wiretest.UserText("use staging instead")[0]})
	if err != nil {
		t.Fatal(err)
	}
	close(o.release)
	more, st := rest(stream)
	evs = append(evs, more...)
	if st.Code() != codes.OK {
		t.Fatalf("status %v after %s", st, wiretest.Names(evs))
	}
	want := "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted Steered ToolFinished ToolFinished " +
		"MessageCompleted MessageCompleted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
	if got := wiretest.Names(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	if s := evs[resp.GetSeq()-1]; s.GetSteered() == nil || textOf(s.GetSteered().GetMessage()) != "use staging instead" {
		t.Errorf("event %d = %v, want the steered message", resp.GetSeq(), s)
	}
	if n := o.deploys.Load(); n != 0 {
		t.Errorf("deploy ran %d times after the user redirected the turn", n)
	}
	calls := u.calls()
	if len(calls) != 2 {
		t.Fatalf("upstream got %d requests, want 2", len(calls))
	}
	next := calls[1].Messages
	if got := toolContents(calls[1]); len(got) != 2 || got[0] != "waited" || got[1] != runtime.SkippedToolResult {
		t.Errorf("tool results %q, want waited and skipped", got)
	}
	if last := next[len(next)-1]; last.Role != "user" || !strings.Contains(contentText(last.Content), "use staging instead") {
		t.Errorf("the next model request ends with %+v, want the steering message", last)
	}
	tc := evs[len(evs)-1].GetTurnCompleted()
	if n := len(tc.GetMessages()); n != 4 || textOf(tc.GetMessages()[2]) != "use staging instead" {
		t.Errorf("turn_completed.messages = %v, want the steering message third of 4", tc.GetMessages())
	}
	if tc.GetCounters().GetSteered() != 1 {
		t.Errorf("counters = %v, want steered 1", tc.GetCounters())
	}
}

// contentText returns a chat message's content as text (a string or
// parts).
func contentText(c any) string {
	b, _ := json.Marshal(c)
	return string(b)
}

func TestEndsTurn(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, callsReply("c1", "finish", `{}`), textReply("never"))
	o := newOpsMCP(t)
	ts := start(t, hitlRunner(t, u, o, runtime.ToolRules{EndsTurn: []string{"finish"}}, nil), server.Options{Store: memStore(t)})
	stream, err := ts.client.RunTurn(t.Context(), hello())
	if err != nil {
		t.Fatal(err)
	}
	evs, st := rest(stream)
	if st.Code() != codes.OK {
		t.Fatalf("status %v after %s", st, wiretest.Names(evs))
	}
	want := "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted ToolFinished MessageCompleted TurnCompleted"
	if got := wiretest.Names(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	tc := evs[len(evs)-1].GetTurnCompleted()
	if tc.GetEndReason() != turnstilev1.EndReason_END_REASON_TOOL_ENDED_TURN || len(tc.GetMessages()) != 2 {
		t.Errorf("turn_completed = %v", tc)
	}
	if n := len(u.calls()); n != 1 {
		t.Errorf("%d model calls, want 1", n)
	}
	if n := o.finishes.Load(); n != 1 {
		t.Errorf("finish ran %d times, want 1", n)
	}
}

// TestApprovalAtAnotherReplica decides a call on the replica that does
// not run the turn.
func TestApprovalAtAnotherReplica(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, callsReply("c1", "deploy", `{"env":"prod"}`), textReply("done"))
	o := newOpsMCP(t)
	rules := runtime.ToolRules{RequireApproval: []string{"deploy"}}
	rs := startReplicas(t, 2, func(int) *runtime.Runner { return hitlRunner(t, u, o, rules, nil) }, detachAfter(5*time.Second))
	a, b := rs[0], rs[1]
	stream, err := a.client.RunTurn(t.Context(), hello())
	if err != nil {
		t.Fatal(err)
	}
	evs := until(t, stream, untilPayload("ToolApprovalRequested"))
	resp, err := approve(t, t.Context(), b.client, "c1", true, "")
	if err != nil || !resp.GetApplied() || !resp.GetApproved() {
		t.Fatalf("ApproveToolCall on b = %v, %v", resp, err)
	}
	more, st := rest(stream)
	evs = append(evs, more...)
	if st.Code() != codes.OK {
		t.Fatalf("status %v after %s", st, wiretest.Names(evs))
	}
	if d := evs[resp.GetSeq()-1].GetToolApprovalDecided(); d == nil || !d.GetApproved() {
		t.Errorf("event %d = %v, want the decision", resp.GetSeq(), evs[resp.GetSeq()-1])
	}
	if n := o.deploys.Load(); n != 1 {
		t.Errorf("deploy ran %d times, want 1", n)
	}
	// Steering reaches the owner from b too, and a finished turn refuses.
	_, err = b.client.SteerTurn(t.Context(), &turnstilev1.SteerTurnRequest{TurnId: "turn-1", Message: wiretest.UserText("x")[0]})
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition {
		t.Errorf("SteerTurn of a finished turn on b: %v, want FAILED_PRECONDITION", st)
	}
}

// TestApprovalOwnerKilled kills the owner while two calls wait: the
// decision it stored stands on the replica that takes over, which asks
// again for the other.
func TestApprovalOwnerKilled(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, callsReply("c1", "deploy", `{"env":"a"}`, "c2", "deploy", `{"env":"b"}`), textReply("done"))
	o := newOpsMCP(t)
	rules := runtime.ToolRules{RequireApproval: []string{"deploy"}}
	rs := startReplicas(t, 2, func(int) *runtime.Runner { return hitlRunner(t, u, o, rules, nil) }, detachAfter(5*time.Second))
	a, b := rs[0], rs[1]
	rp := &replicaPair{a: a, b: b, storeA: a.store}
	head, cut := rp.runUntil(t, func(ev *turnstilev1.AgentEvent) bool {
		return ev.GetToolApprovalRequested().GetCallId() == "c2"
	})
	resp, err := approve(t, t.Context(), a.client, "c1", true, "")
	if err != nil || !resp.GetApplied() {
		t.Fatalf("ApproveToolCall = %v, %v", resp, err)
	}
	rp.kill(cut)
	// The new owner re-emits the request for c2 only.
	after := head[len(head)-1].GetSeq()
	var evs []*turnstilev1.AgentEvent
	for {
		ctx, cancel := context.WithCancel(t.Context())
		stream, err := b.client.WatchTurn(ctx, &turnstilev1.WatchTurnRequest{TurnId: "turn-1", Attempt: 1, AfterSeq: after})
		if err != nil {
			t.Fatal(err)
		}
		evs = nil
		for {
			r, err := stream.Recv()
			if err != nil {
				break
			}
			evs = append(evs, r.GetEvent())
			if r.GetEvent().GetToolApprovalRequested() != nil {
				break
			}
		}
		cancel()
		if len(evs) > 0 && evs[len(evs)-1].GetToolApprovalRequested() != nil {
			break
		}
	}
	if got := evs[len(evs)-1].GetToolApprovalRequested().GetCallId(); got != "c2" {
		t.Fatalf("re-emitted request for %q, want c2", got)
	}
	resp, err = approve(t, t.Context(), b.client, "c2", true, "")
	if err != nil || !resp.GetApplied() {
		t.Fatalf("ApproveToolCall on b = %v, %v", resp, err)
	}
	all, st := watch(t, t.Context(), b.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1", Attempt: 1})
	if st.Code() != codes.OK {
		t.Fatalf("status %v after %s", st, wiretest.Names(all))
	}
	tc := all[len(all)-1].GetTurnCompleted()
	if tc.GetCounters().GetApprovalsRequested() != 2 || tc.GetEndReason() != turnstilev1.EndReason_END_REASON_END_TURN {
		t.Errorf("turn_completed = %v", tc)
	}
	if n := o.deploys.Load(); n != 2 {
		t.Errorf("deploy ran %d times, want 2 (each approved call once)", n)
	}
}

// TestCancelWhileWaitingForApproval cancels a turn whose call waits for
// approval: the conversation is closed as for any cancel, and the tool
// never runs.
func TestCancelWhileWaitingForApproval(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, callsReply("c1", "deploy", `{"env":"prod"}`), textReply("never"))
	o := newOpsMCP(t)
	ts := start(t, hitlRunner(t, u, o, runtime.ToolRules{RequireApproval: []string{"deploy"}}, nil), server.Options{Store: memStore(t)})
	stream, err := ts.client.RunTurn(t.Context(), hello())
	if err != nil {
		t.Fatal(err)
	}
	evs := until(t, stream, untilPayload("ToolApprovalRequested"))
	if resp, err := ts.client.CancelTurn(t.Context(), &turnstilev1.CancelTurnRequest{TurnId: "turn-1"}); err != nil || !resp.GetCancelled() {
		t.Fatalf("CancelTurn = %v, %v", resp, err)
	}
	cancelledWhileWaiting(t, stream, evs)
	_, err = approve(t, t.Context(), ts.client, "c1", true, "")
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition {
		t.Errorf("ApproveToolCall after the cancel: %v, want FAILED_PRECONDITION", st)
	}
	if n := o.deploys.Load(); n != 0 || len(u.calls()) != 1 {
		t.Errorf("deploy ran %d times, %d model calls; want 0 and 1", n, len(u.calls()))
	}
}

// cancelledWhileWaiting reads the rest of a turn cancelled while its tool
// call c1 waited for approval, after evs: the stream ends CANCELLED, the
// turn commits the cancelled call's result and the interruption note, and
// its last event, which it returns, is a CANCELLED error.
func cancelledWhileWaiting(t *testing.T, stream interface {
	Recv() (*turnstilev1.RunTurnResponse, error)
}, evs []*turnstilev1.AgentEvent) *turnstilev1.AgentEvent {
	t.Helper()
	more, st := rest(stream)
	evs = append(evs, more...)
	if st.Code() != codes.Canceled {
		t.Errorf("status %v, want CANCELLED", st)
	}
	want := "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolApprovalRequested MessageCompleted MessageCompleted Error"
	if got := wiretest.Names(evs); got != want {
		t.Fatalf("events:\n got %s\nwant %s", got, want)
	}
	msgs := committed(evs)
	if r := msgs[1].GetParts()[0].GetToolResult(); r.GetContent() != runtime.CancelledToolResult || textOf(msgs[2]) != runtime.InterruptedToolUseNote {
		t.Errorf("closing messages = %v", msgs[1:])
	}
	last := evs[len(evs)-1]
	if last.GetError().GetCode() != turnstilev1.ErrorCode_ERROR_CODE_CANCELLED {
		t.Errorf("last event %v, want a CANCELLED error", last)
	}
	return last
}

// TestCancelTurnWithoutStore cancels a turn on a server that keeps no turn
// log: the server running it stops it as it stops a durable run (the same
// closing messages and error, the stream ends CANCELLED) and answers with
// the last event's seq; another server, and this one once the turn has
// ended, answer FAILED_PRECONDITION; a bad turn id is INVALID_ARGUMENT.
func TestCancelTurnWithoutStore(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, callsReply("c1", "deploy", `{"env":"prod"}`), textReply("never"))
	o := newOpsMCP(t)
	rules := runtime.ToolRules{RequireApproval: []string{"deploy"}}
	ts := start(t, hitlRunner(t, u, o, rules, nil), server.Options{})
	other := start(t, hitlRunner(t, u, o, rules, nil), server.Options{})
	stream, err := ts.client.RunTurn(t.Context(), hello())
	if err != nil {
		t.Fatal(err)
	}
	evs := until(t, stream, untilPayload("ToolApprovalRequested"))
	cancelTurn := func(c turnstilev1.AgentServiceClient, id string) (*turnstilev1.CancelTurnResponse, *status.Status) {
		resp, err := c.CancelTurn(t.Context(), &turnstilev1.CancelTurnRequest{TurnId: id})
		return resp, status.Convert(err)
	}
	if _, st := cancelTurn(other.client, "turn-1"); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), "does not run on it") {
		t.Errorf("CancelTurn on another server: %v, want FAILED_PRECONDITION", st)
	}
	if _, st := cancelTurn(ts.client, ""); st.Code() != codes.InvalidArgument || fieldOf(st) != "turn_id" {
		t.Errorf("CancelTurn without a turn id: %v, want INVALID_ARGUMENT naming turn_id", st)
	}
	resp, st := cancelTurn(ts.client, "turn-1")
	if st.Code() != codes.OK || !resp.GetCancelled() || resp.GetAttempt() != 1 {
		t.Fatalf("CancelTurn = %v, %v", resp, st)
	}
	if last := cancelledWhileWaiting(t, stream, evs); resp.GetLastSeq() != last.GetSeq() {
		t.Errorf("CancelTurn's last_seq %d, the last event's %d", resp.GetLastSeq(), last.GetSeq())
	}
	if _, st := cancelTurn(ts.client, "turn-1"); st.Code() != codes.FailedPrecondition {
		t.Errorf("CancelTurn of the ended turn: %v, want FAILED_PRECONDITION", st)
	}
	if n := o.deploys.Load(); n != 0 || len(u.calls()) != 1 {
		t.Errorf("deploy ran %d times, %d model calls; want 0 and 1", n, len(u.calls()))
	}
}

// TestApprovalWithoutStore decides and steers a turn on a server that
// keeps no turn log: it works on the server running the turn, and another
// answers FAILED_PRECONDITION.
func TestApprovalWithoutStore(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, callsReply("c1", "deploy", `{"env":"prod"}`), textReply("done"))
	o := newOpsMCP(t)
	rules := runtime.ToolRules{RequireApproval: []string{"deploy"}}
	ts := start(t, hitlRunner(t, u, o, rules, func(l *runtime.Limits) { l.MaxSteerMessages = 1 }), server.Options{})
	other := start(t, hitlRunner(t, u, o, rules, nil), server.Options{})
	stream, err := ts.client.RunTurn(t.Context(), hello())
	if err != nil {
		t.Fatal(err)
	}
	evs := until(t, stream, untilPayload("ToolApprovalRequested"))
	_, err = approve(t, t.Context(), other.client, "c1", true, "")
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition {
		t.Errorf("ApproveToolCall on another server: %v, want FAILED_PRECONDITION", st)
	}
	_, err = other.client.SteerTurn(t.Context(), &turnstilev1.SteerTurnRequest{TurnId: "turn-1", Message: wiretest.UserText("x")[0]})
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition {
		t.Errorf("SteerTurn on another server: %v, want FAILED_PRECONDITION", st)
	}
	resp, err := approve(t, t.Context(), ts.client, "c1", true, "")
	if err != nil || !resp.GetApplied() || resp.GetSeq() != evs[len(evs)-1].GetSeq()+1 {
		t.Fatalf("ApproveToolCall = %v, %v", resp, err)
	}
	more, st := rest(stream)
	evs = append(evs, more...)
	if st.Code() != codes.OK {
		t.Fatalf("status %v after %s", st, wiretest.Names(evs))
	}
	want := "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolApprovalRequested ToolApprovalDecided ToolStarted ToolFinished " +
		"MessageCompleted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
	if got := wiretest.Names(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	if n := o.deploys.Load(); n != 1 {
		t.Errorf("deploy ran %d times, want 1", n)
	}
	_, err = ts.client.SteerTurn(t.Context(), &turnstilev1.SteerTurnRequest{TurnId: "turn-1", Message: wiretest.UserText("x")[0]})
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition {
		t.Errorf("SteerTurn of a finished turn: %v, want FAILED_PRECONDITION", st)
	}
}

// TestSteeringQueueBound steers a turn whose tool runs, so that nothing
// takes the messages: beyond turn.max_steer_messages, RESOURCE_EXHAUSTED;
// the queued ones are committed in order.
func TestSteeringQueueBound(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, callsReply("c1", "slow", `{}`), textReply("ok"))
	o := newOpsMCP(t)
	ts := start(t, hitlRunner(t, u, o, runtime.ToolRules{}, func(l *runtime.Limits) { l.MaxSteerMessages = 2 }), server.Options{Store: memStore(t)})
	stream, err := ts.client.RunTurn(t.Context(), hello())
	if err != nil {
		t.Fatal(err)
	}
	evs := until(t, stream, untilPayload("ToolStarted"))
	for i, text := range []string{"one", "two", "three"} {
		_, err := ts.client.SteerTurn(t.Context(), &turnstilev1.SteerTurnRequest{TurnId: "turn-1", Message: wiretest.UserText(text)[0]})
		if code := status.Code(err); (i < 2) != (code == codes.OK) || i == 2 && code != codes.ResourceExhausted {
			t.Errorf("SteerTurn %q: %v", text, err)
		}
	}
	close(o.release)
	more, st := rest(stream)
	evs = append(evs, more...)
	if st.Code() != codes.OK {
		t.Fatalf("status %v after %s", st, wiretest.Names(evs))
	}
	msgs := committed(evs)
	if len(msgs) != 5 || textOf(msgs[2]) != "one" || textOf(msgs[3]) != "two" {
		t.Errorf("committed %v, want the two messages after the tool result", msgs)
	}
}

// TestSteeringAfterTheLastReply steers a turn while its model writes what
// would be its last reply: one more model call answers the message.
func TestSteeringAfterTheLastReply(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		sse(w, chunk(`{"role":"assistant","content":"all done"}`, ""))
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
		sse(w, chunk(`{}`, "stop"))
		sse(w, usageChunk)
		sse(w, "[DONE]")
	}, textReply("then staging"))
	ts := start(t, hitlRunner(t, u, newOpsMCP(t), runtime.ToolRules{}, nil), server.Options{Store: memStore(t)})
	stream, err := ts.client.RunTurn(t.Context(), hello())
	if err != nil {
		t.Fatal(err)
	}
	evs := until(t, stream, untilPayload("TextDelta"))
	if _, err := ts.client.SteerTurn(t.Context(), &turnstilev1.SteerTurnRequest{TurnId: "turn-1", Message: wiretest.UserText("now staging")[0]}); err != nil {
		t.Fatal(err)
	}
	close(gate)
	more, st := rest(stream)
	evs = append(evs, more...)
	if st.Code() != codes.OK {
		t.Fatalf("status %v after %s", st, wiretest.Names(evs))
	}
	want := "TurnStarted LlmCallStarted TextDelta Steered LlmCallFinished Usage MessageCompleted MessageCompleted " +
		"LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
	if got := wiretest.Names(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	tc := evs[len(evs)-1].GetTurnCompleted()
	if len(tc.GetMessages()) != 3 || textOf(tc.GetMessages()[1]) != "now staging" || tc.GetCounters().GetSteered() != 1 {
		t.Errorf("turn_completed = %v", tc)
	}
	if n := len(u.calls()); n != 2 {
		t.Errorf("%d model calls, want 2", n)
	}
}

// hitlPair starts two replicas on one NATS server, running u's model and
// o's tools, whose turns outlive their streams by 5 s; a's store is the
// one to close to kill it.
func hitlPair(t *testing.T, u *upstream, o *opsMCP) *replicaPair {
	t.Helper()
	rs := startReplicas(t, 2, func(int) *runtime.Runner { return hitlRunner(t, u, o, runtime.ToolRules{}, nil) }, detachAfter(5*time.Second))
	return &replicaPair{a: rs[0], b: rs[1], storeA: rs[0].store}
}

// TestSteeringOwnerKilled kills the owner while a steering message waits
// for the running tool: the replica that takes over queues it again, and
// the next model request carries it.
func TestSteeringOwnerKilled(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, callsReply("c1", "slow", `{}`), textReply("staging it is"))
	o := newOpsMCP(t)
	rp := hitlPair(t, u, o)
	b := rp.b
	head, cut := rp.runUntil(t, untilPayload("ToolStarted"))
	// Sent to b, stored by a.
	if _, err := b.client.SteerTurn(t.Context(), &turnstilev1.SteerTurnRequest{TurnId: "turn-1", Message: wiretest.UserText("use staging")[0]}); err != nil {
		t.Fatal(err)
	}
	rp.kill(cut)
	close(o.release)
	all, st := resumeOnB(t, rp, head)
	if st.Code() != codes.OK {
		t.Fatalf("status %v after %s", st, wiretest.Names(all))
	}
	// b runs the read-only tool again (it had started before the message
	// came), then commits the message.
	want := "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted Steered ToolStarted ToolFinished " +
		"MessageCompleted MessageCompleted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
	if got := wiretest.Names(all); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	tc := all[len(all)-1].GetTurnCompleted()
	msgs := tc.GetMessages()
	if len(msgs) != 4 || msgs[1].GetParts()[0].GetToolResult().GetContent() != "waited" || textOf(msgs[2]) != "use staging" || tc.GetCounters().GetSteered() != 1 {
		t.Errorf("turn_completed = %v", tc)
	}
	calls := u.calls()
	last := calls[len(calls)-1].Messages
	if m := last[len(last)-1]; m.Role != "user" || !strings.Contains(contentText(m.Content), "use staging") {
		t.Errorf("the last model request ends with %+v, want the steering message", m)
	}
}

// TestApprovalOutlivesTheDetachGrace leaves a turn that waits for approval
// with no watcher for several detach graces: the wait is the approval
// timeout's to bound, so the turn is still there to approve, and it runs
// the tool once and completes.
func TestApprovalOutlivesTheDetachGrace(t *testing.T) {
	t.Parallel()
	const grace = 100 * time.Millisecond
	u := newUpstream(t, callsReply("c1", "deploy", `{"env":"prod"}`), textReply("done"))
	o := newOpsMCP(t)
	rules := runtime.ToolRules{RequireApproval: []string{"deploy"}}
	ts := start(t, hitlRunner(t, u, o, rules, nil), server.Options{Store: clusterStore(t, natsServer(t)), DetachGrace: grace})
	ctx, detach := context.WithCancel(t.Context())
	stream, err := ts.client.RunTurn(ctx, hello())
	if err != nil {
		t.Fatal(err)
	}
	until(t, stream, untilPayload("ToolApprovalRequested"))
	detach()
	time.Sleep(5 * grace) // no watcher for five graces
	// Watch again first, so that the rest of the turn does not race the
	// grace that applies once the wait is over.
	watch, err := ts.client.WatchTurn(t.Context(), &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Header(); err != nil {
		t.Fatal(err)
	}
	resp, err := approve(t, t.Context(), ts.client, "c1", true, "")
	if err != nil || !resp.GetApplied() || !resp.GetApproved() {
		t.Fatalf("ApproveToolCall after the grace = %v, %v; want the turn still waiting", resp, err)
	}
	var evs []*turnstilev1.AgentEvent
	for {
		r, err := watch.Recv()
		if err != nil {
			if st := status.Convert(err); err != io.EOF {
				t.Fatalf("WatchTurn after %s: %v", wiretest.Names(evs), st)
			}
			break
		}
		evs = append(evs, r.GetEvent())
	}
	want := "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolApprovalRequested ToolApprovalDecided " +
		"ToolStarted ToolFinished MessageCompleted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
	if got := wiretest.Names(evs); got != want {
		t.Errorf("events\n got %s\nwant %s", got, want)
	}
	if n := o.deploys.Load(); n != 1 {
		t.Errorf("deploy ran %d times, want 1", n)
	}
}
