package server_test

import (
	"bytes"
	"encoding/base64"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/store"
)

// TestReattachReadsTheLastFrame (issue 37, row 4): a client that watches
// a turn again holding every event before the log's last frame (as after
// a hand-off whose new owner stored its first frame before the watch read
// the log) is served from that frame, not from the log's start: the watch
// reads no batch of the run's frames from the first, and streams the
// rest of the turn, to its end, as stored. The turn is cancelled once its
// text is stored, so that its last events are a frame of their own; the
// test counts the direct gets that read the run's events from the log's
// start.
func TestReattachReadsTheLastFrame(t *testing.T) {
	t.Parallel()
	a := startReplicas(t, 1, func(int) *runtime.Runner { return runner(t, fake.NewProvider(hang)) }, nil)[0]
	ctx := t.Context()
	stream, err := a.client.RunTurn(ctx, hello())
	if err != nil {
		t.Fatal(err)
	}
	head := firstEvents(t, stream, 3) // TurnStarted LlmCallStarted TextDelta
	// Once the log holds the text, the cancel's events are stored after
	// it, in a frame of their own: the log's last.
	evSubject := "turnstile.run." + base64.RawURLEncoding.EncodeToString([]byte(hello().GetTurnId())) + ".1.ev"
	js := jetStream(t, a.nats)
	runs, err := js.Stream(ctx, store.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the text stored", func() bool {
		b, err := a.store.LastEvent(ctx, hello().GetTurnId(), 1)
		ev := &turnstilev1.AgentEvent{}
		return err == nil && proto.Unmarshal(b, ev) == nil && ev.GetSeq() >= head[2].GetSeq()
	})
	if _, err := a.client.CancelTurn(ctx, &turnstilev1.CancelTurnRequest{TurnId: hello().GetTurnId()}); err != nil {
		t.Fatal(err)
	}
	rest, ended := drainStream(stream.Recv)
	if ended.Code() != codes.Canceled {
		t.Fatalf("the turn ended %v, want CANCELLED", ended)
	}
	all := append(head, rest...)
	last, err := runs.GetLastMsgForSubject(ctx, evSubject)
	if err != nil {
		t.Fatal(err)
	}
	first, err := strconv.ParseUint(last.Header.Get("Turnstile-First-Event"), 10, 64)
	if err != nil || first <= head[2].GetSeq() || first > uint64(len(all)) {
		t.Fatalf("the log's last frame begins at event %q of %d: want one after the text (%d)", last.Header.Get("Turnstile-First-Event"), len(all), head[2].GetSeq())
	}

	nc, err := nats.Connect(a.nats)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	gets, err := nc.SubscribeSync("$JS.API.DIRECT.GET." + store.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	after := first - 1
	got, st := watch(t, ctx, a.client, &turnstilev1.WatchTurnRequest{TurnId: hello().GetTurnId(), Attempt: 1, AfterSeq: after})
	sameEvents(t, "the watch from the last frame", got, all[after:])
	sameStatus(t, "the watch from the last frame", st, ended)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	fromStart := 0
	for {
		m, err := gets.NextMsg(0)
		if err != nil {
			break // none left: every request made before the flush's is in
		}
		if bytes.Contains(m.Data, []byte(`"seq":1,`)) && bytes.Contains(m.Data, []byte(evSubject)) {
			fromStart++
		}
	}
	if fromStart != 0 {
		t.Errorf("the watch after event %d read the run's frames from the log's start %d times, want none", after, fromStart)
	}
}
