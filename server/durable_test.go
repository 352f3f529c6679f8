package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
)

// watch collects the events of a WatchTurn and its final status.
func watch(t testing.TB, ctx context.Context, c turnstilev1.AgentServiceClient, req *turnstilev1.WatchTurnRequest) ([]*turnstilev1.AgentEvent, *status.Status) {
	t.Helper()
	return wiretest.Watch(t, ctx, c, req)
}

func sameEvents(t testing.TB, what string, got, want []*turnstilev1.AgentEvent) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d events, want %d:\n got %s\nwant %s", what, len(got), len(want), wiretest.Names(got), wiretest.Names(want))
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("%s: event %d differs:\n got %v\nwant %v", what, i, got[i], want[i])
		}
	}
}

func sameStatus(t testing.TB, what string, got, want *status.Status) {
	t.Helper()
	if !proto.Equal(got.Proto(), want.Proto()) {
		t.Errorf("%s: status %v, want %v", what, got.Proto(), want.Proto())
	}
}

// TestDurableTurnsMatchAndReplay runs the e2e table's kinds of turns with a
// store: the events and the status are the ones of a server without one,
// and WatchTurn replays them exactly, from the start or from any seq.
func TestDurableTurnsMatchAndReplay(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		replies []fake.Reply
		tools   []llm.Tool
		want    string
		code    codes.Code
	}{
		{"plain turn", []fake.Reply{{Chunks: fake.Text("Hello there")}}, nil,
			"TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted", codes.OK},
		{"server-side tool", []fake.Reply{{Chunks: fake.Call("c1", "lookup", `{"q":"x"}`)}, {Chunks: fake.Text("It is 42")}}, []llm.Tool{fake.NewTool("lookup", nil)},
			"TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted ToolFinished MessageCompleted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted", codes.OK},
		{"overloaded until retries run out", []fake.Reply{{Err: &llm.Error{Kind: llm.KindOverloaded, Message: "Overloaded"}}}, nil,
			"TurnStarted LlmCallStarted LlmCallFinished Retry LlmCallStarted LlmCallFinished Retry LlmCallStarted LlmCallFinished Error", codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ts := start(t, runner(t, fake.NewProvider(tt.replies...), tt.tools...), server.Options{Store: memStore(t)})
			evs, st := wiretest.Collect(t, t.Context(), ts.client, hello(), nil)
			if got := wiretest.Names(evs); got != tt.want {
				t.Fatalf("events:\n got %s\nwant %s", got, tt.want)
			}
			if st.Code() != tt.code {
				t.Errorf("status = %v, want %v", st, tt.code)
			}
			if tt.code != codes.OK {
				assertStatusMatchesEvent(t, st, evs[len(evs)-1].GetError())
			}
			for _, ev := range evs {
				if ev.GetAttempt() != 1 || ev.GetTurnId() != "turn-1" {
					t.Fatalf("event %d: turn %q attempt %d", ev.GetSeq(), ev.GetTurnId(), ev.GetAttempt())
				}
			}
			for _, after := range []uint64{0, 1, uint64(len(evs)) / 2, uint64(len(evs)) - 1, uint64(len(evs))} {
				got, wst := watch(t, t.Context(), ts.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1", AfterSeq: after})
				sameEvents(t, fmt.Sprintf("watch after %d", after), got, evs[after:])
				sameStatus(t, fmt.Sprintf("watch after %d", after), wst, st)
			}
		})
	}
}

// TestRunTurnIsIdempotent: 100 concurrent RunTurns with one new id run one
// turn and get 100 identical streams; a repeat after the end replays it.
func TestRunTurnIsIdempotent(t *testing.T) {
	t.Parallel()
	p := fake.NewProvider(fake.Reply{Chunks: append([]llm.Chunk{{Kind: llm.ChunkText, Text: "a"}, {Kind: llm.ChunkText, Text: "b"}}, fake.Text("c")...)})
	ts := start(t, runner(t, p), server.Options{Store: memStore(t)})
	const n = 100
	streams := make([][]*turnstilev1.AgentEvent, n)
	statuses := make([]*status.Status, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			streams[i], statuses[i] = wiretest.Collect(t, t.Context(), ts.client, hello(), nil)
		}()
	}
	wg.Wait()
	if p.Calls() != 1 {
		t.Fatalf("the provider got %d calls, want 1", p.Calls())
	}
	for i := range n {
		sameEvents(t, fmt.Sprintf("stream %d", i), streams[i], streams[0])
		sameStatus(t, fmt.Sprintf("stream %d", i), statuses[i], statuses[0])
	}
	again, st := wiretest.Collect(t, t.Context(), ts.client, hello(), nil)
	sameEvents(t, "repeat", again, streams[0])
	sameStatus(t, "repeat", st, statuses[0])
	if p.Calls() != 1 {
		t.Fatalf("the provider got %d calls after a repeat, want 1", p.Calls())
	}
}

