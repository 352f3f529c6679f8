package server_test

import (
	"context"
	"fmt"
	"iter"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
)

// TestMemoryLimit: with server.memory_limit at 10 MiB and each running
// turn counted at 1 MiB, a key whose turns hang (its clients' turns hold
// memory and end never) runs 6 of them, 60% of the limit; its 7th is
// refused with RESOURCE_EXHAUSTED, LIMIT_EXCEEDED memory_limit and
// RetryInfo, before any event, while another key's turn runs to its end.
// Once the process holds 85% of the limit, every new turn is refused;
// once the hanging turns end, the first key runs turns again. Store off
// and on: the bound is the server's, before a turn is durable or not.
func TestMemoryLimit(t *testing.T) {
	t.Parallel()
	for _, durable := range []bool{false, true} {
		name := "store off"
		if durable {
			name = "store on"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			replies := make([]fake.Reply, 0, 7)
			for range 6 {
				replies = append(replies, fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "..."}}, Hang: true})
			}
			replies = append(replies, fake.Reply{Chunks: fake.Text("hi")})
			var used atomic.Uint64 // the process's memory, as the server reads it
			m := newMeter()
			opts := server.Options{
				Keys:        []server.Key{keyed("silent", "tok-silent-0123"), keyed("good", "tok-good-0123")},
				MemoryLimit: 10 << 20, TurnMemory: 1 << 20, MemoryInUse: used.Load, MeterProvider: m,
			}
			if durable {
				opts.Store = memStore(t)
			}
			ts := start(t, runner(t, fake.NewProvider(replies...)), opts)
			silent, good := bearer(t.Context(), "tok-silent-0123"), bearer(t.Context(), "tok-good-0123")

			// Each turn an id of its own: with a store, a request of a
			// stored turn's id watches that turn.
			n := 0
			req := func() *turnstilev1.RunTurnRequest {
				n++
				r := hello()
				r.TurnId = fmt.Sprintf("turn-%d", n)
				return r
			}
			var held []func()
			for range 6 {
				held = append(held, holdRequest(t, ts.client, silent, req()))
			}
			evs, st := wiretest.Collect(t, silent, ts.client, req(), nil)
			refusedWith(t, evs, st, "memory_limit", true)
			if !strings.Contains(st.Message(), "at least its share") {
				t.Errorf("the refusal says %q; want it to say the key runs at least its share", st.Message())
			}

			evs, st = wiretest.Collect(t, good, ts.client, req(), nil)
			const completed = "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
			if st.Code() != codes.OK || wiretest.Names(evs) != completed {
				t.Fatalf("the other key's turn: %v, events %s; want OK, %s", st, wiretest.Names(evs), completed)
			}

			used.Store(9 << 20)
			evs, st = wiretest.Collect(t, good, ts.client, req(), nil)
			refusedWith(t, evs, st, "memory_limit", true)
			if !strings.Contains(st.Message(), "starts no more turns") {
				t.Errorf("the refusal at 90%% says %q; want it to say the server starts no more turns", st.Message())
			}
			used.Store(0)
			for _, c := range []string{"silent", "good"} {
				if n := m.sum(t, "turnstile.turns.refused", attribute.String("turnstile.limit", "memory_limit"), attribute.String("turnstile.client", c)); n != 1 {
					t.Errorf("turnstile.turns.refused{memory_limit, %s} = %d, want 1", c, n)
				}
			}

			if durable {
				// A durable turn outlives its client: the hanging ones
				// run until the test's server stops.
				return
			}
			for _, release := range held {
				release()
			}
			// Their calls ended, their slots freed (the log line is
			// written after): 6 held, 2 refused, 1 completed.
			ts.logs.awaitCalls(t, "RunTurn", 9)
			evs, st = wiretest.Collect(t, silent, ts.client, req(), nil)
			if st.Code() != codes.OK || wiretest.Names(evs) != completed {
				t.Fatalf("the first key's turn once its others ended: %v, events %s; want OK, %s", st, wiretest.Names(evs), completed)
			}
		})
	}
}

