package server_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
)

// steerReq is a SteerTurn of turn-1 with text and request id.
func steerReq(text, id string) *turnstilev1.SteerTurnRequest {
	return &turnstilev1.SteerTurnRequest{TurnId: "turn-1", Message: wiretest.UserText(text)[0], RequestId: id}
}

// occurrences counts the messages of the last model request that hold
// text.
func occurrences(u *upstream, text string) int {
	calls := u.calls()
	n := 0
	for _, m := range calls[len(calls)-1].Messages {
		if strings.Contains(contentText(m.Content), text) {
			n++
		}
	}
	return n
}

// TestSteerRequestID sends a steering message twice with one request id,
// with the store and without: the second stores nothing and answers the
// first one's seq; the model sees the message once. With the store, a
// retry after the turn ended is read from the log.
func TestSteerRequestID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		store bool
	}{{"store", true}, {"off", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := newUpstream(t, callsReply("c1", "slow", `{}`), textReply("staging it is"))
			o := newOpsMCP(t)
			opts := server.Options{}
			if tc.store {
				opts.Store = memStore(t)
			}
			ts := start(t, hitlRunner(t, u, o, runtime.ToolRules{}, nil), opts)
			stream, err := ts.client.RunTurn(t.Context(), hello())
			if err != nil {
				t.Fatal(err)
			}
			evs := until(t, stream, untilPayload("ToolStarted"))
			first, err := ts.client.SteerTurn(t.Context(), steerReq("use staging", "r1"))
			if err != nil || first.GetDuplicate() {
				t.Fatalf("SteerTurn = %v, %v", first, err)
			}
			again, err := ts.client.SteerTurn(t.Context(), steerReq("use staging", "r1"))
			if err != nil || !again.GetDuplicate() || again.GetSeq() != first.GetSeq() || again.GetAttempt() != 1 {
				t.Fatalf("SteerTurn again = %v, %v; want duplicate of seq %d", again, err, first.GetSeq())
			}
			close(o.release)
			more, st := rest(stream)
			evs = append(evs, more...)
			if st.Code() != codes.OK {
				t.Fatalf("status %v after %s", st, wiretest.Names(evs))
			}
			want := "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted Steered ToolFinished " +
				"MessageCompleted MessageCompleted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
			if got := wiretest.Names(evs); got != want {
				t.Errorf("events:\n got %s\nwant %s", got, want)
			}
			if s := evs[first.GetSeq()-1].GetSteered(); s.GetRequestId() != "r1" || textOf(s.GetMessage()) != "use staging" {
				t.Errorf("event %d = %v, want the steered message of r1", first.GetSeq(), evs[first.GetSeq()-1])
			}
			if n := occurrences(u, "use staging"); n != 1 {
				t.Errorf("the last model request holds the message %d times, want 1", n)
			}
			tc2 := evs[len(evs)-1].GetTurnCompleted()
			if len(tc2.GetMessages()) != 4 || tc2.GetCounters().GetSteered() != 1 {
				t.Errorf("turn_completed = %v", tc2)
			}
			after, err := ts.client.SteerTurn(t.Context(), steerReq("use staging", "r1"))
			if !tc.store {
				// Without a log the ended turn is gone from this server.
				if st := status.Convert(err); st.Code() != codes.FailedPrecondition {
					t.Errorf("SteerTurn after the end without a store: %v, want FAILED_PRECONDITION", st)
				}
				return
			}
			if err != nil || !after.GetDuplicate() || after.GetSeq() != first.GetSeq() {
				t.Errorf("SteerTurn after the end = %v, %v; want duplicate of seq %d", after, err, first.GetSeq())
			}
			_, err = ts.client.SteerTurn(t.Context(), steerReq("use staging", "r2"))
			if st := status.Convert(err); st.Code() != codes.FailedPrecondition {
				t.Errorf("SteerTurn of a new id after the end: %v, want FAILED_PRECONDITION", st)
			}
		})
	}
}

