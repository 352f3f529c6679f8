package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/store"
)

// gate is a provider whose turns answer "done" at once, but for those
// whose first message starts with "hold:NAME": they stream "..." first and
// answer once NAME is released, with 600 KiB more first when the message
// ends with " big".
type gate struct {
	mu    sync.Mutex
	gates map[string]chan struct{}
}

func newGate() *gate { return &gate{gates: map[string]chan struct{}{}} }

func (g *gate) ch(name string) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok := g.gates[name]
	if !ok {
		c = make(chan struct{})
		g.gates[name] = c
	}
	return c
}

func (g *gate) release(name string) { close(g.ch(name)) }

func (g *gate) Stream(ctx context.Context, req *llm.Request) iter.Seq2[llm.Chunk, error] {
	text := req.Messages[0].Parts[0].Text
	return func(yield func(llm.Chunk, error) bool) {
		if name, ok := strings.CutPrefix(text, "hold:"); ok {
			name, _, _ = strings.Cut(name, " ")
			if !yield(llm.Chunk{Kind: llm.ChunkText, Text: "..."}, nil) {
				return
			}
			select {
			case <-g.ch(name):
			case <-ctx.Done():
				yield(llm.Chunk{}, ctx.Err())
				return
			}
		}
		if strings.HasSuffix(text, " big") {
			// 600 KiB of reply.
			for range 600 {
				if !yield(llm.Chunk{Kind: llm.ChunkText, Text: strings.Repeat("z", 1024)}, nil) {
					return
				}
			}
		}
		for _, c := range fake.Text("done") {
			if !yield(c, nil) {
				return
			}
		}
	}
}

// sized returns a request with its own turn id whose message is text
// padded to about size bytes.
func sized(id, text string, size int) *turnstilev1.RunTurnRequest {
	if pad := size - len(text); pad > 0 {
		text += " " + strings.Repeat("x", pad)
	}
	return &turnstilev1.RunTurnRequest{
		TurnId:   id,
		Messages: []*turnstilev1.Message{{Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: text}}}}},
	}
}

// heldTurn is a turn started and running until its gate is released.
type heldTurn struct {
	evs  []*turnstilev1.AgentEvent
	done chan *status.Status
}

// hold starts req and returns once its first text delta arrived, or
// with the status it was refused with.
func hold(t *testing.T, ctx context.Context, c turnstilev1.AgentServiceClient, req *turnstilev1.RunTurnRequest) (*heldTurn, *status.Status) {
	t.Helper()
	stream, err := c.RunTurn(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return following(eventsOf(stream.Recv))
}

// following reads a turn's stream until its first text delta, and the
// rest on a goroutine of its own; it returns the status the stream ended
// with when that came first.
func following(stream eventRecv) (*heldTurn, *status.Status) {
	h := &heldTurn{done: make(chan *status.Status, 1)}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return nil, status.Convert(err)
		}
		h.evs = append(h.evs, ev)
		if ev.GetTextDelta() != nil {
			break
		}
	}
	go func() {
		for {
			ev, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					h.done <- status.New(codes.OK, "")
				} else {
					h.done <- status.Convert(err)
				}
				return
			}
			h.evs = append(h.evs, ev)
		}
	}()
	return h, nil
}

// storeFullStatus checks st is STORE_FULL: RESOURCE_EXHAUSTED with
// RetryInfo, before any event.
func storeFullStatus(t *testing.T, st *status.Status) {
	t.Helper()
	var info *errdetails.ErrorInfo
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			retry = d
		}
	}
	if st.Code() != codes.ResourceExhausted || info.GetReason() != server.ReasonStoreFull || info.GetDomain() != server.ErrorDomain || retry.GetRetryDelay().AsDuration() <= 0 {
		t.Fatalf("status %v, want RESOURCE_EXHAUSTED, STORE_FULL and RetryInfo", st.Proto())
	}
}

