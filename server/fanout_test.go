package server_test

import (
	"context"
	"fmt"
	"iter"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/server"
)

// gated is a provider whose one call streams n text chunks of size bytes,
// closes streamed, and waits for release (or its call's end) before it
// ends the reply; stopped is closed when the call returns.
type gated struct {
	n, size                    int
	streamed, release, stopped chan struct{}
}

func newGated(n, size int) *gated {
	return &gated{n: n, size: size, streamed: make(chan struct{}), release: make(chan struct{}), stopped: make(chan struct{})}
}

func (g *gated) Stream(ctx context.Context, _ *llm.Request) iter.Seq2[llm.Chunk, error] {
	return func(yield func(llm.Chunk, error) bool) {
		defer close(g.stopped)
		for i := range g.n {
			text := fmt.Sprintf("%08d", i) + strings.Repeat("x", g.size-8)
			if !yield(llm.Chunk{Kind: llm.ChunkText, Text: text}, nil) {
				return
			}
		}
		close(g.streamed)
		select {
		case <-g.release:
		case <-ctx.Done():
			yield(llm.Chunk{}, ctx.Err())
			return
		}
		if yield(llm.Chunk{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 1, OutputTokens: int64(g.n)}}, nil) {
			yield(llm.Chunk{Kind: llm.ChunkStop, Stop: llm.StopEndTurn}, nil)
		}
	}
}

// deltaBytes returns the bytes of text the deltas of evs hold.
func deltaBytes(evs []*turnstilev1.AgentEvent) int {
	n := 0
	for _, ev := range evs {
		n += len(ev.GetTextDelta().GetText())
	}
	return n
}

// stingyClient connects to ts with fixed 64 KiB flow-control windows: what
// it does not read stays in the server's queues.
func stingyClient(t *testing.T, ts *testServer) turnstilev1.AgentServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return turnstilev1.NewAgentServiceClient(conn)
}

