package server_test

import (
	"crypto/sha256"
	"encoding/json"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/server"
)

// TestRunOfTheVersionBefore: a replica of the version before created a
// run, storing its record as JSON with the request in base64, stored its
// first events, and went away mid-reply. A replica of this version, which
// writes records in protobuf, reads that one: it takes the run over and
// completes it, a WatchTurn and a repeated RunTurn of the same request
// find it (the record's client and hash), and another request under the
// same id is refused as a reuse.
func TestRunOfTheVersionBefore(t *testing.T) {
	t.Parallel()
	url := natsServer(t)
	old := clusterStore(t, url)
	req := hello()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	content := proto.CloneOf(req)
	content.TurnId, content.Attempt = "", 0
	c, err := proto.MarshalOptions{Deterministic: true}.Marshal(content)
	if err != nil {
		t.Fatal(err)
	}
	hash := sha256.Sum256(c)
	// What the version before's json.Marshal of its record wrote.
	rec, err := json.Marshal(struct {
		Hash    []byte    `json:"hash"`
		Request []byte    `json:"request"`
		Started time.Time `json:"started"`
	}{hash[:], b, time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	created, _, err := old.Create(ctx, "turn-1", 1, rec, func(string) []byte { return nil })
	if err != nil || !created {
		t.Fatalf("Create = %v, %v", created, err)
	}
	now := time.Now()
	stored := []*turnstilev1.AgentEvent{
		{Payload: &turnstilev1.AgentEvent_TurnStarted{TurnStarted: &turnstilev1.TurnStarted{Model: "sim"}}},
		{Payload: &turnstilev1.AgentEvent_LlmCallStarted{LlmCallStarted: &turnstilev1.LlmCallStarted{Model: "sim", Provider: "fake", ProviderModel: "fake-1", Attempt: 1, Call: 1}}},
		{Payload: &turnstilev1.AgentEvent_TextDelta{TextDelta: &turnstilev1.TextDelta{Text: "Hel"}}},
	}
	acked := make(chan error, len(stored))
	for i, ev := range stored {
		ev.Seq, ev.TurnId, ev.Attempt = uint64(i+1), "turn-1", 1
		ev.Time = timestamppb.New(now)
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		if err := old.Append(ctx, "turn-1", 1, b, func(err error) { acked <- err }); err != nil {
			t.Fatal(err)
		}
	}
	for range stored {
		if err := <-acked; err != nil {
			t.Fatal(err)
		}
	}
	old.Close() // it goes away

	p := fake.NewProvider(fake.Reply{Chunks: fake.Text("Hello")})
	srv := start(t, runner(t, p), server.Options{Store: clusterStore(t, url), DetachGrace: 5 * time.Second})
	var evs []*turnstilev1.AgentEvent
	for {
		rest, st := watch(t, ctx, srv.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1", Attempt: 1, AfterSeq: uint64(len(evs))})
		evs = append(evs, rest...)
		if st.Code() == codes.OK {
			break
		}
		if st.Code() != codes.Unavailable {
			t.Fatalf("WatchTurn: %v, after %s", st, wiretest.Names(evs))
		}
		// The lease has not expired yet: the client re-attaches.
	}
	want := "TurnStarted LlmCallStarted TextDelta Retry LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
	if got := wiretest.Names(evs); got != want {
		t.Fatalf("events:\n got %s\nwant %s", got, want)
	}
	if p.Calls() != 1 {
		t.Errorf("model calls = %d, want 1", p.Calls())
	}
	again, st := wiretest.Collect(t, ctx, srv.client, req, nil)
	if st.Code() != codes.OK {
		t.Fatalf("the same request again: %v", st)
	}
	sameEvents(t, "the same request again", again, evs)
	other := hello()
	other.Messages[0].Parts[0].Kind = &turnstilev1.Part_Text{Text: "something else"}
	if _, st := wiretest.Collect(t, ctx, srv.client, other, nil); st.Code() != codes.AlreadyExists {
		t.Errorf("another request under the id: %v, want ALREADY_EXISTS", st)
	}
}