// TestMemoryShedsUnread: with the turn store on, when a turn is refused
// while the memory the process holds is past 85% of server.memory_limit,
// the turns nobody reads of the key that runs the most turns are ended
// first: such a turn's log ends with a retryable error UNAVAILABLE saying
// why, which a client watching it again reads; the model's call is
// closed; and once the memory is back
// under the marks, the other key's turn runs to its end.
func TestMemoryShedsUnread(t *testing.T) {
	t.Parallel()
	f := newFirehose()
	var used atomic.Uint64
	ts := start(t, runner(t, f), server.Options{
		Store: memStore(t),
		Keys:  []server.Key{keyed("silent", "tok-silent-0123"), keyed("good", "tok-good-0123")},
		// A limit far above what the turns are counted at, so only the
		// memory read decides.
		MemoryLimit: 1 << 30, TurnMemory: 1, MemoryInUse: used.Load,
	})
	silent, good := bearer(t.Context(), "tok-silent-0123"), bearer(t.Context(), "tok-good-0123")
	req := hello()
	req.TurnId = "silent-1"
	stream, err := stingyClient(t, ts).RunTurn(silent, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	// Nothing more is read: the turn waits for a reader.
	eventually(t, "the turn to stop reading the model", func() bool { return f.held(time.Second) })

	used.Store(900 << 20) // past 85% of 1 GiB
	goodReq := hello()
	goodReq.TurnId = "good-1"
	evs, st := wiretest.Collect(t, good, ts.client, goodReq, nil)
	refusedWith(t, evs, st, "memory_limit", true)
	ts.logs.awaitLine(t, "ended the turns nobody reads of the client key that runs the most")
	select {
	case <-f.closed:
	case <-time.After(waitBound):
		t.Fatal("the shed turn's model call was not closed")
	}

	log, wst := watch(t, silent, ts.client, &turnstilev1.WatchTurnRequest{TurnId: "silent-1"})
	if wst.Code() != codes.Unavailable {
		t.Errorf("the watch of the shed turn ended %v, want UNAVAILABLE", wst)
	}
	// Retryable, as a turn ended by a shutdown: nothing of the cut reply
	// is committed, the next attempt runs the step again.
	const shed = "TurnStarted LlmCallStarted TextDelta Error"
	if got := wiretest.Names(log); got != shed {
		t.Fatalf("the shed turn's events: %s, want %s", got, shed)
	}
	last := log[len(log)-1].GetError()
	if last.GetCode() != turnstilev1.ErrorCode_ERROR_CODE_UNAVAILABLE || !strings.Contains(last.GetMessage(), "server.memory_limit") || !last.GetRetryable() {
		t.Errorf("the shed turn's error %v, want a retryable UNAVAILABLE naming server.memory_limit", last)
	}

	close(f.release) // the next calls reply at once
	used.Store(0)
	goodReq.TurnId = "good-2"
	evs, st = wiretest.Collect(t, good, ts.client, goodReq, nil)
	const completed = "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
	if st.Code() != codes.OK || wiretest.Names(evs) != completed {
		t.Fatalf("the other key's turn: %v, events %s; want OK, %s", st, wiretest.Names(evs), completed)
	}
}

// TestTakeoverNearMemoryLimit: a replica whose memory is past 85% of
// server.memory_limit takes no turn over, so that the death of one replica
// does not take its survivors past their limits one after the other. The
// owner of a turn dies mid-reply; the only other replica is near its limit:
// it does not claim the run when its lease expires, and a client watching
// the turn there reads it closed with a retryable UNAVAILABLE error saying
// it was not resumed, the model never called again. Once the memory is
// back under the marks, the next attempt runs there.
func TestTakeoverNearMemoryLimit(t *testing.T) {
	t.Parallel()
	p := &byCall{script: func(ctx context.Context, n int) iter.Seq2[llm.Chunk, error] {
		if n == 1 {
			return chunks(ctx, true, textChunk("Hel"))
		}
		return chunks(ctx, false, fake.Text("Hello")...)
	}}
	var used atomic.Uint64 // replica b's memory, as it reads it
	used.Store(90 << 20)
	rs := startReplicas(t, 2, func(int) *runtime.Runner { return runner(t, p) }, func(i int) server.Options {
		o := server.Options{DetachGrace: 5 * time.Second}
		if i == 1 {
			o.MemoryLimit, o.TurnMemory, o.MemoryInUse = 100<<20, 1<<20, used.Load
		}
		return o
	})
	rp := &replicaPair{a: rs[0], b: rs[1], storeA: rs[0].store, provider: p}
	head, cut := rp.runUntil(t, textSoFar("Hel"))
	rp.kill(cut)
	rp.b.logs.awaitLine(t, "turn not taken over: this server runs no more turns")
	all, st := resumeOnB(t, rp, head)
	if st.Code() != codes.Unavailable {
		t.Fatalf("status %v, want UNAVAILABLE", st)
	}
	if got, want := wiretest.Names(all), "TurnStarted LlmCallStarted TextDelta Error"; got != want {
		t.Fatalf("events %s, want %s", got, want)
	}
	e := all[len(all)-1].GetError()
	if e.GetCode() != turnstilev1.ErrorCode_ERROR_CODE_UNAVAILABLE || !e.GetRetryable() || !strings.Contains(e.GetMessage(), "was not resumed (this server runs as many turns as it may)") {
		t.Errorf("error event %v, want a retryable UNAVAILABLE saying the turn was not resumed", e)
	}
	if n := p.calls(); n != 1 {
		t.Errorf("model calls = %d, want 1: the replica near its limit resumed the turn", n)
	}

	used.Store(0)
	req := hello()
	req.Attempt = 2
	evs, st := wiretest.Collect(t, t.Context(), rp.b.client, req, nil)
	const completed = "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
	if st.Code() != codes.OK || wiretest.Names(evs) != completed {
		t.Fatalf("the next attempt: %v, events %s; want OK, %s", st, wiretest.Names(evs), completed)
	}
}
