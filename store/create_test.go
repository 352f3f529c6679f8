package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnstile-dev/turnstile/internal/natstest"
)

// flakyJS is a replica's JetStream client on a network that fails the
// first publish to a run's owner records: before the server receives it
// (no responders), or after the server stored it (the answer lost, as
// when the server the replica is connected to or the stream's leader goes
// away mid-request). Every publish still reaches the real server.
type flakyJS struct {
	jetstream.JetStream
	// first runs instead of the first publish to an owner record.
	first func(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)

	mu    sync.Mutex
	calls int // publishes to owner records
}

func (f *flakyJS) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if !strings.HasSuffix(msg.Subject, ".own") {
		return f.JetStream.PublishMsg(ctx, msg, opts...)
	}
	f.mu.Lock()
	f.calls++
	n := f.calls
	f.mu.Unlock()
	if n == 1 {
		return f.first(ctx, msg, opts...)
	}
	return f.JetStream.PublishMsg(ctx, msg, opts...)
}

// TestCreateRetried: a Create whose record's publish got no answer, or was
// refused for now, is made again; the run is created once, by this
// replica, whose appends then pass the fence. When another replica
// created the run in between, the retry finds it. On one server the
// retry of a stored record is refused by its expectation (checked before
// the message id) and the record's id tells it is ours; on a three-server
// cluster, with the log replicated three times, the message id answers it
// as a duplicate.
func TestCreateRetried(t *testing.T) {
	t.Run("one server", func(t *testing.T) { testCreateRetried(t, natstest.Start(t)) })
	t.Run("three-server cluster", func(t *testing.T) {
		_, urls := natstest.Cluster(t, 3)
		testCreateRetried(t, strings.Join(urls, ","))
	})
}

// openReplicaR3 opens a store at url, waiting until a cluster there can
// place the replicas it asks for (it elects its meta leader first).
func openReplicaR3(t *testing.T, url string) *Store {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Mode, cfg.NATS.URL, cfg.LeaseTTL = ModeNATS, url, time.Second
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, err := Open(context.Background(), cfg, nil)
		if err == nil {
			t.Cleanup(s.Close)
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("store at %s: %v", url, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func testCreateRetried(t *testing.T, url string) {
	ctx := context.Background()
	other := openReplicaR3(t, url)
	if strings.Contains(url, ",") {
		if r := other.stream.CachedInfo().Config.Replicas; r != 3 {
			t.Fatalf("the log has %d replicas on the cluster, want 3", r)
		}
	}
	tests := []struct {
		name string
		// first is the first publish of the record, given the real one.
		first func(real jetstream.JetStream) func(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
		// byOther: the other replica creates the run during the first publish.
		byOther bool
	}{{
		name: "stored, the answer lost",
		first: func(real jetstream.JetStream) func(context.Context, *nats.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
			return func(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
				if _, err := real.PublishMsg(ctx, msg, opts...); err != nil {
					return nil, err
				}
				return nil, context.DeadlineExceeded
			}
		},
	}, {
		name: "no responders",
		first: func(jetstream.JetStream) func(context.Context, *nats.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
			return func(context.Context, *nats.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
				return nil, nats.ErrNoResponders
			}
		},
	}, {
		name: "the answer lost, meanwhile created by another replica",
		first: func(jetstream.JetStream) func(context.Context, *nats.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
			return func(context.Context, *nats.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
				return nil, nats.ErrTimeout
			}
		},
		byOther: true,
	}}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openReplicaR3(t, url)
			id := fmt.Sprintf("create-%d", i)
			real := s.js
			first := tt.first(real)
			if tt.byOther {
				first = func(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
					if created, _, err := other.Create(ctx, id, 1, []byte("other's"), func(string) []byte { return nil }); err != nil || !created {
						t.Errorf("the other replica's Create: %v, %v", created, err)
					}
					return tt.first(real)(ctx, msg, opts...)
				}
			}
			flaky := &flakyJS{JetStream: real, first: first}
			s.js, s.pub.js = flaky, flaky

			created, existing, err := s.Create(ctx, id, 1, []byte("mine"), func(string) []byte { return nil })
			if err != nil {
				t.Fatal(err)
			}
			if flaky.calls != 2 {
				t.Errorf("%d publishes of the record, want 2", flaky.calls)
			}
			owner, want := s, "mine"
			if tt.byOther {
				if created || string(existing) != "other's" {
					t.Fatalf("Create of a run another replica created: created %v, existing %q", created, existing)
				}
				owner, want = other, "other's"
			} else if !created {
				t.Fatalf("Create: not created, existing %q", existing)
			}
			// One record, and the owner's appends pass the fence, which
			// expects it.
			k := runKey{id, 1}
			info, err := s.stream.Info(ctx, jetstream.WithSubjectFilter(k.own()))
			if err != nil {
				t.Fatal(err)
			}
			if n := info.State.Subjects[k.own()]; n != 1 {
				t.Errorf("%d owner records, want 1", n)
			}
			if rec, err := s.Record(ctx, id, 1); err != nil || string(rec) != want {
				t.Errorf("record %q, %v; want %q", rec, err, want)
			}
			stored := make(chan error, 1)
			if err := owner.Append(ctx, id, 1, []byte("e1"), func(err error) { stored <- err }); err != nil {
				t.Fatal(err)
			}
			if err := <-stored; err != nil {
				t.Fatalf("append: %v", err)
			}
			if err := owner.Finish(ctx, id, 1); err != nil {
				t.Fatal(err)
			}
			if !tt.byOther {
				return
			}
			if _, err := s.leases.writer(id, 1); !errors.Is(err, ErrLost) {
				t.Errorf("the replica that did not create the run owns it: %v", err)
			}
		})
	}
}
