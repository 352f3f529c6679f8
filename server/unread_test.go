package server_test

import (
	"context"
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
	"github.com/turnstile-dev/turnstile/server"
)

// firehose is a provider whose reply streams KiB chunks as fast as the
// turn takes them, until released; it tells how long the chunk under way
// has waited for the turn to take it.
type firehose struct {
	release chan struct{}
	closed  chan struct{} // closed when a call's context ended it
	once    sync.Once
	chunks  atomic.Int64
	since   atomic.Int64 // when the chunk under way was offered, Unix ns; 0 between
}

func newFirehose() *firehose {
	return &firehose{release: make(chan struct{}), closed: make(chan struct{})}
}

func (f *firehose) Stream(ctx context.Context, _ *llm.Request) iter.Seq2[llm.Chunk, error] {
	return func(yield func(llm.Chunk, error) bool) {
		defer func() {
			if ctx.Err() != nil {
				f.once.Do(func() { close(f.closed) })
			}
		}()
		text := strings.Repeat("f", 1<<10)
		for {
			select {
			case <-f.release:
				for _, c := range fake.Text(" done") {
					if !yield(c, nil) {
						return
					}
				}
				return
			case <-ctx.Done():
				yield(llm.Chunk{}, ctx.Err())
				return
			default:
			}
			f.since.Store(time.Now().UnixNano())
			ok := yield(llm.Chunk{Kind: llm.ChunkText, Text: text}, nil)
			f.since.Store(0)
			f.chunks.Add(1)
			if !ok {
				return
			}
		}
	}
}

// held reports whether the turn has not taken the chunk under way for d:
// it reads no more of the model's reply.
func (f *firehose) held(d time.Duration) bool {
	s := f.since.Load()
	return s != 0 && time.Since(time.Unix(0, s)) >= d
}

