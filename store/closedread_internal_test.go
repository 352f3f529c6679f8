package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnstile-dev/turnstile/internal/natstest"
)

// TestWatchEndsWhenItsStoreCloses: a watch of another replica's run, on a
// replica whose store closes (the process goes away, or a test kills the
// replica by closing its store), ends with ErrClosed: it does not wait for
// the owner's next frame, or for its client's deadline. CI saw a watch in
// this state hold its client for the client's whole 30 s deadline.
func TestWatchEndsWhenItsStoreCloses(t *testing.T) {
	const ttl = time.Second
	url := natstest.Start(t)
	owner, watcher := openTestReplica(t, url, ttl), openTestReplica(t, url, ttl)
	ctx := t.Context()
	const id = "closing"
	createRun(t, ctx, owner, id, "first")
	// The client's deadline is far away: only the store's end may end
	// the watch.
	wctx, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	got := make(chan []byte, 1)
	ended := make(chan error, 1)
	go func() {
		for b, err := range watcher.Events(wctx, id, 1, 0) {
			if err != nil {
				ended <- err
				return
			}
			got <- b
		}
		ended <- nil
	}()
	select {
	case b := <-got:
		if string(b) != "first" {
			t.Fatalf("event %q, want %q", b, "first")
		}
	case err := <-ended:
		t.Fatalf("the watch ended before its first event: %v", err)
	}
	watcher.Close()
	if err := <-ended; !errors.Is(err, ErrClosed) {
		t.Fatalf("the watch ended with %v, want %v", err, ErrClosed)
	}
}

// createRun creates run (id, 1) on s, owned by s, and stores events in
// it, each acknowledged before the next.
func createRun(t *testing.T, ctx context.Context, s *Store, id string, events ...string) {
	t.Helper()
	if created, _, err := s.Create(ctx, id, 1, []byte("req"), func(string) []byte { return nil }); err != nil || !created {
		t.Fatalf("Create = %v, %v", created, err)
	}
	for _, ev := range events {
		acked := make(chan error, 1)
		if err := s.Append(ctx, id, 1, []byte(ev), func(err error) { acked <- err }); err != nil {
			t.Fatal(err)
		}
		if err := <-acked; err != nil {
			t.Fatal(err)
		}
	}
}

// blackHole is a stream whose direct gets nobody answers: its name is
// one no JetStream stream has, and the test's subscriber takes its
// requests.
type blackHole struct {
	jetstream.Stream
	name string
}

func (b blackHole) CachedInfo() *jetstream.StreamInfo {
	return &jetstream.StreamInfo{Config: jetstream.StreamConfig{Name: b.name}}
}

// TestDirectGetUnanswered: a direct get whose answer never comes (lost
// with a connection, or a server that went away) ends with the store's
// close, and otherwise after directGetTimeout, however far its caller's
// deadline is: a read of the log never holds a watch for its client's
// whole deadline.
func TestDirectGetUnanswered(t *testing.T) {
	url := natstest.Start(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const name = "BLACKHOLE"
	asked := make(chan *nats.Msg, 4)
	if _, err := nc.ChanSubscribe(directGetPrefix+name, asked); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		close bool
		want  error
	}{
		{"the store closes", true, ErrClosed},
		{"no answer for the request's bound", false, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
			defer cancel()
			closed := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				_, err := directBatch(ctx, closed, nc, blackHole{name: name}, "subject", 1)
				done <- err
			}()
			<-asked // the request is out; its answer never comes
			if tc.close {
				close(closed)
			}
			if err := <-done; !errors.Is(err, tc.want) {
				t.Fatalf("directBatch = %v, want %v", err, tc.want)
			}
		})
	}
}