// TestWatcherBehindTheWindow: the replica running a turn keeps only a
// window of its latest events; a watcher there that falls behind it (its
// client reads slowly, or it asks for events older than the window) is
// served from the log until it catches up, then from memory. Every
// watcher gets every event once, in order, equal to the log, and the
// turn's status.
func TestWatcherBehindTheWindow(t *testing.T) {
	t.Parallel()
	const chunks, size = 256, 4 << 10 // 1 MiB of text: many windows
	for _, tc := range []struct {
		name string
		// watch starts the watcher under test on ts once the turn is
		// under way, and returns a function that reads it to its end.
		watch func(t *testing.T, ts *testServer, g *gated) func() ([]*turnstilev1.AgentEvent, *status.Status)
		// logged is what the server's log says when the watcher turns to
		// the log.
		logged string
	}{
		{
			name: "slow reader of RunTurn",
			watch: func(t *testing.T, ts *testServer, g *gated) func() ([]*turnstilev1.AgentEvent, *status.Status) {
				stream, err := stingyClient(t, ts).RunTurn(t.Context(), hello())
				if err != nil {
					t.Fatal(err)
				}
				first, err := stream.Recv()
				if err != nil {
					t.Fatal(err)
				}
				// Another client reads the turn as it comes: a turn only
				// slow readers follow goes at their pace (TestUnreadRunWaitsForReader).
				reader, err := ts.client.WatchTurn(t.Context(), &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
				if err != nil {
					t.Fatal(err)
				}
				read := make(chan []*turnstilev1.AgentEvent, 1)
				go func() {
					evs, _ := drainStream(reader.Recv)
					read <- evs
				}()
				// The client reads nothing more until the model streamed
				// its whole reply, which leaves the window far behind.
				<-g.streamed
				close(g.release)
				<-g.stopped
				return func() ([]*turnstilev1.AgentEvent, *status.Status) {
					evs, st := drainStream(stream.Recv)
					evs = append([]*turnstilev1.AgentEvent{first.GetEvent()}, evs...)
					sameEvents(t, "the reader's events", <-read, evs)
					return evs, st
				}
			},
			logged: "a watcher fell behind the turn's window",
		},
		{
			name: "WatchTurn from before the window, turn running",
			watch: func(t *testing.T, ts *testServer, g *gated) func() ([]*turnstilev1.AgentEvent, *status.Status) {
				stream, err := ts.client.RunTurn(t.Context(), hello())
				if err != nil {
					t.Fatal(err)
				}
				var head []*turnstilev1.AgentEvent
				for deltaBytes(head) < chunks*size {
					resp, err := stream.Recv()
					if err != nil {
						t.Fatal(err)
					}
					head = append(head, resp.GetEvent())
				}
				// All the text was stored: seq 2 is long gone from the
				// window. The turn is still running here.
				w, err := ts.client.WatchTurn(t.Context(), &turnstilev1.WatchTurnRequest{TurnId: "turn-1", AfterSeq: 2})
				if err != nil {
					t.Fatal(err)
				}
				first, err := w.Recv()
				if err != nil {
					t.Fatal(err)
				}
				close(g.release)
				rest, st := drainStream(stream.Recv)
				if st.Code() != codes.OK {
					t.Errorf("RunTurn status %v", st)
				}
				all := append(head, rest...)
				return func() ([]*turnstilev1.AgentEvent, *status.Status) {
					evs, st := drainStream(w.Recv)
					evs = append([]*turnstilev1.AgentEvent{first.GetEvent()}, evs...)
					sameEvents(t, "RunTurn's events after seq 2", evs, all[2:])
					return append(all[:2:2], evs...), st
				}
			},
			logged: "after_seq=2",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs syncBuffer
			g := newGated(chunks, size)
			ts := start(t, runner(t, g), server.Options{Store: memStore(t), Logger: newLogger(&logs)})
			got, st := tc.watch(t, ts, g)()
			if st.Code() != codes.OK {
				t.Fatalf("status %v", st)
			}
			log, lst := watch(t, t.Context(), ts.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
			sameEvents(t, "the watcher's events against the log", got, log)
			sameStatus(t, "status", st, lst)
			if n := deltaBytes(got); n != chunks*size || got[len(got)-1].GetTurnCompleted() == nil {
				t.Errorf("%d bytes of text; events %s", n, wiretest.Names(got))
			}
			if !strings.Contains(logs.String(), "a watcher fell behind the turn's window") || !strings.Contains(logs.String(), tc.logged) {
				t.Errorf("the watcher was not served from the log; server log:\n%s", logs.String())
			}
		})
	}
}

// drainStream receives a stream's events until it ends.
func drainStream[R interface {
	GetEvent() *turnstilev1.AgentEvent
}](recv func() (R, error)) ([]*turnstilev1.AgentEvent, *status.Status) {
	var evs []*turnstilev1.AgentEvent
	for {
		resp, err := recv()
		if err != nil {
			st := status.Convert(err)
			if err.Error() == "EOF" {
				st = status.New(codes.OK, "")
			}
			return evs, st
		}
		evs = append(evs, resp.GetEvent())
	}
}

// TestDurableSendTimeout: a stream of a durable turn whose client accepts
// no event for server.send_timeout is closed with DEADLINE_EXCEEDED naming
// the timeout; the turn waits without it (detached and waiting for a reader, see
// TestStalledRunWaitsThenDetaches: another client watching it resumes it
// to its end, or the detach grace ends it), and what the client read is a
// gap-free prefix of the log.
func TestDurableSendTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	for _, tc := range []struct {
		name string
		// stall opens the stream whose client reads nothing.
		stall func(t *testing.T, ts *testServer, g *gated) func() (*turnstilev1.AgentEvent, error)
		// then ends the turn: released, or left to the detach grace.
		release bool
		want    string // the turn's last event
		// idle: the model streams two events larger than the client's
		// window and waits: gRPC takes the first, the second's Send
		// blocks, and the stream stalls while no event comes.
		idle bool
	}{
		{
			name: "RunTurn, the turn idle",
			stall: func(t *testing.T, ts *testServer, _ *gated) func() (*turnstilev1.AgentEvent, error) {
				s, err := stingyClient(t, ts).RunTurn(t.Context(), hello())
				if err != nil {
					t.Fatal(err)
				}
				return eventsOf(s.Recv)
			},
			idle:    true,
			release: true,
			want:    "TurnCompleted",
		},
		{
			name: "RunTurn, then the turn completes",
			stall: func(t *testing.T, ts *testServer, _ *gated) func() (*turnstilev1.AgentEvent, error) {
				s, err := stingyClient(t, ts).RunTurn(t.Context(), hello())
				if err != nil {
					t.Fatal(err)
				}
				return eventsOf(s.Recv)
			},
			release: true,
			want:    "TurnCompleted",
		},
		{
			name: "RunTurn, then nobody watches",
			stall: func(t *testing.T, ts *testServer, _ *gated) func() (*turnstilev1.AgentEvent, error) {
				s, err := stingyClient(t, ts).RunTurn(t.Context(), hello())
				if err != nil {
					t.Fatal(err)
				}
				return eventsOf(s.Recv)
			},
			want: "Error",
		},
		{
			name: "WatchTurn of the running turn",
			stall: func(t *testing.T, ts *testServer, _ *gated) func() (*turnstilev1.AgentEvent, error) {
				// The turn's own client reads it to its end.
				begun, done := make(chan struct{}), make(chan struct{})
				go func() {
					defer close(done)
					stream, err := ts.client.RunTurn(t.Context(), hello())
					if err == nil {
						_, err = stream.Recv()
					}
					close(begun)
					if err == nil {
						_, _ = drainStream(stream.Recv)
					}
				}()
				t.Cleanup(func() { <-done })
				<-begun
				w, err := stingyClient(t, ts).WatchTurn(t.Context(), &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
				if err != nil {
					t.Fatal(err)
				}
				return eventsOf(w.Recv)
			},
			release: true,
			want:    "TurnCompleted",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs syncBuffer
			g := newGated(256, 4<<10)
			if tc.idle {
				g = newGated(2, 512<<10)
			}
			// A turn released goes on for as long as it takes; one left to
			// the detach grace ends half a second after its stream stalled,
			// which may be before the model has streamed it all.
			grace := time.Minute
			if !tc.release {
				grace = 500 * time.Millisecond
			}
			ts := start(t, runner(t, g), server.Options{Store: memStore(t), SendTimeout: timeout, DetachGrace: grace, Logger: newLogger(&logs)})
			recv := tc.stall(t, ts, g)
			waitFor(t, func() bool { return strings.Contains(logs.String(), "grpc.code=DeadlineExceeded") })
			if tc.release {
				close(g.release)
			}
			// Reading now drains what was sent, then the status.
			var got []*turnstilev1.AgentEvent
			var st *status.Status
			for {
				ev, err := recv()
				if err != nil {
					st = status.Convert(err)
					break
				}
				got = append(got, ev)
			}
			if st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), "server.send_timeout") || !strings.Contains(st.Message(), "the turn goes on") {
				t.Errorf("status %v", st)
			}
			if info := errorInfoOf(st); info.GetReason() != "DEADLINE_EXCEEDED" {
				t.Errorf("ErrorInfo %v", info)
			}
			// The server's send_timeout holds for a watch too: one a loaded
			// machine cut short is made again from its last event, as a
			// client does.
			var log []*turnstilev1.AgentEvent
			readLog := func() {
				for len(log) == 0 || log[len(log)-1].GetError() == nil && log[len(log)-1].GetTurnCompleted() == nil {
					var after uint64
					if len(log) > 0 {
						after = log[len(log)-1].GetSeq()
					}
					more, wst := watch(t, t.Context(), ts.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1", AfterSeq: after})
					if len(more) == 0 && wst.Code() != codes.DeadlineExceeded {
						t.Fatalf("watching the log after seq %d: %v", after, wst)
					}
					log = append(log, more...)
				}
			}
			if tc.release {
				// A client watches it again: it goes on to its end.
				readLog()
				<-g.stopped
			} else {
				// Nobody does: the detach grace ends it.
				<-g.stopped
				readLog()
			}
			if names := wiretest.Names(log); !strings.HasSuffix(names, " "+tc.want) {
				t.Errorf("the turn's events: %s, want them to end with %s", names, tc.want)
			}
			if last := log[len(log)-1].GetError(); last != nil && (last.GetCode() != turnstilev1.ErrorCode_ERROR_CODE_CANCELLED || !strings.Contains(last.GetMessage(), "detach grace")) {
				t.Errorf("the turn ended with %v, want the detach grace's cancellation", last)
			}
			if len(got) == 0 || len(got) >= len(log) {
				t.Fatalf("the stalled client read %d events of %d", len(got), len(log))
			}
			sameEvents(t, "what the stalled client read", got, log[:len(got)])
		})
	}
}