func agentHealth(t *testing.T, ts *testServer) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	resp, err := healthpb.NewHealthClient(ts.conn).Check(t.Context(), &healthpb.HealthCheckRequest{Service: turnstilev1.AgentService_ServiceDesc.ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetStatus()
}

// waitServing waits until health says the AgentService serves: the
// health service's Watch tells each change.
func waitServing(t *testing.T, ts *testServer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	w, err := healthpb.NewHealthClient(ts.conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: turnstilev1.AgentService_ServiceDesc.ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := w.Recv()
		if err != nil {
			t.Fatalf("the store never took turns again: %v", err)
		}
		if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
	}
}

// TestFullStoreKeepsOthersRunningTurns: one key floods a small store with
// large turns, finished and then running. The running turn of another
// key, older than all of them, is never removed: it finishes with all its
// events, stored. Finished turns make room for new ones; once the flood's
// running turns hold the store, new turns get RESOURCE_EXHAUSTED
// STORE_FULL with RetryInfo at once, health says the AgentService is not
// serving, and once they end the store takes turns again, without a
// restart.
func TestFullStoreKeepsOthersRunningTurns(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	tlog := openStore(t, withConfig(func(c *store.Config) { c.MaxBytes = 2 << 20 }), withLogger(slog.New(slog.NewTextHandler(logs, nil))))
	defer func() {
		if t.Failed() {
			t.Logf("store log:\n%s", logs.String())
		}
	}()
	g := newGate()
	r, err := runtime.New([]*runtime.Model{{Alias: "sim", ProviderName: "gate", Provider: g, ID: "gate-1", Retry: policy.DefaultRetry()}}, "sim", nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := start(t, r, server.Options{Store: tlog, Keys: []server.Key{keyed("attacker", "tok-attacker-0123"), keyed("victim", "tok-victim-01234")}})
	tlog.OnRoom(ts.srv.StoreRoom)
	attacker, victim := bearer(t.Context(), "tok-attacker-0123"), bearer(t.Context(), "tok-victim-01234")

	v, vst := hold(t, victim, ts.client, sized("victim-turn", "hold:victim", 1000))
	if vst != nil {
		t.Fatal(vst)
	}
	// Finished turns, four times what the store holds: the oldest go.
	ran, refused := 0, 0
	for i := range 80 {
		_, st := wiretest.Collect(t, attacker, ts.client, sized(fmt.Sprintf("flood-%d", i), "quick", 100<<10), nil)
		switch st.Code() {
		case codes.OK:
			ran++
		case codes.ResourceExhausted:
			storeFullStatus(t, st)
			refused++
			waitServing(t, ts) // the keeper removes finished turns
		default:
			t.Fatalf("flood %d: %v", i, st)
		}
	}
	t.Logf("flood: %d ran, %d refused", ran, refused)
	if ran < 40 {
		t.Fatalf("%d of 80 finished turns ran (%d refused): the store did not make room", ran, refused)
	}
	if _, st := watch(t, attacker, ts.client, &turnstilev1.WatchTurnRequest{TurnId: "flood-0"}); st.Code() != codes.NotFound {
		t.Errorf("the oldest finished turn: %v, want NOT_FOUND (removed to make room)", st)
	}
	// A running turn of the flood writes more than the store has left:
	// its events wait while finished turns make room, and the victim's
	// records, the oldest, stay.
	waitServing(t, ts)
	big, bst := hold(t, attacker, ts.client, sized("big", "hold:big big", 0))
	if bst != nil {
		t.Fatal(bst)
	}
	g.release("big")
	if s := <-big.done; s.Code() != codes.OK {
		t.Fatalf("the big turn: %v", s)
	}
	// Running turns of the flood, until the store is full of them: a turn
	// refused once the big turn, finished, is gone. The keeper removes
	// finished runs oldest first, and the big one came after all others:
	// with it gone, none is left, and a refusal is the keeper's finding
	// the store full of running turns. A refusal while it is there (the
	// keeper may not have looked since it ended) passes once the keeper
	// removes it.
	bigGone := func() bool {
		_, err := ts.client.CancelTurn(attacker, &turnstilev1.CancelTurnRequest{TurnId: "big"})
		return status.Code(err) == codes.NotFound
	}
	var held []string
	for i := 0; ; i++ {
		if i > 40 {
			t.Fatal("the store took running turns without end")
		}
		name := fmt.Sprintf("a%d", i)
		gone := bigGone()
		_, st := hold(t, attacker, ts.client, sized("held-"+name, "hold:"+name, 200<<10))
		if st == nil {
			held = append(held, name)
			continue
		}
		storeFullStatus(t, st)
		t.Logf("held %d, refused, the big turn gone: %v; %+v", len(held), gone, tlog.Usage())
		if gone {
			break
		}
		waitServing(t, ts)
	}
	if u := tlog.Usage(); u.Full == nil || float64(u.Bytes) < 0.9*float64(u.Limit) {
		t.Fatalf("refused, but the store is not full: %+v", u)
	}
	t.Logf("full with %d running turns of the flood: %+v", len(held), tlog.Usage())
	// Another key is refused alike, at once.
	evs, fst := wiretest.Collect(t, victim, ts.client, sized("victim-2", "quick", 100), nil)
	if len(evs) != 0 {
		t.Fatalf("a refused turn sent %d events", len(evs))
	}
	storeFullStatus(t, fst)
	if h := agentHealth(t, ts); h != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health while full: %v", h)
	}
	// The same RunTurn again, while the store is still full, stores
	// nothing: it attaches to the run. It and a WatchTurn follow the
	// victim, attached while it runs: once it ends, the keeper may remove
	// it like any finished turn.
	again, ast := hold(t, victim, ts.client, sized("victim-turn", "hold:victim", 1000))
	if ast != nil {
		t.Fatalf("victim's RunTurn again: %v", ast)
	}
	w, err := ts.client.WatchTurn(victim, &turnstilev1.WatchTurnRequest{TurnId: "victim-turn"})
	if err != nil {
		t.Fatal(err)
	}
	replay, rst := following(eventsOf(w.Recv))
	if rst != nil {
		t.Fatalf("victim's WatchTurn: %v", rst)
	}
	// The victim finishes with all its events, stored: what the others
	// follow are the events the store acknowledged.
	g.release("victim")
	if vs := <-v.done; vs.Code() != codes.OK {
		t.Fatalf("victim: %v", vs)
	}
	if got, want := wiretest.Names(v.evs), "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"; got != want {
		t.Fatalf("victim's events:\n got %s\nwant %s", got, want)
	}
	for _, f := range []struct {
		what string
		h    *heldTurn
	}{{"victim's RunTurn again", again}, {"victim's WatchTurn", replay}} {
		if st := <-f.h.done; st.Code() != codes.OK {
			t.Errorf("%s: %v", f.what, st)
		}
		sameEvents(t, f.what, f.h.evs, v.evs)
	}
	// The flood's turns end; the keeper makes room, and turns run again.
	for _, name := range held {
		g.release(name)
	}
	waitServing(t, ts)
	if _, st := wiretest.Collect(t, victim, ts.client, sized("victim-3", "quick", 100), nil); st.Code() != codes.OK {
		t.Fatalf("a turn after room returned: %v", st)
	}
}

// TestKeyStoredBytes: a key's running turns hold at most its stored_bytes
// in the store. A turn whose events would take it over ends with a stored
// QUOTA_EXHAUSTED error event (RESOURCE_EXHAUSTED); a request that does
// not fit beside the key's running turns is refused with LIMIT_EXCEEDED
// (stored_bytes) and RetryInfo, one larger than the limit without; other
// keys are not touched.
func TestKeyStoredBytes(t *testing.T) {
	t.Parallel()
	limit := int64(64 << 10)
	var chunks []llm.Chunk
	for range 100 {
		chunks = append(chunks, llm.Chunk{Kind: llm.ChunkText, Text: strings.Repeat("y", 1024)})
	}
	chunks = append(chunks, llm.Chunk{Kind: llm.ChunkStop, Stop: llm.StopEndTurn})
	g := newGate()
	long := fake.NewProvider(fake.Reply{Chunks: chunks})
	r, err := runtime.New([]*runtime.Model{
		{Alias: "sim", ProviderName: "gate", Provider: g, ID: "gate-1", Retry: policy.DefaultRetry()},
		{Alias: "long", ProviderName: "fake", Provider: long, ID: "fake-1", Retry: policy.DefaultRetry()},
	}, "sim", nil)
	if err != nil {
		t.Fatal(err)
	}
	small := keyed("small", "tok-small-012345")
	small.Limits.StoredBytes = &limit
	m := newMeter()
	ts := start(t, r, server.Options{Store: memStore(t), Keys: []server.Key{small, keyed("other", "tok-other-012345")}, MeterProvider: m})
	asSmall, asOther := bearer(t.Context(), "tok-small-012345"), bearer(t.Context(), "tok-other-012345")

	// A reply of 100 KiB: the turn ends when it would go over.
	req := sized("long", "write a lot", 100)
	req.Model = "long"
	evs, st := wiretest.Collect(t, asSmall, ts.client, req, nil)
	e := evs[len(evs)-1].GetError()
	if st.Code() != codes.ResourceExhausted || e.GetCode() != turnstilev1.ErrorCode_ERROR_CODE_QUOTA_EXHAUSTED || !strings.Contains(st.Message(), "stored_bytes: 65536") {
		t.Fatalf("status %v, last event %v", st, evs[len(evs)-1])
	}
	assertStatusMatchesEvent(t, st, e)
	for i, ev := range evs {
		if ev.GetSeq() != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i+1, ev.GetSeq())
		}
	}
	got, wst := watch(t, asSmall, ts.client, &turnstilev1.WatchTurnRequest{TurnId: "long"})
	sameEvents(t, "replay", got, evs)
	sameStatus(t, "replay", wst, st)
	// Another key runs the same turn to its end.
	req.TurnId = "long-other"
	if _, st := wiretest.Collect(t, asOther, ts.client, req, nil); st.Code() != codes.OK {
		t.Fatalf("other key: %v", st)
	}

	// A running turn of 40 KiB leaves no room for another.
	h, hst := hold(t, asSmall, ts.client, sized("held", "hold:h", 40<<10))
	if hst != nil {
		t.Fatal(hst)
	}
	evs, st = wiretest.Collect(t, asSmall, ts.client, sized("second", "quick", 40<<10), nil)
	refusedWith(t, evs, st, "stored_bytes", true)
	evs, st = wiretest.Collect(t, asOther, ts.client, sized("other-2", "quick", 40<<10), nil)
	if st.Code() != codes.OK || len(evs) == 0 {
		t.Errorf("other key beside it: %v", st)
	}
	// Larger than the limit: waiting will not help.
	evs, st = wiretest.Collect(t, asSmall, ts.client, sized("huge", "quick", 80<<10), nil)
	refusedWith(t, evs, st, "stored_bytes", false)
	// The two refused before they started are counted; the turn ended
	// past the limit is not a refusal.
	if n := m.sum(t, "turnstile.turns.refused", attribute.String("turnstile.limit", "stored_bytes"), attribute.String("turnstile.client", "small")); n != 2 {
		t.Errorf("turnstile.turns.refused{stored_bytes, small} = %d, want 2", n)
	}
	// Once the running turn ended, its bytes count no more.
	g.release("h")
	if s := <-h.done; s.Code() != codes.OK {
		t.Fatal(s)
	}
	if _, st := wiretest.Collect(t, asSmall, ts.client, sized("third", "quick", 40<<10), nil); st.Code() != codes.OK {
		t.Errorf("after the running turn ended: %v", st)
	}
}
