package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/turnstile-dev/turnstile/internal/natstest"
	"github.com/turnstile-dev/turnstile/store"
)

// TestReattachReadsFromTheLastFrame (issue 37, row 4): a watch from an
// event on reads the log from the frame that holds that event, not from
// the log's start. A client that re-attaches after a hand-off holds every
// event stored: its watch's first read is the log's last frame, one
// reply, where it was every frame of the run; and the events it yields
// are those after its own, whether or not the last frame holds them all.
func TestReattachReadsFromTheLastFrame(t *testing.T) {
	const frames = 40
	url := natstest.Start(t)
	s := openNATS(t, url)
	ctx := t.Context()
	const id = "reattach"
	storeFrames(t, ctx, s, id, frames)
	// Every answer NATS sends to a request goes to an inbox: counted on a
	// connection of the test's own.
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// A synchronous subscription's messages are queued as they are read
	// off the connection, in order: once a flush's answer is in, so is
	// every message the server sent before it.
	inboxes, err := nc.SubscribeSync("_INBOX.>")
	if err != nil {
		t.Fatal(err)
	}
	replies := func() int {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		n, _, err := inboxes.Pending()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		after      uint64 // the events the watch skips
		maxReplies int    // -1: not counted
	}{
		{"the last event", frames - 1, 1},
		{"every event but the last three", frames - 3, -1},
		{"from the start", 0, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := replies()
			got := collect(t, s, id, 1, tc.after, frames-int(tc.after))
			n := replies() - before
			for i, b := range got {
				if want := fmt.Sprintf("e%d", int(tc.after)+i+1); b != want {
					t.Fatalf("event %d is %q, want %q", int(tc.after)+i+1, b, want)
				}
			}
			if tc.maxReplies >= 0 && n > tc.maxReplies {
				t.Errorf("the watch's reads took %d replies, want at most %d (the last frame)", n, tc.maxReplies)
			}
			t.Logf("%d replies", n)
		})
	}
}

// TestClaimReadsFramesWithoutHeaders (issue 37, row 4): a claim reads its
// run's frames without their headers, which were most of each reply (the
// frame's own four and six more the server writes one at a time), and
// still gets every event in order. The headers are what it does not read
// (a reply to the claim with a frame's first-event index in it is one);
// the events, across several batches, are TestLogReadInBatches'.
func TestClaimReadsFramesWithoutHeaders(t *testing.T) {
	const frames = 20
	url := natstest.Start(t)
	s := openNATS(t, url)
	ctx := t.Context()
	const id = "headless"
	storeFrames(t, ctx, s, id, frames)
	if err := s.Release(ctx, id, 1); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	inboxes, err := nc.SubscribeSync("_INBOX.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	claimer := openNATS(t, url)
	_, events, _, err := claimer.Claim(ctx, id, 1, func(string) []byte { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != frames {
		t.Fatalf("the claim read %d events, want %d", len(events), frames)
	}
	for i, b := range events {
		if want := fmt.Sprintf("e%d", i+1); string(b) != want {
			t.Fatalf("event %d is %q, want %q", i+1, b, want)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	withHeaders, replies := 0, 0
	for {
		m, err := inboxes.NextMsg(0)
		if err != nil {
			break // none left: every reply sent before the flush's is in
		}
		replies++
		if m.Header.Get("Turnstile-First-Event") != "" {
			withHeaders++
		}
	}
	if withHeaders > 0 {
		t.Errorf("%d of the %d replies to the claim carried a frame's headers, want none", withHeaders, replies)
	}
	t.Logf("%d replies", replies)
}

// storeFrames creates run (id, 1) on s and stores n events in it, "e1"
// to "en", each acknowledged before the next: a frame of its own.
func storeFrames(t *testing.T, ctx context.Context, s *store.Store, id string, n int) {
	t.Helper()
	if created, _, err := s.Create(ctx, id, 1, []byte("req"), func(string) []byte { return nil }); err != nil || !created {
		t.Fatalf("Create = %v, %v", created, err)
	}
	for i := 1; i <= n; i++ {
		acked := make(chan error, 1)
		if err := s.Append(ctx, id, 1, fmt.Appendf(nil, "e%d", i), func(err error) { acked <- err }); err != nil {
			t.Fatal(err)
		}
		if err := <-acked; err != nil {
			t.Fatal(err)
		}
	}
}