// TestSteerRequestIDOwnerKilled stores a steering message with a request
// id on the owner, kills it, and sends the message again to the other
// replica until it answers, as a client does on UNAVAILABLE: the replica
// that took the turn over knows the id from the log, so the turn holds
// one steered event and the model sees the message once.
func TestSteerRequestIDOwnerKilled(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, callsReply("c1", "slow", `{}`), textReply("staging it is"))
	o := newOpsMCP(t)
	rp := hitlPair(t, u, o)
	b := rp.b
	release := sync.OnceFunc(func() { close(o.release) })
	t.Cleanup(release) // before the servers stop, also when the test fails
	head, cut := rp.runUntil(t, untilPayload("ToolStarted"))
	first, err := b.client.SteerTurn(t.Context(), steerReq("use staging", "r1"))
	if err != nil {
		t.Fatal(err)
	}
	rp.kill(cut)
	type result struct {
		evs []*turnstilev1.AgentEvent
		st  *status.Status
	}
	done := make(chan result, 1)
	go func() {
		evs, st := resumeOnB(t, rp, head)
		done <- result{evs, st}
	}()
	// b takes the turn over and runs the slow tool again, which waits:
	// the retry reaches the turn while it runs on b.
	var again *turnstilev1.SteerTurnResponse
	eventually(t, "b answers the steering message again", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		again, err = b.client.SteerTurn(ctx, steerReq("use staging", "r1"))
		c := status.Code(err)
		return c != codes.Unavailable && c != codes.DeadlineExceeded
	})
	if err != nil || !again.GetDuplicate() || again.GetSeq() != first.GetSeq() {
		t.Fatalf("SteerTurn after the kill = %v, %v; want duplicate of seq %d", again, err, first.GetSeq())
	}
	release()
	res := <-done
	if res.st.Code() != codes.OK {
		t.Fatalf("status %v after %s", res.st, wiretest.Names(res.evs))
	}
	want := "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted Steered ToolStarted ToolFinished " +
		"MessageCompleted MessageCompleted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
	if got := wiretest.Names(res.evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	if s := res.evs[first.GetSeq()-1].GetSteered(); s.GetRequestId() != "r1" {
		t.Errorf("event %d = %v, want the steered message of r1", first.GetSeq(), res.evs[first.GetSeq()-1])
	}
	if tc := res.evs[len(res.evs)-1].GetTurnCompleted(); tc.GetCounters().GetSteered() != 1 || len(tc.GetMessages()) != 4 {
		t.Errorf("turn_completed = %v", tc)
	}
	if n := occurrences(u, "use staging"); n != 1 {
		t.Errorf("the last model request holds the message %d times, want 1", n)
	}
}

// TestSteerRequestIDBounds refuses a request id over 128 bytes, and
// answers a known id while the queue is full.
func TestSteerRequestIDBounds(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, callsReply("c1", "slow", `{}`), textReply("ok"))
	o := newOpsMCP(t)
	ts := start(t, hitlRunner(t, u, o, runtime.ToolRules{}, func(l *runtime.Limits) { l.MaxSteerMessages = 1 }), server.Options{Store: memStore(t)})
	_, err := ts.client.SteerTurn(t.Context(), steerReq("hi", strings.Repeat("x", 129)))
	wantFields(t, err, "request_id")
	stream, err := ts.client.RunTurn(t.Context(), hello())
	if err != nil {
		t.Fatal(err)
	}
	evs := until(t, stream, untilPayload("ToolStarted"))
	first, err := ts.client.SteerTurn(t.Context(), steerReq("one", strings.Repeat("x", 128)))
	if err != nil {
		t.Fatal(err)
	}
	if again, err := ts.client.SteerTurn(t.Context(), steerReq("one", strings.Repeat("x", 128))); err != nil || !again.GetDuplicate() || again.GetSeq() != first.GetSeq() {
		t.Errorf("SteerTurn of a known id with a full queue = %v, %v; want duplicate", again, err)
	}
	if _, err := ts.client.SteerTurn(t.Context(), steerReq("two", "other")); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("SteerTurn of a new id with a full queue: %v, want RESOURCE_EXHAUSTED", err)
	}
	close(o.release)
	more, st := rest(stream)
	evs = append(evs, more...)
	if st.Code() != codes.OK {
		t.Fatalf("status %v after %s", st, wiretest.Names(evs))
	}
	if n := strings.Count(wiretest.Names(evs), "Steered"); n != 1 {
		t.Errorf("%d steered events, want 1: %s", n, wiretest.Names(evs))
	}
}

