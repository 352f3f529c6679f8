package store

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/turnstile-dev/turnstile/internal/natstest"
)

// opsObserver counts the messages of one run as a NATS server routes them,
// seen by a subscriber of every subject of the account: each publish of
// the run's owner, each acknowledgement (of any run: one runs at a time),
// each delivery to a watch.
type opsObserver struct {
	mu   sync.Mutex
	ops  map[string]int
	seen chan struct{} // signalled at each message
}

// observe subscribes nc to every subject and counts, by kind, the
// messages of run k.
func observe(t *testing.T, nc *nats.Conn, k runKey) *opsObserver {
	t.Helper()
	o := &opsObserver{ops: map[string]int{}, seen: make(chan struct{}, 1)}
	lease := "$KV." + LeaseBucket + "." + k.lease()
	sub, err := nc.Subscribe(">", func(m *nats.Msg) {
		var kind string
		switch {
		case m.Subject == k.own():
			kind = "publish record"
		case m.Subject == k.events():
			kind = "publish frame"
		case m.Subject == lease && strings.HasPrefix(m.Reply, "$JS.ACK."):
			kind = "watch delivery of lease " + m.Header.Get(kvOperation)
		case m.Subject == lease:
			kind = "publish lease " + m.Header.Get(kvOperation)
		case strings.HasPrefix(m.Subject, "_INBOX.") && strings.Contains(string(m.Data), `"seq"`):
			kind = "acknowledgement"
		default:
			return // another run's, a heartbeat, the set-up
		}
		o.mu.Lock()
		o.ops[kind]++
		o.mu.Unlock()
		select {
		case o.seen <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return o
}

// await waits until the observer has counted want, and fails the test when
// it counted anything else, or more than atMost of the kinds that holds.
func (o *opsObserver) await(t *testing.T, want, atMost map[string]int) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		o.mu.Lock()
		got := maps.Clone(o.ops)
		o.mu.Unlock()
		exact, total := map[string]int{}, 0
		for kind, n := range got {
			if most, ok := atMost[kind]; ok {
				if n > most {
					t.Fatalf("%d messages %q, want at most %d", n, kind, most)
				}
				continue
			}
			exact[kind] = n
			total += n
		}
		if maps.Equal(exact, want) {
			return
		}
		wantTotal := 0
		for _, n := range want {
			wantTotal += n
		}
		if total > wantTotal {
			t.Fatalf("a run's messages:\n got %v\nwant %v", sorted(got), sorted(want))
		}
		select {
		case <-o.seen:
		case <-deadline:
			t.Fatalf("a run's messages, after 20s:\n got %v\nwant %v", sorted(got), sorted(want))
		}
	}
}

func sorted(m map[string]int) []string {
	var out []string
	for k, v := range m {
		out = append(out, fmt.Sprintf("%s: %d", k, v))
	}
	slices.Sort(out)
	return out
}

// turnOps runs one turn on s, as the server does: Create, frames appends
// each acknowledged before the next, and Finish.
func turnOps(t *testing.T, s *Store, k runKey, frames int) {
	t.Helper()
	ctx := context.Background()
	if created, _, err := s.Create(ctx, k.turnID, k.attempt, []byte("record"), func(string) []byte { return nil }); err != nil || !created {
		t.Fatalf("Create: %v, %v", created, err)
	}
	for range frames {
		done := make(chan error, 1)
		if err := s.Append(ctx, k.turnID, k.attempt, []byte("event"), func(err error) { done <- err }); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Finish(ctx, k.turnID, k.attempt); err != nil {
		t.Fatal(err)
	}
}

// TestTurnOperations counts what one turn costs the store, message by
// message (BENCHMARKS.md, issue #35, "The turn's fixed cost"): its record,
// which is its owner record too, and one publish per frame, each
// acknowledged; nothing at Finish with the embedded store, whose runs have
// no lease. With a NATS cluster (mode nats) the run's lease besides:
// written at Create without waiting, its tombstone at Finish, each
// acknowledged and delivered to every replica's WatchExpired (the lease's
// first write, to those that had not yet seen its tombstone). No renewal
// falls within the test (a lease TTL of a minute: the first comes after
// 20 s); each one costs a lease publish, its acknowledgement and a
// delivery per replica. A turn that costs the store one message more
// fails it.
func TestTurnOperations(t *testing.T) {
	const frames = 3
	t.Run("embedded", func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.Dir = t.TempDir()
		s, err := Open(context.Background(), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ctx, cancel := context.WithCancel(context.Background())
		var watching sync.WaitGroup
		watching.Go(func() { _ = s.WatchExpired(ctx, func(string, uint32) {}) })
		defer watching.Wait()
		defer cancel()
		nc, err := nats.Connect("", nats.InProcessServer(s.srv))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		k := runKey{"turn-ops", 1}
		o := observe(t, nc, k)
		turnOps(t, s, k, frames)
		// No lease: the process holds its runs.
		o.await(t, map[string]int{
			"publish record":  1,
			"publish frame":   frames,
			"acknowledgement": 1 + frames,
		}, nil)
	})
	t.Run("nats", func(t *testing.T) {
		url := natstest.Start(t)
		var replicas []*Store
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var watching sync.WaitGroup
		for range 2 {
			cfg := DefaultConfig()
			cfg.Mode, cfg.NATS.URL, cfg.LeaseTTL = ModeNATS, url, time.Minute
			s, err := Open(context.Background(), cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			replicas = append(replicas, s)
			watching.Add(1)
			go func() { defer watching.Done(); _ = s.WatchExpired(ctx, func(string, uint32) {}) }()
		}
		defer watching.Wait()
		defer cancel()
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		// The watches are made before the turn: both consumers of the
		// lease bucket are there.
		for deadline := time.Now().Add(20 * time.Second); ; {
			st, err := replicas[0].js.Stream(ctx, leaseStream)
			if err != nil {
				t.Fatal(err)
			}
			info, err := st.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.State.Consumers >= len(replicas) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d watches of the lease bucket after 20s, want %d", info.State.Consumers, len(replicas))
			}
			select {
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			case <-time.After(10 * time.Millisecond):
			}
		}
		k := runKey{"turn-ops", 1}
		o := observe(t, nc, k)
		turnOps(t, replicas[0], k, frames)
		o.await(t, map[string]int{
			"publish record": 1,
			"publish frame":  frames,
			// The record's, the frames', the lease's first write's (its
			// revision is what the renewal updates) and its tombstone's
			// (Finish returns once the lease is gone).
			"acknowledgement":             3 + frames,
			"publish lease ":              1,
			"publish lease DEL":           1,
			"watch delivery of lease DEL": len(replicas),
		}, map[string]int{
			// The bucket keeps one message a key: a watch that had not
			// delivered the lease when its tombstone came never does.
			"watch delivery of lease ": len(replicas),
		})
	})
}