// TestAttempts: a different request under the same id and attempt is
// ALREADY_EXISTS; the next attempt is a run of its own, named by the field
// or by an older client's metadata.
func TestAttempts(t *testing.T) {
	t.Parallel()
	p := fake.NewProvider(fake.Reply{Chunks: fake.Text("hi")})
	ts := start(t, runner(t, p), server.Options{Store: memStore(t)})
	if _, st := wiretest.Collect(t, t.Context(), ts.client, hello(), nil); st.Code() != codes.OK {
		t.Fatal(st)
	}
	other := hello()
	other.System = "be brief"
	evs, st := wiretest.Collect(t, t.Context(), ts.client, other, nil)
	if len(evs) != 0 || st.Code() != codes.AlreadyExists {
		t.Fatalf("reused id: %d events, status %v; want none and ALREADY_EXISTS", len(evs), st)
	}
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if d, ok := d.(*errdetails.ErrorInfo); ok {
			info = d
		}
	}
	if info.GetReason() != server.ReasonTurnIDReused || info.GetMetadata()["attempt"] != "1" {
		t.Errorf("ErrorInfo = %v", info)
	}

	other.Attempt = 2
	evs, st = wiretest.Collect(t, t.Context(), ts.client, other, nil)
	if st.Code() != codes.OK || evs[0].GetAttempt() != 2 || evs[0].GetSeq() != 1 {
		t.Fatalf("attempt 2: %v, first event %v", st, evs[0])
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), server.AttemptHeader, "3")
	evs, st = wiretest.Collect(t, ctx, ts.client, hello(), nil)
	if st.Code() != codes.OK || evs[0].GetAttempt() != 3 {
		t.Fatalf("attempt 3 by metadata: %v, first event %v", st, evs[0])
	}
	if p.Calls() != 3 {
		t.Errorf("provider calls = %d, want 3", p.Calls())
	}
	// Attempt 0 watches the latest.
	got, _ := watch(t, t.Context(), ts.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
	sameEvents(t, "latest attempt", got, evs)
}

func TestWatchAndCancelErrors(t *testing.T) {
	t.Parallel()
	withStore := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("x")})), server.Options{Store: memStore(t)})
	without := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("x")})), server.Options{})
	tests := []struct {
		name string
		ts   *testServer
		id   string
		code codes.Code
	}{
		{"unknown turn", withStore, "nope", codes.NotFound},
		{"no turn id", withStore, "", codes.InvalidArgument},
		{"no store", without, "turn-1", codes.FailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs, st := watch(t, t.Context(), tt.ts.client, &turnstilev1.WatchTurnRequest{TurnId: tt.id})
			if len(evs) != 0 || st.Code() != tt.code {
				t.Errorf("WatchTurn: %d events, %v; want %v", len(evs), st, tt.code)
			}
			_, err := tt.ts.client.CancelTurn(t.Context(), &turnstilev1.CancelTurnRequest{TurnId: tt.id})
			if status.Code(err) != tt.code {
				t.Errorf("CancelTurn: %v; want %v", err, tt.code)
			}
		})
	}
}

// hang is a provider reply that streams a delta and then waits until the
// turn is cancelled.
var hang = fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "thinking about it"}}, Hang: true}

// firstEvents receives the next n events of a RunTurn.
func firstEvents(t *testing.T, stream interface {
	Recv() (*turnstilev1.RunTurnResponse, error)
}, n int) []*turnstilev1.AgentEvent {
	t.Helper()
	var evs []*turnstilev1.AgentEvent
	for len(evs) < n {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		evs = append(evs, resp.GetEvent())
	}
	return evs
}

