package server_test

import (
	"context"
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

// byCall is a provider whose nth call (from 1, across replicas) follows
// script(n).
type byCall struct {
	mu     sync.Mutex
	n      int
	script func(ctx context.Context, n int) iter.Seq2[llm.Chunk, error]
}

func (p *byCall) Stream(ctx context.Context, _ *llm.Request) iter.Seq2[llm.Chunk, error] {
	p.mu.Lock()
	p.n++
	n := p.n
	p.mu.Unlock()
	return p.script(ctx, n)
}

func (p *byCall) calls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// chunks yields cs, then hangs until ctx is done when hang is set.
func chunks(ctx context.Context, hang bool, cs ...llm.Chunk) iter.Seq2[llm.Chunk, error] {
	return func(yield func(llm.Chunk, error) bool) {
		for _, c := range cs {
			if !yield(c, nil) {
				return
			}
		}
		if hang {
			<-ctx.Done()
			yield(llm.Chunk{}, ctx.Err())
		}
	}
}

// replicaPair is two replicas sharing one NATS server; a is the one that
// dies.
type replicaPair struct {
	a, b       *testServer
	storeA     *store.Store
	provider   *byCall
	turnClient turnstilev1.AgentServiceClient
}

func pair(t *testing.T, p *byCall, tools ...llm.Tool) *replicaPair {
	t.Helper()
	rs := startReplicas(t, 2, func(int) *runtime.Runner { return runner(t, p, tools...) }, detachAfter(5*time.Second))
	return &replicaPair{a: rs[0], b: rs[1], storeA: rs[0].store, provider: p}
}

// runUntil starts the turn on a and receives events until stop says so.
func (rp *replicaPair) runUntil(t *testing.T, stop func(*turnstilev1.AgentEvent) bool) (head []*turnstilev1.AgentEvent, cut context.CancelFunc) {
	ctx, cancel := context.WithCancel(t.Context())
	stream, err := rp.a.client.RunTurn(ctx, hello())
	if err != nil {
		t.Fatal(err)
	}
	for {
		r, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		head = append(head, r.GetEvent())
		if stop(r.GetEvent()) {
			return head, cancel
		}
	}
}

// kill makes a go away as far as the cluster can tell: its store
// connection dies and its lease is not renewed. Its client's stream is
// cut.
func (rp *replicaPair) kill(cut context.CancelFunc) {
	rp.storeA.Close()
	cut()
}

// resumeOnB re-attaches on b from the last event received and returns
// the rest of the turn and its status.
func resumeOnB(t *testing.T, rp *replicaPair, head []*turnstilev1.AgentEvent) ([]*turnstilev1.AgentEvent, *status.Status) {
	t.Helper()
	after := head[len(head)-1].GetSeq()
	for {
		rest, st := watch(t, t.Context(), rp.b.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1", Attempt: 1, AfterSeq: after})
		if st.Code() == codes.Unavailable && len(rest) == 0 {
			// The lease has not expired yet and the dead owner cannot say
			// so: the client would wait and re-attach, as it does here.
			continue
		}
		return append(head, rest...), st
	}
}

func textChunk(s string) llm.Chunk { return llm.Chunk{Kind: llm.ChunkText, Text: s} }

// TestTakeoverMidDelta: the replica running a turn dies while the model
// streams; another takes the turn over from the log, tells clients to
// drop the interrupted output, and makes the call again. The client's
// events, from both, are gap-free and equal the log.
func TestTakeoverMidDelta(t *testing.T) {
	t.Parallel()
	p := &byCall{script: func(ctx context.Context, n int) iter.Seq2[llm.Chunk, error] {
		if n == 1 {
			return chunks(ctx, true, textChunk("Hel"), textChunk("lo "))
		}
		return chunks(ctx, false, fake.Text("Hello world")...)
	}}
	rp := pair(t, p)
	head, cut := rp.runUntil(t, textSoFar("Hello "))
	rp.kill(cut)
	all, st := resumeOnB(t, rp, head)
	if st.Code() != codes.OK {
		t.Fatalf("status %v", st)
	}
	if got := wiretest.Names(all); got != "TurnStarted LlmCallStarted TextDelta Retry LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted" {
		t.Fatalf("events = %s", got)
	}
	retry := retryIn(all)
	if !retry.GetDiscardPartial() || retry.GetDiscardFromSeq() != 3 {
		t.Errorf("retry = %v, want discard from seq 3", retry)
	}
	if tc := all[len(all)-1].GetTurnCompleted(); len(tc.GetMessages()) != 1 || tc.GetMessages()[0].GetParts()[0].GetText() != "Hello world" {
		t.Errorf("completed = %v", tc)
	}
	log, _ := watch(t, t.Context(), rp.b.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
	sameEvents(t, "log", log, all)
	if p.calls() != 2 {
		t.Errorf("model calls = %d, want 2", p.calls())
	}
}

// TestTakeoverMidTool: the replica dies while a tool runs. A tool with
// side effects is not run again (the turn ends TOOLS_UNSAFE, not
// retryable); an idempotent one is, and the turn completes.
func TestTakeoverMidTool(t *testing.T) {
	t.Parallel()
	for _, idempotent := range []bool{false, true} {
		t.Run(map[bool]string{false: "side effects", true: "idempotent"}[idempotent], func(t *testing.T) {
			t.Parallel()
			var runs atomic.Int32
			tool := fake.NewTool("deploy", func(ctx context.Context, _ llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
				if runs.Add(1) == 1 {
					<-ctx.Done() // the first run never finishes: its server dies
					return llm.ToolOutput{}, ctx.Err()
				}
				return llm.ToolOutput{Content: "deployed"}, nil
			})
			tool.ToolSpec.Idempotent = idempotent
			p := &byCall{script: func(ctx context.Context, n int) iter.Seq2[llm.Chunk, error] {
				if n == 1 {
					return chunks(ctx, false, fake.Call("c1", "deploy", `{}`)...)
				}
				return chunks(ctx, false, fake.Text("Deployed.")...)
			}}
			rp := pair(t, p, tool)
			head, cut := rp.runUntil(t, func(ev *turnstilev1.AgentEvent) bool { return ev.GetToolStarted() != nil })
			rp.kill(cut)
			all, st := resumeOnB(t, rp, head)
			log, _ := watch(t, t.Context(), rp.b.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
			sameEvents(t, "log", log, all)
			if !idempotent {
				last := all[len(all)-1].GetError()
				if st.Code() != codes.Aborted || last.GetCode() != turnstilev1.ErrorCode_ERROR_CODE_TOOLS_UNSAFE || last.GetRetryable() {
					t.Fatalf("status %v, last event %v; want TOOLS_UNSAFE, not retryable", st, last)
				}
				if runs.Load() != 1 || p.calls() != 1 {
					t.Errorf("tool runs %d, model calls %d; want 1 and 1", runs.Load(), p.calls())
				}
				return
			}
			if st.Code() != codes.OK {
				t.Fatalf("status %v: %s", st, wiretest.Names(all))
			}
			if got := wiretest.Names(all); got != "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted ToolStarted ToolFinished MessageCompleted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted" {
				t.Errorf("after the takeover: %s", got)
			}
			if runs.Load() != 2 || p.calls() != 2 {
				t.Errorf("tool runs %d, model calls %d; want 2 and 2", runs.Load(), p.calls())
			}
		})
	}
}

// TestShutdownHandsOff: a replica shutting down with a turn still running
// when its grace ends hands the turn to another at once (it releases the
// lease) instead of ending it or leaving the others to wait for the lease
// to expire. Its client's stream ends UNAVAILABLE, retryable, saying to
// watch again; watching on the other replica, it gets the rest of the turn
// (the interrupted call's output discarded), gap-free, equal to the log.
func TestShutdownHandsOff(t *testing.T) {
	t.Parallel()
	p := &byCall{script: func(ctx context.Context, n int) iter.Seq2[llm.Chunk, error] {
		if n == 1 {
			return chunks(ctx, true, textChunk("Hel"), textChunk("lo "))
		}
		return chunks(ctx, false, fake.Text("Hello world")...)
	}}
	// A lease TTL far longer than a hand-off takes: the other replica
	// takes the turn over because it was released, not because it expired.
	const leaseTTL = 10 * time.Second
	const grace = 300 * time.Millisecond
	rs := startReplicas(t, 2, func(int) *runtime.Runner { return runner(t, p) }, func(i int) server.Options {
		return server.Options{ShutdownGrace: []time.Duration{grace, 0}[i]}
	}, withLeaseTTL(leaseTTL))
	a, b := rs[0], rs[1]

	stream, err := a.client.RunTurn(t.Context(), hello())
	if err != nil {
		t.Fatal(err)
	}
	head := until(t, stream, textSoFar("Hello "))
	shutdown := time.Now()
	stopped := make(chan struct{})
	go func() { defer close(stopped); a.srv.Shutdown(context.Background()) }()
	_, err = stream.Recv()
	handedOff := time.Now()
	st := status.Convert(err)
	if st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "another server takes the turn over") || reasonOf(st) != "UNAVAILABLE" {
		t.Fatalf("a's stream ended with %v, want UNAVAILABLE saying another server takes the turn over", st)
	}
	if d := handedOff.Sub(shutdown); d < grace {
		t.Errorf("handed off %v after the shutdown began, before the grace (%v) ended", d, grace)
	}

	// The client watches again, on b, from its last event.
	rest, first, wst := watchAfterHandOff(t, b.client, head[len(head)-1].GetSeq())
	<-stopped
	t.Logf("shutdown began; handed off after %v; b's first event %v after the hand-off (lease TTL %v)", handedOff.Sub(shutdown), first.Sub(handedOff), leaseTTL)
	if wst.Code() != codes.OK {
		t.Fatalf("watch on b: %v", wst)
	}
	tookOver(t, b, p, append(head, rest...), first.Sub(handedOff), leaseTTL)
}

// tookOver checks a turn handed off to b, which took it over after
// waited: not by its lease's expiry (leaseTTL), and with the turn whole
// in all, the interrupted call's output discarded, equal to b's log, in
// p's two model calls.
func tookOver(t *testing.T, b *testServer, p *byCall, all []*turnstilev1.AgentEvent, waited, leaseTTL time.Duration) {
	t.Helper()
	if waited >= leaseTTL/2 {
		t.Errorf("b took the turn over %v after the hand-off: it waited as for an expired lease", waited)
	}
	if got := wiretest.Names(all); got != "TurnStarted LlmCallStarted TextDelta Retry LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted" {
		t.Fatalf("events = %s", got)
	}
	if retry := retryIn(all); !retry.GetDiscardPartial() || retry.GetDiscardFromSeq() != 3 {
		t.Errorf("retry = %v, want discard from seq 3", retry)
	}
	log, _ := watch(t, t.Context(), b.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
	sameEvents(t, "log", log, all)
	if p.calls() != 2 {
		t.Errorf("model calls = %d, want 2", p.calls())
	}
}

// watchAfterHandOff watches turn-1, attempt 1, on c from after its seq
// after, again while c answers UNAVAILABLE with no event (the run is not
// taken over yet): it returns the events, when the first came, and the
// status the watch ended with (OK at its end).
func watchAfterHandOff(t *testing.T, c turnstilev1.AgentServiceClient, after uint64) ([]*turnstilev1.AgentEvent, time.Time, *status.Status) {
	t.Helper()
	var rest []*turnstilev1.AgentEvent
	var first time.Time
	wst := status.New(codes.Unavailable, "")
	for wst.Code() == codes.Unavailable && len(rest) == 0 {
		ws, err := c.WatchTurn(t.Context(), &turnstilev1.WatchTurnRequest{TurnId: "turn-1", Attempt: 1, AfterSeq: after})
		if err != nil {
			t.Fatal(err)
		}
		for {
			r, err := ws.Recv()
			if err != nil {
				wst = status.Convert(err)
				if err == io.EOF {
					wst = status.New(codes.OK, "")
				}
				break
			}
			if first.IsZero() {
				first = time.Now()
			}
			rest = append(rest, r.GetEvent())
		}
	}
	return rest, first, wst
}

// retryIn returns the first Retry of evs, nil when none.
func retryIn(evs []*turnstilev1.AgentEvent) *turnstilev1.Retry {
	for _, ev := range evs {
		if r := ev.GetRetry(); r != nil {
			return r
		}
	}
	return nil
}
