package server_test

import (
	"context"
	"fmt"
	"io"
	"iter"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/store"
)

// fleet is replicas sharing one NATS server, each with its own store
// connection, whose model calls are scripted across all of them: the nth
// call (from 1) follows script(n), and calls says which replica made it.
type fleet struct {
	members []*member
	calls   chan *member

	mu     sync.Mutex
	reqs   []*llm.Request
	script func(ctx context.Context, n int) iter.Seq2[llm.Chunk, error]
}

// member is one replica of a fleet.
type member struct {
	f     *fleet
	srv   *testServer
	store *store.Store
	dead  bool
}

// Stream implements llm.Provider for the member's runner.
func (m *member) Stream(ctx context.Context, req *llm.Request) iter.Seq2[llm.Chunk, error] {
	f := m.f
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	n := len(f.reqs)
	f.mu.Unlock()
	f.calls <- m
	return f.script(ctx, n)
}

// newFleet starts n replicas whose models continue cut streams when cut
// says so; wrap, when not nil, gives each the store it runs on.
func newFleet(t *testing.T, n int, cut runtime.StreamCut, script func(ctx context.Context, n int) iter.Seq2[llm.Chunk, error], wrap func(*store.Store) server.TurnStore) *fleet {
	t.Helper()
	url := natsServer(t)
	f := &fleet{calls: make(chan *member, 16), script: script}
	for range n {
		m := &member{f: f, store: clusterStore(t, url)}
		var st server.TurnStore = m.store
		if wrap != nil {
			st = wrap(m.store)
		}
		m.srv = start(t, cutRunner(t, m, cut), server.Options{Store: st, DetachGrace: 30 * time.Second})
		f.members = append(f.members, m)
	}
	return f
}

// owner waits for the next model call and returns its replica.
func (f *fleet) owner(t *testing.T) *member {
	t.Helper()
	select {
	case m := <-f.calls:
		if m.dead {
			t.Fatal("a dead replica called the model")
		}
		return m
	case <-time.After(waitBound):
		t.Fatal("no model call")
		return nil
	}
}

// kill makes m go away as far as the cluster can tell: its store
// connection closes, so its lease is not renewed and it stores nothing
// more.
func (m *member) kill() {
	m.dead = true
	m.store.Close()
}

// requests returns the model calls' requests, in order.
func (f *fleet) requests() []*llm.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*llm.Request(nil), f.reqs...)
}

// follow reads the turn's log, from the event after those in evs, on a
// live replica, and again on another when that watch ends without the
// turn's last event (its replica died, or the turn waits to be taken
// over), until until says the events so far are enough or the turn
// ended. It returns every event read, evs included, and the status of the
// last watch.
func (f *fleet) follow(t *testing.T, evs []*turnstilev1.AgentEvent, until func([]*turnstilev1.AgentEvent) bool) ([]*turnstilev1.AgentEvent, *status.Status) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	for i := 0; ; i++ {
		var live *member
		for j := range f.members {
			if m := f.members[(i+j)%len(f.members)]; !m.dead {
				live = m
				break
			}
		}
		var after uint64
		if n := len(evs); n > 0 {
			after = evs[n-1].GetSeq()
		}
		wctx, wcancel := context.WithCancel(ctx)
		stream, err := live.srv.client.WatchTurn(wctx, &turnstilev1.WatchTurnRequest{TurnId: "turn-1", Attempt: 1, AfterSeq: after})
		for err == nil {
			var resp *turnstilev1.WatchTurnResponse
			if resp, err = stream.Recv(); err == nil {
				evs = append(evs, resp.GetEvent())
				if until(evs) {
					wcancel()
					return evs, status.New(codes.OK, "")
				}
			}
		}
		wcancel()
		st := status.Convert(err)
		if err == io.EOF {
			st = status.New(codes.OK, "")
		}
		if n := len(evs); n > 0 && (evs[n-1].GetError() != nil || evs[n-1].GetTurnCompleted() != nil) {
			return evs, st
		}
		if ctx.Err() != nil {
			t.Fatalf("the turn did not get on: %s (%v)", wiretest.Names(evs), st)
		}
	}
}

// texts returns a predicate true once the events hold n text deltas.
func texts(n int) func([]*turnstilev1.AgentEvent) bool {
	return func(evs []*turnstilev1.AgentEvent) bool {
		c := 0
		for _, ev := range evs {
			if ev.GetTextDelta() != nil {
				c++
			}
		}
		return c >= n
	}
}