// untilToolStarted receives events up to the first ToolStarted.
func untilToolStarted(t *testing.T, stream interface {
	Recv() (*turnstilev1.RunTurnResponse, error)
}) []*turnstilev1.AgentEvent {
	t.Helper()
	var evs []*turnstilev1.AgentEvent
	for len(evs) == 0 || evs[len(evs)-1].GetToolStarted() == nil {
		evs = append(evs, firstEvents(t, stream, 1)...)
	}
	return evs
}

// TestCancelTurnStopsForEveryWatcher: CancelTurn, sent to another
// replica, stops the turn; the caller and a watcher both end with the
// CANCELLED error event, and a second cancel changes nothing.
func TestCancelTurnStopsForEveryWatcher(t *testing.T) {
	t.Parallel()
	rs := startReplicas(t, 2, func(int) *runtime.Runner { return runner(t, fake.NewProvider(hang)) }, nil)
	a, b := rs[0], rs[1]
	stream, err := a.client.RunTurn(t.Context(), hello())
	if err != nil {
		t.Fatal(err)
	}
	head := firstEvents(t, stream, 3) // TurnStarted LlmCallStarted TextDelta
	type result struct {
		evs []*turnstilev1.AgentEvent
		st  *status.Status
	}
	watched := make(chan result, 1)
	go func() {
		evs, st := watch(t, t.Context(), b.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1", Attempt: 1})
		watched <- result{evs, st}
	}()
	resp, err := b.client.CancelTurn(t.Context(), &turnstilev1.CancelTurnRequest{TurnId: "turn-1"})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetCancelled() || resp.GetAttempt() != 1 {
		t.Errorf("CancelTurn = %v, want cancelled attempt 1", resp)
	}
	var rest []*turnstilev1.AgentEvent
	for {
		r, err := stream.Recv()
		if err != nil {
			if status.Code(err) != codes.Canceled {
				t.Errorf("RunTurn ended with %v, want CANCELLED", err)
			}
			break
		}
		rest = append(rest, r.GetEvent())
	}
	all := append(head, rest...)
	// The partial reply and the interruption note close the conversation.
	if got := wiretest.Names(all); got != "TurnStarted LlmCallStarted TextDelta MessageCompleted MessageCompleted Error" {
		t.Fatalf("events = %s", got)
	}
	if code := all[len(all)-1].GetError().GetCode(); code != turnstilev1.ErrorCode_ERROR_CODE_CANCELLED {
		t.Errorf("last event code = %v", code)
	}
	if resp.GetLastSeq() != uint64(len(all)) {
		t.Errorf("last_seq = %d, want %d", resp.GetLastSeq(), len(all))
	}
	w := <-watched
	sameEvents(t, "watcher on the other replica", w.evs, all)
	if w.st.Code() != codes.Canceled {
		t.Errorf("watcher status = %v", w.st)
	}
	again, err := b.client.CancelTurn(t.Context(), &turnstilev1.CancelTurnRequest{TurnId: "turn-1", Attempt: 1})
	if err != nil || again.GetCancelled() || again.GetLastSeq() != uint64(len(all)) {
		t.Errorf("second CancelTurn = %v, %v", again, err)
	}
}

// TestDisconnectIsNotCancel: a client that goes away leaves its turn
// running; a client that re-attaches within the detach grace keeps it
// alive and sees it end; a turn nobody watches is cancelled after the
// grace.
func TestDisconnectIsNotCancel(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var calls atomic.Int32
	tool := fake.NewTool("wait", func(ctx context.Context, _ llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
		calls.Add(1)
		select {
		case <-release:
			return llm.ToolOutput{Content: "done"}, nil
		case <-ctx.Done():
			return llm.ToolOutput{}, ctx.Err()
		}
	})
	p := fake.NewProvider(fake.Reply{Chunks: fake.Call("c1", "wait", `{}`)}, fake.Reply{Chunks: fake.Text("finished")})
	const grace = 300 * time.Millisecond
	ts := start(t, runner(t, p, tool), server.Options{Store: memStore(t), DetachGrace: grace})

	ctx, cancel := context.WithCancel(t.Context())
	stream, err := ts.client.RunTurn(ctx, hello())
	if err != nil {
		t.Fatal(err)
	}
	head := untilToolStarted(t, stream)
	cancel() // the client goes away mid-tool
	wctx, wcancel := context.WithCancel(t.Context())
	defer wcancel()
	w, err := ts.client.WatchTurn(wctx, &turnstilev1.WatchTurnRequest{TurnId: "turn-1", AfterSeq: uint64(len(head))})
	if err != nil {
		t.Fatal(err)
	}
	// The watcher keeps the turn alive well past the grace.
	<-time.After(3 * grace)
	close(release)
	var rest []*turnstilev1.AgentEvent
	for {
		r, err := w.Recv()
		if err != nil {
			if err != io.EOF {
				t.Fatalf("watch: %v", err)
			}
			break
		}
		rest = append(rest, r.GetEvent())
	}
	if got := wiretest.Names(append(head, rest...)); got != "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted ToolFinished MessageCompleted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted" {
		t.Fatalf("events = %s", got)
	}

	if calls.Load() != 1 {
		t.Errorf("the tool ran %d times", calls.Load())
	}

	// Nobody watches the second turn: it is cancelled after the grace.
	stopped := make(chan struct{})
	blocker := fake.NewTool("block", func(ctx context.Context, _ llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
		<-ctx.Done()
		close(stopped)
		return llm.ToolOutput{}, ctx.Err()
	})
	p2 := fake.NewProvider(fake.Reply{Chunks: fake.Call("c1", "block", `{}`)})
	ts2 := start(t, runner(t, p2, blocker), server.Options{Store: memStore(t), DetachGrace: grace})
	ctx2, cancel2 := context.WithCancel(t.Context())
	stream2, err := ts2.client.RunTurn(ctx2, hello())
	if err != nil {
		t.Fatal(err)
	}
	untilToolStarted(t, stream2)
	left := time.Now()
	cancel2()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the turn nobody watches was not cancelled")
	}
	if waited := time.Since(left); waited < grace {
		t.Errorf("cancelled after %v, before the grace of %v", waited, grace)
	}
	evs, st := watch(t, t.Context(), ts2.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
	last := evs[len(evs)-1].GetError()
	if st.Code() != codes.Canceled || last.GetCode() != turnstilev1.ErrorCode_ERROR_CODE_CANCELLED || !strings.Contains(last.GetMessage(), "detach grace") {
		t.Errorf("detached turn ended with %v, last event %v", st, last)
	}
}

// TestReattachTrials cuts streams at random points and re-attaches with
// WatchTurn from the last seq received, on a random replica: the pieces
// always join into the stored log, with no gap and no duplicate.
func TestReattachTrials(t *testing.T) {
	t.Parallel()
	// TURNSTILE_TRIALS runs more (BENCHMARKS.md has the 10,000-trial run).
	trials := 60
	if testing.Short() {
		trials = 10
	}
	if n, err := strconv.Atoi(os.Getenv("TURNSTILE_TRIALS")); err == nil && n > 0 {
		trials = n
	}
	began := time.Now()
	defer func() { t.Logf("%d trials in %v", trials, time.Since(began)) }()
	var chunks []llm.Chunk
	for i := range 20 {
		chunks = append(chunks, llm.Chunk{Kind: llm.ChunkText, Text: fmt.Sprintf("w%d ", i)})
	}
	reply := fake.Reply{Chunks: append(chunks, fake.Text("end")...)}
	var logger *slog.Logger
	if os.Getenv("TURNSTILE_TRIALS_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	replicas := startReplicas(t, 2, func(int) *runtime.Runner { return runner(t, fake.NewProvider(reply)) },
		func(int) server.Options { return server.Options{Logger: logger} })
	violations := runTrials(t, replicas, trials, rand.New(rand.NewPCG(1, 2)))
	if violations != 0 {
		t.Fatalf("%d sequence violations in %d trials", violations, trials)
	}
}

// runTrials runs n disconnect/re-attach trials and returns the number of
// sequence violations: a gap, a duplicate, an event different from the
// log's, or a turn whose client never saw its last event. A re-attach that
// answers UNAVAILABLE (retryable) is made again, as the Go client does;
// those are counted apart and logged.
func runTrials(t testing.TB, replicas []*testServer, n int, rng *rand.Rand) int {
	violations, unavailable := 0, 0
	// recv takes up to take events from stream into got; it returns the
	// status the stream ended with, nil when it was cut.
	recv := func(stream interface {
		Recv() (*turnstilev1.AgentEvent, error)
	}, take int, got *[]*turnstilev1.AgentEvent) *status.Status {
		for range take {
			ev, err := stream.Recv()
			if err == io.EOF {
				return status.New(codes.OK, "")
			}
			if err != nil {
				return status.Convert(err)
			}
			*got = append(*got, ev)
		}
		return nil
	}
	for i := range n {
		req := hello()
		req.TurnId = fmt.Sprintf("trial-%d", i)
		var got []*turnstilev1.AgentEvent
		ctx, cancel := context.WithCancel(context.Background())
		stream, err := replicas[rng.IntN(len(replicas))].client.RunTurn(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		last := recv(eventsOf(stream.Recv), 1+rng.IntN(30), &got)
		cancel()
		for tries := 0; tries < 20 && (last == nil || last.Code() == codes.Unavailable); tries++ {
			if last != nil {
				unavailable++
			}
			// Re-attach where the client stopped, possibly to be cut again.
			var after uint64
			if len(got) > 0 {
				after = got[len(got)-1].GetSeq()
			}
			ctx, cancel := context.WithCancel(context.Background())
			w, err := replicas[rng.IntN(len(replicas))].client.WatchTurn(ctx, &turnstilev1.WatchTurnRequest{TurnId: req.TurnId, Attempt: 1, AfterSeq: after})
			if err != nil {
				t.Fatal(err)
			}
			last = recv(eventsOf(w.Recv), 1+rng.IntN(30), &got)
			cancel()
		}
		if last == nil || last.Code() != codes.OK {
			t.Errorf("trial %d ended with %v", i, last)
			violations++
			continue
		}
		log, _ := watch(t, context.Background(), replicas[0].client, &turnstilev1.WatchTurnRequest{TurnId: req.TurnId, Attempt: 1})
		ok := len(got) == len(log)
		for j := 0; ok && j < len(got); j++ {
			ok = got[j].GetSeq() == uint64(j+1) && proto.Equal(got[j], log[j])
		}
		if !ok {
			violations++
			t.Errorf("trial %d: got %s\nlog %s", i, wiretest.Names(got), wiretest.Names(log))
		}
	}
	t.Logf("%d trials: %d sequence violations; %d re-attaches answered UNAVAILABLE and were made again", n, violations, unavailable)
	return violations
}

// eventsOf adapts a stream's Recv to one that returns its event.
func eventsOf[R interface {
	GetEvent() *turnstilev1.AgentEvent
}](recv func() (R, error)) eventRecv {
	return func() (*turnstilev1.AgentEvent, error) {
		r, err := recv()
		return r.GetEvent(), err
	}
}

// eventRecv receives the next event of a stream.
type eventRecv func() (*turnstilev1.AgentEvent, error)

// Recv calls f.
func (f eventRecv) Recv() (*turnstilev1.AgentEvent, error) { return f() }

// TestMaxRunningTurns: turns outlive their streams, so a server bounds
// the turns it runs; beyond the bound RunTurn answers a retryable
// UNAVAILABLE before any event, and a slot frees when a turn ends.
func TestMaxRunningTurns(t *testing.T) {
	t.Parallel()
	ts := start(t, runner(t, fake.NewProvider(hang)), server.Options{Store: memStore(t), MaxRunningTurns: 1})
	stream, err := ts.client.RunTurn(t.Context(), hello())
	if err != nil {
		t.Fatal(err)
	}
	firstEvents(t, stream, 3)
	second := hello()
	second.TurnId = "turn-2"
	evs, st := wiretest.Collect(t, t.Context(), ts.client, second, nil)
	if len(evs) != 0 || st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "max_running_turns") {
		t.Fatalf("second turn: %d events, %v", len(evs), st)
	}
	if _, err := ts.client.CancelTurn(t.Context(), &turnstilev1.CancelTurnRequest{TurnId: "turn-1"}); err != nil {
		t.Fatal(err)
	}
	for {
		// The cancelled turn's last event, then its status.
		if _, err := stream.Recv(); err != nil {
			if status.Code(err) != codes.Canceled {
				t.Fatalf("first turn ended with %v", err)
			}
			break
		}
	}
	third := hello()
	third.TurnId = "turn-3"
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	s3, err := ts.client.RunTurn(ctx, third)
	if err != nil {
		t.Fatal(err)
	}
	firstEvents(t, s3, 1)
}

// TestTurnsBelongToTheirKey: with client keys, a turn is its creator's:
// another key can neither watch nor cancel it (NOT_FOUND, as for a turn
// that does not exist), nor attach to it by repeating its request, which
// runs a turn of its own.
func TestTurnsBelongToTheirKey(t *testing.T) {
	t.Parallel()
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("mine")})), server.Options{
		Store: memStore(t), Keys: []server.Key{keyed("a", "tok-a-0123456789"), keyed("b", "tok-b-0123456789")},
	})
	asA, asB := bearer(t.Context(), "tok-a-0123456789"), bearer(t.Context(), "tok-b-0123456789")
	evs, st := wiretest.Collect(t, asA, ts.client, hello(), nil)
	if st.Code() != codes.OK {
		t.Fatal(st)
	}
	if got, _ := watch(t, asA, ts.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"}); len(got) != len(evs) {
		t.Errorf("its own key watched %d events of %d", len(got), len(evs))
	}
	if got, st := watch(t, asB, ts.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"}); len(got) != 0 || st.Code() != codes.NotFound {
		t.Errorf("another key's WatchTurn: %d events, %v", len(got), st)
	}
	if _, err := ts.client.CancelTurn(asB, &turnstilev1.CancelTurnRequest{TurnId: "turn-1"}); status.Code(err) != codes.NotFound {
		t.Errorf("another key's CancelTurn: %v", err)
	}
	// The same request under another key is that key's own turn.
	if got, st := wiretest.Collect(t, asB, ts.client, hello(), nil); len(got) != len(evs) || st.Code() != codes.OK {
		t.Errorf("another key's repeat: %d events, %v", len(got), st)
	}
}