// TestUnreadRunWaitsForReader: a durable turn whose only client reads nothing
// (its stream's flow-control window full) stops reading its model's
// reply, as a turn without a store is held by its stream, instead of
// running on and holding its whole reply for nobody (issue 37, row 2):
// what it read before it stopped is bounded by the windows between the
// model and the client, not by the reply. A client that reads again (the
// same stream, or another that watches the turn) resumes it: that client
// gets every event once, in order, equal to the log, which stored each
// before it was sent, and the turn completes.
func TestUnreadRunWaitsForReader(t *testing.T) {
	t.Parallel()
	// The turn's hold on a reader that reads nothing: gRPC's windows
	// (the client's 64 KiB, the server stream's 64 KiB write quota), the
	// run's window (64 KiB) and the batch its stream took, in 1 KiB
	// chunks, with room to spare; a turn that does not wait reads thousands.
	const maxHeld = 512
	for _, tc := range []struct {
		name string
		// resume makes a client read the turn again and returns what it
		// got and how the call ended; first is the event its stream read.
		resume func(t *testing.T, ts *testServer, stream turnstilev1.AgentService_RunTurnClient, first *turnstilev1.AgentEvent) func() ([]*turnstilev1.AgentEvent, *status.Status)
	}{
		{
			name: "its client reads on",
			resume: func(t *testing.T, _ *testServer, stream turnstilev1.AgentService_RunTurnClient, first *turnstilev1.AgentEvent) func() ([]*turnstilev1.AgentEvent, *status.Status) {
				return drainAsync(func() ([]*turnstilev1.AgentEvent, *status.Status) {
					evs, st := drainStream(stream.Recv)
					return append([]*turnstilev1.AgentEvent{first}, evs...), st
				})
			},
		},
		{
			name: "another client watches",
			resume: func(t *testing.T, ts *testServer, _ turnstilev1.AgentService_RunTurnClient, _ *turnstilev1.AgentEvent) func() ([]*turnstilev1.AgentEvent, *status.Status) {
				w, err := ts.client.WatchTurn(t.Context(), &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
				if err != nil {
					t.Fatal(err)
				}
				return drainAsync(func() ([]*turnstilev1.AgentEvent, *status.Status) { return drainStream(w.Recv) })
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFirehose()
			ts := start(t, runner(t, f), server.Options{Store: memStore(t)})
			stream, err := stingyClient(t, ts).RunTurn(t.Context(), hello())
			if err != nil {
				t.Fatal(err)
			}
			first, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			// Nothing more is read: the turn stops taking the model's
			// chunks, a bounded number of them taken.
			eventually(t, "the turn to stop reading the model", func() bool { return f.held(time.Second) })
			paused := f.chunks.Load()
			t.Logf("waits after %d chunks of 1 KiB", paused)
			if paused > maxHeld {
				t.Errorf("the turn read %d KiB of the reply for a client that reads nothing, want at most %d", paused, maxHeld)
			}

			wait := tc.resume(t, ts, stream, first.GetEvent())
			eventually(t, "the turn to read the model again", func() bool { return f.chunks.Load() > paused+8 })
			close(f.release)
			evs, st := wait()
			if st.Code() != codes.OK || len(evs) == 0 || evs[len(evs)-1].GetTurnCompleted() == nil {
				t.Fatalf("the reader's call ended %v after %s", st, wiretest.Names(evs))
			}
			log, _ := watch(t, t.Context(), ts.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
			sameEvents(t, "the reader's events against the log", evs, log)
			if n := deltaBytes(evs); n != int(f.chunks.Load())<<10+len(" done") {
				t.Errorf("%d bytes of text streamed for %d chunks", n, f.chunks.Load())
			}
		})
	}
}

// drainAsync runs drain on a goroutine of its own, so that the client
// reads while the test goes on, and returns a wait for its result.
func drainAsync(drain func() ([]*turnstilev1.AgentEvent, *status.Status)) func() ([]*turnstilev1.AgentEvent, *status.Status) {
	type result struct {
		evs []*turnstilev1.AgentEvent
		st  *status.Status
	}
	done := make(chan result, 1)
	go func() {
		evs, st := drain()
		done <- result{evs, st}
	}()
	return func() ([]*turnstilev1.AgentEvent, *status.Status) {
		r := <-done
		return r.evs, r.st
	}
}

// TestStalledRunWaitsThenDetaches: a durable turn whose client read
// nothing for server.send_timeout has its stream closed and keeps waiting
// for a reader (it does not run on for nobody) until its detach grace
// ends it like any turn nobody watches: its log ends with the messages
// that close its conversation and error CANCELLED, and the model's call
// is closed.
func TestStalledRunWaitsThenDetaches(t *testing.T) {
	t.Parallel()
	f := newFirehose()
	const sendTimeout, grace = 300 * time.Millisecond, 2 * time.Second
	ts := start(t, runner(t, f), server.Options{Store: memStore(t), SendTimeout: sendTimeout, DetachGrace: grace})
	stream, err := stingyClient(t, ts).RunTurn(t.Context(), hello())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// Held past the send timeout: the stream was closed, the turn waits
	// for a client, and, none coming, its grace cancels it.
	eventually(t, "the turn to stop reading the model", func() bool { return f.held(time.Second) })
	held := f.chunks.Load()
	select {
	case <-f.closed:
	case <-time.After(waitBound):
		t.Fatal("the model's call was not closed")
	}
	// The send timeout holds for this watch too: one a loaded machine cut
	// short is made again from its last event, as a client does.
	var log []*turnstilev1.AgentEvent
	var st *status.Status
	for {
		var after uint64
		if len(log) > 0 {
			after = log[len(log)-1].GetSeq()
		}
		more, wst := watch(t, context.Background(), ts.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1", AfterSeq: after})
		log, st = append(log, more...), wst
		if wst.Code() != codes.DeadlineExceeded {
			break
		}
	}
	if st.Code() != codes.Canceled {
		t.Fatalf("the turn ended %v after %s, want CANCELLED by the detach grace", st, wiretest.Names(log))
	}
	if d := time.Since(start); d < grace {
		t.Errorf("the turn ended %v after it stalled, before its detach grace (%v)", d, grace)
	}
	last := log[len(log)-1].GetError()
	if last.GetCode() != turnstilev1.ErrorCode_ERROR_CODE_CANCELLED || !strings.Contains(last.GetMessage(), "no client watched the turn") {
		t.Errorf("last event %v, want CANCELLED by the detach grace", last)
	}
	if got := wiretest.Names(log); got != "TurnStarted LlmCallStarted TextDelta MessageCompleted MessageCompleted Error" {
		t.Errorf("events: %s", got)
	}
	if n := f.chunks.Load(); n > held+1 {
		t.Errorf("the model's reply was read on while the turn waited: %d chunks, %d when it stalled", n, held)
	}
}
