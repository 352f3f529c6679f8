package server_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"iter"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
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

// startDetached starts a turn with id and returns once its first text
// delta arrived, having cut the client's stream: the turn goes on
// detached.
func startDetached(t *testing.T, ctx context.Context, c turnstilev1.AgentServiceClient, id string) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req := hello()
	req.TurnId = id
	stream, err := c.RunTurn(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("turn %s: %v", id, err)
		}
		if resp.GetEvent().GetTextDelta() != nil {
			return
		}
	}
}

// TestDetachedTurnsHoldTheirSlots: a durable turn outlives its stream, and
// holds its key's concurrent_turns slot and the server's
// max_concurrent_turns slot until it ends, not until its client goes: two
// turns whose clients disconnected keep the third refused; once they end,
// a turn is admitted again.
func TestDetachedTurnsHoldTheirSlots(t *testing.T) {
	t.Parallel()
	two := 2
	k := keyed("limited", "tok-limited-0123")
	k.Limits = server.KeyLimits{ConcurrentTurns: &two}
	tests := []struct {
		name  string
		opts  server.Options
		ctx   func(context.Context) context.Context
		limit string
	}{
		{"key's concurrent_turns", server.Options{Keys: []server.Key{k}},
			func(ctx context.Context) context.Context { return bearer(ctx, "tok-limited-0123") }, "concurrent_turns"},
		{"server's max_concurrent_turns", server.Options{MaxConcurrentTurns: 2},
			func(ctx context.Context) context.Context { return ctx }, "max_concurrent_turns"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			opts := tt.opts
			opts.Store, opts.DetachGrace = memStore(t), time.Minute
			ts := start(t, runner(t, hanging(t)), opts)
			ctx := tt.ctx(t.Context())
			startDetached(t, ctx, ts.client, "one")
			startDetached(t, ctx, ts.client, "two")
			third := hello()
			third.TurnId = "three"
			evs, st := wiretest.Collect(t, ctx, ts.client, third, nil)
			refusedWith(t, evs, st, tt.limit, true)
			// Both still run, detached.
			for _, id := range []string{"one", "two"} {
				resp, err := ts.client.CancelTurn(ctx, &turnstilev1.CancelTurnRequest{TurnId: id})
				if err != nil || !resp.GetCancelled() {
					t.Fatalf("CancelTurn %s: %v, %v; want a running turn cancelled", id, resp, err)
				}
			}
			// Their slots are free once CancelTurn returned.
			startDetached(t, ctx, ts.client, "three")
			if _, err := ts.client.CancelTurn(ctx, &turnstilev1.CancelTurnRequest{TurnId: "three"}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestTurnIDsAreEachKeys: a turn id belongs to the key that used it; for
// any other key it does not exist. Key b squatting on a's running turn
// with attempt 4294967295 is refused as an attempt that follows nothing
// (as for an unknown id), and changes nothing for a: a's WatchTurn and
// CancelTurn of the latest attempt, and its next attempt, find a's runs.
// Two keys using one id run two turns that never meet, and no answer
// tells either that the other used it.
func TestTurnIDsAreEachKeys(t *testing.T) {
	t.Parallel()
	p := fake.NewProvider(hang, fake.Reply{Chunks: fake.Text("b's own")}, fake.Reply{Chunks: fake.Text("a's second")})
	ts := start(t, runner(t, p), server.Options{
		Store: memStore(t), DetachGrace: time.Minute,
		// "a:1" and "a" with ids "x" and "1:x" would meet under an
		// encoding without the name's length.
		Keys: []server.Key{keyed("a", "tok-a-0123456789"), keyed("b", "tok-b-0123456789"), keyed("a:1", "tok-c-0123456789")},
	})
	asA, asB, asC := bearer(t.Context(), "tok-a-0123456789"), bearer(t.Context(), "tok-b-0123456789"), bearer(t.Context(), "tok-c-0123456789")
	startDetached(t, asA, ts.client, "turn-1") // a's turn runs

	squat := hello()
	squat.Attempt = math.MaxUint32
	evs, st := wiretest.Collect(t, asB, ts.client, squat, nil)
	if len(evs) != 0 || st.Code() != codes.InvalidArgument || fieldOf(st) != "attempt" {
		t.Fatalf("squatting attempt: %d events, %v; want INVALID_ARGUMENT naming attempt", len(evs), st)
	}
	// The same answer as for an id nobody used.
	unused := hello()
	unused.TurnId, unused.Attempt = "never-used", math.MaxUint32
	_, ust := wiretest.Collect(t, asB, ts.client, unused, nil)
	if ust.Code() != st.Code() || strings.ReplaceAll(ust.Message(), "never-used", "turn-1") != st.Message() {
		t.Errorf("unknown id: %v; used by another key: %v", ust, st)
	}
	for _, c := range []context.Context{asB, asC} {
		if got, st := watch(t, c, ts.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"}); len(got) != 0 || st.Code() != codes.NotFound {
			t.Errorf("another key's WatchTurn: %d events, %v", len(got), st)
		}
		if _, err := ts.client.CancelTurn(c, &turnstilev1.CancelTurnRequest{TurnId: "turn-1"}); status.Code(err) != codes.NotFound {
			t.Errorf("another key's CancelTurn: %v", err)
		}
	}
	// b's turn under the same id is b's own.
	bEvs, bst := wiretest.Collect(t, asB, ts.client, hello(), nil)
	if bst.Code() != codes.OK || deltaText(bEvs) != "b's own" || bEvs[0].GetTurnId() != "turn-1" {
		t.Fatalf("b's turn-1: %v, text %q", bst, deltaText(bEvs))
	}
	if got, _ := watch(t, asB, ts.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"}); deltaText(got) != "b's own" {
		t.Errorf("b watched %q", deltaText(got))
	}
	// a's latest attempt is still its running attempt 1.
	resp, err := ts.client.CancelTurn(asA, &turnstilev1.CancelTurnRequest{TurnId: "turn-1"})
	if err != nil || !resp.GetCancelled() || resp.GetAttempt() != 1 {
		t.Fatalf("a's CancelTurn: %v, %v", resp, err)
	}
	aEvs, ast := watch(t, asA, ts.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
	if ast.Code() != codes.Canceled || aEvs[len(aEvs)-1].GetError().GetCode() != turnstilev1.ErrorCode_ERROR_CODE_CANCELLED {
		t.Errorf("a's turn ended %v", ast)
	}
	next := hello()
	next.Attempt = 2
	aEvs, ast = wiretest.Collect(t, asA, ts.client, next, nil)
	if ast.Code() != codes.OK || deltaText(aEvs) != "a's second" || aEvs[0].GetAttempt() != 2 {
		t.Fatalf("a's attempt 2: %v, text %q", ast, deltaText(aEvs))
	}

	// Colliding names: "a" with id "1:x" and "a:1" with id "x".
	collide := func(ctx context.Context, id string) *status.Status {
		req := hello()
		req.TurnId = id
		_, st := wiretest.Collect(t, ctx, ts.client, req, nil)
		return st
	}
	if st := collide(asA, "1:x"); st.Code() != codes.OK {
		t.Fatalf("a's 1:x: %v", st)
	}
	if got, st := watch(t, asC, ts.client, &turnstilev1.WatchTurnRequest{TurnId: "x"}); len(got) != 0 || st.Code() != codes.NotFound {
		t.Errorf("a:1 watched a's turn: %d events, %v", len(got), st)
	}
	if st := collide(asC, "x"); st.Code() != codes.OK {
		t.Fatalf("a:1's x: %v", st)
	}
}

// fieldOf returns the field a status's BadRequest names first.
func fieldOf(st *status.Status) string {
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	return ""
}

// TestAttemptMustFollow: attempt n runs only after attempt n-1 of the
// turn (1 always); a gap is INVALID_ARGUMENT naming attempt. A repeat of a
// stored attempt attaches as before.
func TestAttemptMustFollow(t *testing.T) {
	t.Parallel()
	p := fake.NewProvider(fake.Reply{Chunks: fake.Text("hi")})
	ts := start(t, runner(t, p), server.Options{Store: memStore(t)})
	run := func(id string, attempt uint32) ([]*turnstilev1.AgentEvent, *status.Status) {
		req := hello()
		req.TurnId, req.Attempt = id, attempt
		return wiretest.Collect(t, t.Context(), ts.client, req, nil)
	}
	steps := []struct {
		id      string
		attempt uint32
		code    codes.Code
	}{
		{"t", 2, codes.InvalidArgument},
		{"t", 1, codes.OK},
		{"t", 3, codes.InvalidArgument},
		{"t", math.MaxUint32, codes.InvalidArgument},
		{"t", 2, codes.OK},
		{"t", 2, codes.OK}, // a repeat attaches
		{"t", 3, codes.OK},
	}
	for i, s := range steps {
		evs, st := run(s.id, s.attempt)
		if st.Code() != s.code {
			t.Fatalf("step %d (%s attempt %d): %v, want %v", i, s.id, s.attempt, st, s.code)
		}
		if s.code == codes.InvalidArgument {
			if len(evs) != 0 || fieldOf(st) != "attempt" || !strings.Contains(st.Message(), fmt.Sprintf("attempt %d", s.attempt-1)) {
				t.Errorf("step %d: %d events, %v", i, len(evs), st)
			}
		}
	}
	if p.Calls() != 3 {
		t.Errorf("provider calls = %d, want 3", p.Calls())
	}
}

// TestWatchPastTheEnd: after_seq beyond the last event of a finished turn
// is OUT_OF_RANGE naming the last seq, not retryable, at once.
func TestWatchPastTheEnd(t *testing.T) {
	t.Parallel()
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("hi")})), server.Options{Store: memStore(t)})
	evs, st := wiretest.Collect(t, t.Context(), ts.client, hello(), nil)
	if st.Code() != codes.OK {
		t.Fatal(st)
	}
	last := uint64(len(evs))
	for _, after := range []uint64{last + 1, 1 << 63, math.MaxUint64} {
		got, wst := watch(t, t.Context(), ts.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1", AfterSeq: after})
		if len(got) != 0 || wst.Code() != codes.OutOfRange || !strings.Contains(wst.Message(), fmt.Sprintf("last event has seq %d", last)) || fieldOf(wst) != "after_seq" {
			t.Errorf("after_seq %d: %d events, %v", after, len(got), wst)
		}
		for _, d := range wst.Details() {
			if _, ok := d.(*errdetails.RetryInfo); ok {
				t.Errorf("after_seq %d: RetryInfo on %v", after, wst)
			}
		}
	}
	// The last event itself ends as the turn did.
	got, wst := watch(t, t.Context(), ts.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1", AfterSeq: last})
	if len(got) != 0 || wst.Code() != codes.OK {
		t.Errorf("after the last seq: %d events, %v", len(got), wst)
	}
}

// deltaText joins the text deltas of evs.
func deltaText(evs []*turnstilev1.AgentEvent) string {
	var b strings.Builder
	for _, ev := range evs {
		b.WriteString(ev.GetTextDelta().GetText())
	}
	return b.String()
}

// TestOrphanedRunAdopted: a run whose replica died while no other could
// take it over (b was full when the lease expired) has no owner and no
// terminal event. The first replica whose watcher finds it adopts it: a
// recent run is taken over and goes on; one past its deadline is closed
// with a stored UNAVAILABLE, retryable error event. A CancelTurn that finds
// it closes it with CANCELLED. Each way the watch ends, and the log holds
// exactly one terminal event. A deadline passes on b's clock, which runs
// an hour ahead for it.
func TestOrphanedRunAdopted(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		deadline time.Duration // 0: none
		cancel   bool          // CancelTurn finds it first
		want     string        // the events after the cut
		code     codes.Code
	}{
		{"recent: taken over", 0, false, "Retry LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted", codes.OK},
		{"past its deadline: closed", time.Minute, false, "Error", codes.Unavailable},
		{"cancelled: closed", 0, true, "Error", codes.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &byCall{script: func(ctx context.Context, n int) iter.Seq2[llm.Chunk, error] {
				switch n {
				case 1: // b's blocker
					return chunks(ctx, true, textChunk("..."))
				case 2: // the turn on a, which dies
					return chunks(ctx, true, textChunk("Hel"))
				}
				return chunks(ctx, false, fake.Text("Hello world")...)
			}}
			t.Parallel()
			clock := time.Now
			if tt.deadline > 0 {
				clock = func() time.Time { return time.Now().Add(time.Hour) }
			}
			rs := startReplicas(t, 2, func(int) *runtime.Runner { return runner(t, p) }, func(i int) server.Options {
				if i == 0 {
					return server.Options{DetachGrace: time.Minute}
				}
				return server.Options{DetachGrace: time.Minute, MaxRunningTurns: 1, Clock: clock}
			})
			a, b, sa := rs[0], rs[1], rs[0].store
			startDetached(t, t.Context(), b.client, "blocker")

			ctx, cut := context.WithCancel(t.Context())
			defer cut()
			if tt.deadline > 0 {
				ctx, cut = context.WithTimeout(ctx, tt.deadline)
				defer cut()
			}
			stream, err := a.client.RunTurn(ctx, hello())
			if err != nil {
				t.Fatal(err)
			}
			var head []*turnstilev1.AgentEvent
			for len(head) == 0 || head[len(head)-1].GetTextDelta() == nil {
				resp, err := stream.Recv()
				if err != nil {
					t.Fatal(err)
				}
				head = append(head, resp.GetEvent())
			}
			sa.Close() // a dies
			cut()
			b.logs.awaitLine(t, "turn not taken over") // b was full when a's lease expired
			if _, err := b.client.CancelTurn(t.Context(), &turnstilev1.CancelTurnRequest{TurnId: "blocker"}); err != nil {
				t.Fatal(err)
			}
			if tt.cancel {
				resp, err := b.client.CancelTurn(t.Context(), &turnstilev1.CancelTurnRequest{TurnId: "turn-1"})
				if err != nil || !resp.GetCancelled() || resp.GetLastSeq() != uint64(len(head))+1 || resp.GetAttempt() != 1 {
					t.Fatalf("CancelTurn: %v, %v", resp, err)
				}
			}
			rest, st := watch(t, t.Context(), b.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1", Attempt: 1, AfterSeq: uint64(len(head))})
			if got := strings.TrimPrefix(wiretest.Names(append(head, rest...)), wiretest.Names(head)+" "); got != tt.want || st.Code() != tt.code {
				t.Fatalf("after the cut: %s, %v; want %s, %v", got, st, tt.want, tt.code)
			}
			all, ast := watch(t, t.Context(), b.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1", Attempt: 1})
			sameEvents(t, "replay", all, append(head, rest...))
			sameStatus(t, "replay", ast, st)
			terminals := 0
			for i, ev := range all {
				if ev.GetSeq() != uint64(i+1) {
					t.Fatalf("event %d has seq %d", i+1, ev.GetSeq())
				}
				if ev.GetError() != nil || ev.GetTurnCompleted() != nil {
					terminals++
				}
			}
			if terminals != 1 {
				t.Errorf("%d terminal events", terminals)
			}
			if tt.cancel && all[len(all)-1].GetError().GetCode() != turnstilev1.ErrorCode_ERROR_CODE_CANCELLED {
				t.Errorf("closing event %v", all[len(all)-1])
			}
			if tt.code == codes.Unavailable {
				e := all[len(all)-1].GetError()
				if e.GetCode() != turnstilev1.ErrorCode_ERROR_CODE_UNAVAILABLE || !e.GetRetryable() || !strings.Contains(e.GetMessage(), "deadline passed") || !strings.Contains(e.GetMessage(), "next attempt") {
					t.Errorf("closing event %v", e)
				}
			}
		})
	}
}

// causeOf returns the ErrorInfo metadata "cause" of st.
func causeOf(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetMetadata()["cause"]
		}
	}
	return ""
}

// TestUnavailableSaysWhy: a turn whose store went away and one whose
// replica lost its lease to another's takeover both end their streams
// UNAVAILABLE and retryable (watch again), but say which happened.
func TestUnavailableSaysWhy(t *testing.T) {
	t.Parallel()
	t.Run("store unreachable", func(t *testing.T) {
		t.Parallel()
		more := make(chan struct{})
		p := &byCall{script: func(ctx context.Context, n int) iter.Seq2[llm.Chunk, error] {
			return func(yield func(llm.Chunk, error) bool) {
				if !yield(textChunk("Hel"), nil) {
					return
				}
				<-more
				for _, c := range fake.Text("lo") {
					if !yield(c, nil) {
						return
					}
				}
			}
		}}
		s := clusterStore(t, natsServer(t))
		a := start(t, runner(t, p), server.Options{Store: s})
		stream, err := a.client.RunTurn(t.Context(), hello())
		if err != nil {
			t.Fatal(err)
		}
		firstEvents(t, stream, 3)
		s.Close()
		close(more)
		_, st := drainStream(stream.Recv)
		if st.Code() != codes.Unavailable || causeOf(st) != "store_unreachable" || !strings.Contains(st.Message(), "turn log is unreachable") {
			t.Errorf("status %v, cause %q", st, causeOf(st))
		}
	})
	t.Run("lease lost to a takeover", func(t *testing.T) {
		t.Parallel()
		p := &byCall{script: func(ctx context.Context, n int) iter.Seq2[llm.Chunk, error] {
			if n == 1 {
				return chunks(ctx, true, textChunk("Hel"))
			}
			return chunks(ctx, false, fake.Text("Hello world")...)
		}}
		// a may run one turn: it does not take its own run over.
		rs := startReplicas(t, 2, func(int) *runtime.Runner { return runner(t, p) }, func(i int) server.Options {
			return server.Options{MaxRunningTurns: []int{1, 0}[i]}
		})
		a, b := rs[0], rs[1]
		stream, err := a.client.RunTurn(t.Context(), hello())
		if err != nil {
			t.Fatal(err)
		}
		head := firstEvents(t, stream, 3)
		// As if a had paused past its lease and another replica had
		// claimed it: a finds another's lease at its next renewal.
		js := jetStream(t, a.nats)
		kv, err := js.KeyValue(t.Context(), store.LeaseBucket)
		if err != nil {
			t.Fatal(err)
		}
		lease := base64.RawURLEncoding.EncodeToString([]byte("turn-1")) + ".1"
		if _, err := kv.Put(t.Context(), lease, []byte("another replica")); err != nil {
			t.Fatal(err)
		}
		rest, st := drainStream(stream.Recv)
		if st.Code() != codes.Unavailable || causeOf(st) != "taken_over" || !strings.Contains(st.Message(), "another server took the turn over") {
			t.Errorf("status %v, cause %q", st, causeOf(st))
		}
		// That other replica goes away too: b takes the run over.
		if err := kv.Purge(t.Context(), lease); err != nil {
			t.Fatal(err)
		}
		head = append(head, rest...)
		all, ast := resumeOnB(t, &replicaPair{b: b}, head)
		if ast.Code() != codes.OK || all[len(all)-1].GetTurnCompleted() == nil {
			t.Errorf("after the takeover: %s, %v", wiretest.Names(all), ast)
		}
	})
}

// TestTakenOverTurnHoldsItsKeySlot: a turn another replica takes over
// counts against its key's concurrent_turns there until it ends.
func TestTakenOverTurnHoldsItsKeySlot(t *testing.T) {
	t.Parallel()
	one := 1
	k := keyed("limited", "tok-limited-0123")
	k.Limits = server.KeyLimits{ConcurrentTurns: &one}
	p := &byCall{script: func(ctx context.Context, n int) iter.Seq2[llm.Chunk, error] {
		if n <= 2 { // on a, then resumed on b
			return chunks(ctx, true, textChunk("Hel"))
		}
		return chunks(ctx, false, fake.Text("Hello")...)
	}}
	rs := startReplicas(t, 2, func(int) *runtime.Runner { return runner(t, p) }, func(int) server.Options {
		return server.Options{Keys: []server.Key{k}, DetachGrace: time.Minute}
	})
	a, b, sa := rs[0], rs[1], rs[0].store
	// A deadline of its own: a turn that holds where it should not fails
	// the test instead of hanging the package.
	tctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	ctx := bearer(tctx, "tok-limited-0123")

	startDetached(t, ctx, a.client, "turn-1")
	sa.Close() // a dies
	b.logs.awaitLine(t, "taking over a turn")
	// The second turn must find turn-1's model call on b under way: a
	// cancel that came first would leave call 2, the holding one, to it.
	eventually(t, "turn-1 makes the model call it resumes on b", func() bool { return p.calls() >= 2 })
	second := hello()
	second.TurnId = "turn-2"
	evs, st := wiretest.Collect(t, ctx, b.client, second, nil)
	refusedWith(t, evs, st, "concurrent_turns", true)
	resp, err := b.client.CancelTurn(ctx, &turnstilev1.CancelTurnRequest{TurnId: "turn-1"})
	if err != nil || !resp.GetCancelled() {
		t.Fatalf("CancelTurn: %v, %v", resp, err)
	}
	if _, st := wiretest.Collect(t, ctx, b.client, second, nil); st.Code() != codes.OK {
		t.Errorf("after the taken-over turn ended: %v", st)
	}
}