// TestDurableOversizedEventEndsTurn: an event of a durable run that cannot
// be made to fit max_event_bytes ends the run with a stored INTERNAL error
// event in its place (seq gap-free), so the caller, a watcher on another
// replica and every replay end alike instead of waiting for an event that
// never comes.
func TestDurableOversizedEventEndsTurn(t *testing.T) {
	t.Parallel()
	var chunks []llm.Chunk
	for range 100 {
		chunks = append(chunks, llm.Chunk{Kind: llm.ChunkText, Text: strings.Repeat("y", 1024)})
	}
	chunks = append(chunks, llm.Chunk{Kind: llm.ChunkStop, Stop: llm.StopEndTurn})
	rs := startReplicas(t, 2, func(i int) *runtime.Runner {
		if i == 0 {
			return runner(t, fake.NewProvider(fake.Reply{Chunks: chunks}))
		}
		return runner(t, fake.NewProvider())
	}, func(int) server.Options { return server.Options{MaxEventBytes: 64 << 10} })
	a, b := rs[0], rs[1]

	evs, st := wiretest.Collect(t, t.Context(), a.client, hello(), nil)
	// Names runs deltas together: the 100 text deltas are there too,
	// merged into fewer while the store had many unacknowledged.
	text := 0
	for _, ev := range evs {
		text += len(ev.GetTextDelta().GetText())
	}
	if got, want := wiretest.Names(evs), "TurnStarted LlmCallStarted TextDelta LlmCallFinished Error"; got != want || text != 100*1024 {
		t.Fatalf("%d events, %d bytes of text:\n got %s\nwant %s", len(evs), text, got, want)
	}
	for i, ev := range evs {
		if ev.GetSeq() != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i+1, ev.GetSeq())
		}
	}
	e := evs[len(evs)-1].GetError()
	if st.Code() != codes.Internal || !strings.Contains(st.Message(), "server.max_event_bytes") || e.GetRetryable() || e.GetCode() != turnstilev1.ErrorCode_ERROR_CODE_INTERNAL {
		t.Errorf("status %v, error event %v", st, e)
	}
	assertStatusMatchesEvent(t, st, e)
	for _, ts := range []*testServer{a, b} {
		for _, after := range []uint64{0, uint64(len(evs)) / 2, uint64(len(evs)) - 1} {
			got, wst := watch(t, t.Context(), ts.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1", AfterSeq: after})
			sameEvents(t, fmt.Sprintf("watch after %d", after), got, evs[after:])
			sameStatus(t, fmt.Sprintf("watch after %d", after), wst, st)
		}
	}
	// The same request again attaches to the run and replays it.
	again, ast := wiretest.Collect(t, t.Context(), b.client, hello(), nil)
	sameEvents(t, "RunTurn again", again, evs)
	sameStatus(t, "RunTurn again", ast, st)
}