// TestSteeringEmptyText: a steering message's text parts must hold text
// other than white space (providers refuse an empty text block), each
// named.
func TestSteeringEmptyText(t *testing.T) {
	t.Parallel()
	ts := start(t, runner(t, fake.NewProvider()), server.Options{})
	msg := func(texts ...string) *turnstilev1.Message {
		m := &turnstilev1.Message{Role: turnstilev1.Role_ROLE_USER}
		for _, s := range texts {
			m.Parts = append(m.Parts, &turnstilev1.Part{Kind: &turnstilev1.Part_Text{Text: s}})
		}
		return m
	}
	for _, tc := range []struct {
		name   string
		msg    *turnstilev1.Message
		fields []string
	}{
		{"empty", msg(""), []string{"message.parts[0].text"}},
		{"white space", msg(" \n\t"), []string{"message.parts[0].text"}},
		{"one of two", msg("use staging", ""), []string{"message.parts[1].text"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ts.client.SteerTurn(t.Context(), &turnstilev1.SteerTurnRequest{TurnId: "turn-1", Message: tc.msg})
			wantFields(t, err, tc.fields...)
		})
	}
}

// TestSteeringByteBound: the red team's 128 steering messages of 256 KiB
// into one turn (issue 38) grew its conversation to 32 MB. The messages a
// turn takes hold at most turn.max_steer_bytes of text (1 MiB by
// default): the fifth of 256 KiB is refused with RESOURCE_EXHAUSTED, and
// the model is sent the four taken.
func TestSteeringByteBound(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, callsReply("c1", "slow", `{}`), textReply("ok"))
	o := newOpsMCP(t)
	ts := start(t, hitlRunner(t, u, o, runtime.ToolRules{}, nil), server.Options{Store: memStore(t)})
	stream, err := ts.client.RunTurn(t.Context(), hello())
	if err != nil {
		t.Fatal(err)
	}
	evs := until(t, stream, untilPayload("ToolStarted"))
	for i := range 5 {
		text := strings.Repeat(string(rune('a'+i)), 256<<10)
		_, err := ts.client.SteerTurn(t.Context(), &turnstilev1.SteerTurnRequest{TurnId: "turn-1", Message: wiretest.UserText(text)[0]})
		st := status.Convert(err)
		switch {
		case i < 4 && err != nil:
			t.Errorf("SteerTurn %d: %v", i, st)
		case i == 4 && (st.Code() != codes.ResourceExhausted ||
			st.Message() != "the turn's steering messages would hold more text than turn.max_steer_bytes (1048576 bytes): the message holds 262144 bytes of text, and 0 are left; start a new turn to say more"):
			t.Errorf("SteerTurn past the bound: %v", st)
		}
	}
	close(o.release)
	more, st := rest(stream)
	evs = append(evs, more...)
	if st.Code() != codes.OK {
		t.Fatalf("status %v after %s", st, wiretest.Names(evs))
	}
	if n := strings.Count(wiretest.Names(evs), "Steered"); n != 4 {
		t.Errorf("%d steered events, want 4", n)
	}
	steering := 0
	calls := u.calls()
	for _, m := range calls[len(calls)-1].Messages {
		// A steering message's content is a JSON string: its text and two
		// quotes.
		if s := contentText(m.Content); m.Role == "user" && len(s) >= 256<<10 {
			steering += len(s) - len(`""`)
		}
	}
	if steering != 1<<20 {
		t.Errorf("the last model call holds %d bytes of steering, want %d", steering, 1<<20)
	}
}