// TestTakeoverContinuesThroughKills (issue 37, row 5): the replica running
// a long reply is killed four times, each time after its model call
// streamed some text. With on_stream_cut: continue, each replica that
// takes the turn over keeps the stored text (its retry does not discard
// it) and asks the model to continue it: its request ends with the text so
// far and the continuation prompt. Every takeover made progress, so none
// counts against the cap of three takeovers without progress: the turn
// completes with the reply whole, written by five replicas, and each event
// names the takeover that stored it.
func TestTakeoverContinuesThroughKills(t *testing.T) {
	t.Parallel()
	parts := []string{"It ", "was ", "a ", "long ", "reply."}
	f := newFleet(t, 5, runtime.StreamCutContinue, func(ctx context.Context, n int) iter.Seq2[llm.Chunk, error] {
		if n < len(parts) {
			return chunks(ctx, true, textChunk(parts[n-1]))
		}
		return chunks(ctx, false, fake.Text(parts[n-1])...)
	}, nil)
	ctx, cancel := context.WithCancel(t.Context())
	stream, err := f.members[0].srv.client.RunTurn(ctx, hello())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil { // the turn is under way
		t.Fatal(err)
	}
	cancel() // the client detaches; the turn goes on
	var evs []*turnstilev1.AgentEvent
	for i := range len(parts) - 1 {
		o := f.owner(t)
		evs, _ = f.follow(t, evs, texts(i+1))
		o.kill()
	}
	f.owner(t) // the fifth replica, which completes the reply
	evs, st := f.follow(t, evs, func([]*turnstilev1.AgentEvent) bool { return false })
	if st.Code() != codes.OK {
		t.Fatalf("status %v, after %s", st, wiretest.Names(evs))
	}
	want := "TurnStarted LlmCallStarted TextDelta" + strings.Repeat(" Retry LlmCallStarted TextDelta", 4) + " LlmCallFinished Usage MessageCompleted TurnCompleted"
	if got := wiretest.Names(evs); got != want {
		t.Fatalf("events:\n got %s\nwant %s", got, want)
	}
	takeover := uint32(0)
	for _, ev := range evs {
		if r := ev.GetRetry(); r != nil {
			takeover++
			if r.GetDiscardPartial() || r.GetDiscardFromSeq() != 0 {
				t.Errorf("retry %v discards the reply", r)
			}
		}
		if ev.GetTakeover() != takeover {
			t.Errorf("event %d (%s) names takeover %d, want %d", ev.GetSeq(), wiretest.Names([]*turnstilev1.AgentEvent{ev}), ev.GetTakeover(), takeover)
		}
	}
	tc := evs[len(evs)-1].GetTurnCompleted()
	if len(tc.GetMessages()) != 1 || tc.GetMessages()[0].GetParts()[0].GetText() != strings.Join(parts, "") {
		t.Errorf("completed = %v, want one reply %q", tc, strings.Join(parts, ""))
	}
	reqs := f.requests()
	if len(reqs) != len(parts) {
		t.Fatalf("model calls = %d, want %d", len(reqs), len(parts))
	}
	for i, req := range reqs[1:] {
		msgs := req.Messages
		so := strings.Join(parts[:i+1], "")
		if n := len(msgs); n < 2 || msgs[n-2].Role != llm.RoleAssistant || msgs[n-2].Text() != so || msgs[n-1].Text() != runtime.ContinuationPrompt {
			t.Errorf("call %d's conversation ends %+v, want the reply so far, %q, and the continuation prompt", i+2, msgs[max(len(msgs)-2, 0):], so)
		}
	}
	log, _ := f.follow(t, nil, func([]*turnstilev1.AgentEvent) bool { return false })
	sameEvents(t, "log", log, evs)
}

// dieOnClaim is a replica's store that, while armed, makes the replica
// go away as soon as it has claimed a run (the store connection closes):
// the takeover stores nothing.
type dieOnClaim struct {
	*store.Store
	armed *atomic.Int32 // how many more claims, on any replica, die
}

func (d dieOnClaim) Claim(ctx context.Context, turnID string, attempt uint32, onSignal func(string) []byte) ([]byte, [][]byte, int, error) {
	rec, evs, claims, err := d.Store.Claim(ctx, turnID, attempt, onSignal)
	if err == nil && d.armed.Add(-1) >= 0 {
		d.Store.Close()
	}
	return rec, evs, claims, err
}

// TestTakeoverCapCountsNoProgress (issue 37, row 5): the replica running a
// turn is killed after its call streamed text, and the replica that takes
// it over too, after its call streamed more (progress); then the next
// three replicas that take it over go away as soon as they have claimed
// it, storing nothing. Those three count against the cap, the one that
// made progress does not: the sixth replica, the fifth takeover, ends the
// turn at once with a retryable UNAVAILABLE error instead of calling the
// model again.
func TestTakeoverCapCountsNoProgress(t *testing.T) {
	t.Parallel()
	armed := new(atomic.Int32)
	f := newFleet(t, 6, runtime.StreamCutRestart, func(ctx context.Context, n int) iter.Seq2[llm.Chunk, error] {
		return chunks(ctx, true, textChunk(fmt.Sprintf("part %d ", n)))
	}, func(s *store.Store) server.TurnStore { return dieOnClaim{Store: s, armed: armed} })
	ctx, cancel := context.WithCancel(t.Context())
	stream, err := f.members[0].srv.client.RunTurn(ctx, hello())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	cancel()
	var evs []*turnstilev1.AgentEvent
	first := f.owner(t)
	evs, _ = f.follow(t, evs, texts(1))
	first.kill()
	second := f.owner(t)
	evs, _ = f.follow(t, evs, texts(2))
	armed.Store(3)
	second.kill()
	evs, st := f.follow(t, evs, func([]*turnstilev1.AgentEvent) bool { return false })
	want := "TurnStarted LlmCallStarted TextDelta Retry LlmCallStarted TextDelta Error"
	if got := wiretest.Names(evs); got != want {
		t.Fatalf("events:\n got %s\nwant %s", got, want)
	}
	if st.Code() != codes.Unavailable {
		t.Errorf("status %v, want UNAVAILABLE", st)
	}
	e := evs[len(evs)-1]
	if e.GetError().GetCode() != turnstilev1.ErrorCode_ERROR_CODE_UNAVAILABLE || !e.GetError().GetRetryable() || e.GetTakeover() != 5 ||
		e.GetError().GetMessage() != "the turn was taken over 5 times, 3 of them without progress (at most 3): the servers running it kept going away; run it again" {
		t.Errorf("error event = %v", e)
	}
	if armed.Load() > 0 {
		t.Errorf("%d armed deaths left", armed.Load())
	}
	select {
	case m := <-f.calls:
		t.Errorf("a model call after the turn was taken over without progress (on replica %p)", m)
	default:
	}
}
