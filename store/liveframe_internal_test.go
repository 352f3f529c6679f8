package store

import (
	"context"
	"encoding/binary"
	"iter"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnstile-dev/turnstile/internal/natstest"
)

// TestWatchDeliversALiveFrameNotYetStored: a watch that finds a gap
// before a frame it receives live reads the frames it missed from the
// store, and then delivers the live frame's own events from the frame:
// a frame reaches its subscribers as it is published, before the stream
// stores it, so the read may not find it. Such a frame, a run's last,
// was delivered only at the watch's first quiet check, a lease TTL later.
//
// The test stores a frame that the watch's live subscription does not
// hear (published on a subject the stream maps to the run's), then
// publishes one on the run's subject that the stream refuses (its
// expectation is wrong): the watch hears it and the store never has it.
// The lease TTL is a minute: the quiet check does not come within the
// test's deadline.
func TestWatchDeliversALiveFrameNotYetStored(t *testing.T) {
	url := natstest.Start(t)
	s := openTestReplica(t, url, time.Minute)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	const id = "inflight"
	k := runKey{id, 1}
	createRun(t, ctx, s, id, "e1")
	inject := injector(t, ctx, s)

	want, stop := watchOf(t, ctx, s, id)
	defer stop()
	want("e1") // the watch has read the log and listens

	inject(k, 2, "e2")
	live := frameMsg(3, "e3")
	live.Subject = k.events()
	live.Header.Set(jetstream.ExpectedStreamHeader, "not-"+StreamName)
	if err := s.nc.PublishMsg(live); err != nil {
		t.Fatal(err)
	}
	want("e2")
	want("e3")
}

// TestWatchReadsAFrameItDidNotHear: a watch that has had no frame live
// reads the log again soon after its first read, and then less and less
// often, up to a lease TTL: a frame published before its live
// subscription was in place and stored only after its first read reaches
// it neither way, and with nothing after it (a run's last frames: the
// rest of a turn taken over after a hand-off) waited for the watch's
// first quiet check, a lease TTL later (TestShutdownHandsOff failed so in
// a few runs in a hundred, on main too). The test stores a frame that the
// watch does not hear (as above), and nothing after it; the lease TTL is
// a minute.
func TestWatchReadsAFrameItDidNotHear(t *testing.T) {
	url := natstest.Start(t)
	s := openTestReplica(t, url, time.Minute)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	const id = "unheard"
	k := runKey{id, 1}
	createRun(t, ctx, s, id, "e1")
	inject := injector(t, ctx, s)

	want, stop := watchOf(t, ctx, s, id)
	defer stop()
	want("e1")
	inject(k, 2, "e2")
	want("e2")
}

// injector makes s's log store as the run's events what is published on
// inject.<the run's subject less its root>, which no watch of the run
// hears live; it returns what publishes one frame so, and waits for it to
// be stored.
func injector(t *testing.T, ctx context.Context, s *Store) func(k runKey, first int, event string) {
	t.Helper()
	cfg := s.stream.CachedInfo().Config
	cfg.Subjects = append(cfg.Subjects, "inject.>")
	cfg.SubjectTransform = &jetstream.SubjectTransformConfig{Source: "inject.>", Destination: subjectRoot + ".>"}
	if _, err := s.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	return func(k runKey, first int, event string) {
		t.Helper()
		m := frameMsg(first, event)
		m.Subject = "inject." + strings.TrimPrefix(k.events(), subjectRoot+".")
		if _, err := s.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
}

// frameMsg is a frame of one event, the index of its first event first.
func frameMsg(first int, event string) *nats.Msg {
	data := binary.AppendUvarint(nil, uint64(len(event)))
	return &nats.Msg{Data: append(data, event...), Header: nats.Header{firstHeader: {strconv.Itoa(first)}}}
}

// watchOf starts a watch of run (id, 1) on s from its start, and returns
// the function that asserts the next event it yields, and the one that
// stops it.
func watchOf(t *testing.T, ctx context.Context, s *Store, id string) (want func(event string), stop func()) {
	next, stop := iter.Pull2(s.Events(ctx, id, 1, 0))
	return func(event string) {
		t.Helper()
		b, err, ok := next()
		if !ok || err != nil || string(b) != event {
			t.Fatalf("the watch yielded %q, %v (more: %v); want %q", b, err, ok, event)
		}
	}, stop
}