// TestWatcherBesideThePushedStream: the stream of the RunTurn that created
// a run is fed by the run's publish itself; a WatchTurn attaching while
// the turn runs (from its first event, and from the middle) and the
// RunTurn each get every event once, in order, equal to the log, and the
// turn's status.
func TestWatcherBesideThePushedStream(t *testing.T) {
	t.Parallel()
	const chunks, size = 64, 64
	g := newGated(chunks, size)
	ts := start(t, runner(t, g), server.Options{Store: memStore(t)})
	stream, err := ts.client.RunTurn(t.Context(), hello())
	if err != nil {
		t.Fatal(err)
	}
	var head []*turnstilev1.AgentEvent
	for len(head) < 3 {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		head = append(head, resp.GetEvent())
	}
	type result struct {
		evs []*turnstilev1.AgentEvent
		st  *status.Status
	}
	watchers := make([]chan result, 2)
	for i, after := range []uint64{0, 2} {
		w, err := ts.client.WatchTurn(t.Context(), &turnstilev1.WatchTurnRequest{TurnId: "turn-1", AfterSeq: after})
		if err != nil {
			t.Fatal(err)
		}
		watchers[i] = make(chan result, 1)
		go func() {
			evs, st := drainStream(w.Recv)
			watchers[i] <- result{evs, st}
		}()
	}
	<-g.streamed
	close(g.release)
	rest, st := drainStream(stream.Recv)
	if st.Code() != codes.OK {
		t.Fatalf("RunTurn status %v", st)
	}
	got := append(head, rest...)
	log, lst := watch(t, t.Context(), ts.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
	sameEvents(t, "RunTurn's events against the log", got, log)
	sameStatus(t, "RunTurn's status", st, lst)
	if n := deltaBytes(got); n != chunks*size || got[len(got)-1].GetTurnCompleted() == nil {
		t.Errorf("%d bytes of text; events %s", n, wiretest.Names(got))
	}
	for i, after := range []int{0, 2} {
		w := <-watchers[i]
		sameEvents(t, fmt.Sprintf("the watcher after seq %d against the log", after), w.evs, log[after:])
		sameStatus(t, "the watcher's status", w.st, lst)
	}
}
