package store_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/turnstile-dev/turnstile/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The embedded server's background workers end after Shutdown
		// returns; give them the moment they need.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
	)
}

func open(t *testing.T, dir string) *store.Store {
	t.Helper()
	cfg := store.DefaultConfig()
	cfg.Dir = dir
	cfg.LeaseTTL = 500 * time.Millisecond
	s, err := store.Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// openNATS opens a store on the NATS server at url, as one replica of a
// deployment; the test's cleanup closes it.
func openNATS(t *testing.T, url string) *store.Store {
	t.Helper()
	cfg := store.DefaultConfig()
	cfg.Mode, cfg.NATS.URL = store.ModeNATS, url
	s, err := store.Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func collect(t *testing.T, s *store.Store, id string, attempt uint32, after uint64, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []string
	if n == 0 {
		return nil
	}
	for b, err := range s.Events(ctx, id, attempt, after) {
		if err != nil {
			t.Fatalf("events: %v (after %v)", err, out)
		}
		out = append(out, string(b))
		if len(out) == n {
			break
		}
	}
	return out
}

func TestLogRoundTrip(t *testing.T) {
	for _, dir := range []string{"", "file"} {
		t.Run(fmt.Sprintf("dir=%q", dir), func(t *testing.T) {
			if dir != "" {
				dir = t.TempDir()
			}
			s := open(t, dir)
			ctx := context.Background()
			id := "turn with spaces.and*wildcards>"
			created, _, err := s.Create(ctx, id, 1, []byte("req"), func(string) []byte { return nil })
			if err != nil || !created {
				t.Fatalf("Create = %v, %v", created, err)
			}
			var mu sync.Mutex
			var acked []int
			for i := 1; i <= 5; i++ {
				if err := s.Append(ctx, id, 1, fmt.Appendf(nil, "e%d", i), func(err error) {
					if err != nil {
						t.Errorf("ack %d: %v", i, err)
					}
					mu.Lock()
					acked = append(acked, i)
					mu.Unlock()
				}); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Finish(ctx, id, 1); err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(acked) != "[1 2 3 4 5]" {
				t.Errorf("acks in order %v", acked)
			}
			if got := collect(t, s, id, 1, 0, 5); fmt.Sprint(got) != "[e1 e2 e3 e4 e5]" {
				t.Errorf("events = %v", got)
			}
			if got := collect(t, s, id, 1, 3, 2); fmt.Sprint(got) != "[e4 e5]" {
				t.Errorf("events after 3 = %v", got)
			}
			rec, err := s.Record(ctx, id, 1)
			if err != nil || string(rec) != "req" {
				t.Errorf("Record = %q, %v", rec, err)
			}
			if _, err := s.Record(ctx, id, 2); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("Record of a missing attempt: %v", err)
			}
			created, existing, err := s.Create(ctx, id, 1, []byte("other"), nil)
			if err != nil || created || string(existing) != "req" {
				t.Errorf("second Create = %v, %q, %v", created, existing, err)
			}
			if _, _, err := s.Create(ctx, id, 3, []byte("r3"), func(string) []byte { return nil }); err != nil {
				t.Fatal(err)
			}
			defer s.Finish(ctx, id, 3)
			if n, err := s.LatestAttempt(ctx, id); err != nil || n != 3 {
				t.Errorf("LatestAttempt = %d, %v", n, err)
			}
			if _, err := s.LatestAttempt(ctx, "nope"); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("LatestAttempt of an unknown turn: %v", err)
			}
		})
	}
}

// TestCreateOnce: of many concurrent Creates of one run, one creates it
// and every other gets its record.
func TestCreateOnce(t *testing.T) {
	s := open(t, "")
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	creators := 0
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			created, existing, err := s.Create(ctx, "t", 1, fmt.Appendf(nil, "r%d", i), func(string) []byte { return nil })
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if created {
				creators++
			} else if len(existing) == 0 {
				t.Error("no record returned")
			}
		}()
	}
	wg.Wait()
	if creators != 1 {
		t.Fatalf("%d creators, want 1", creators)
	}
	if err := s.Finish(ctx, "t", 1); err != nil {
		t.Fatal(err)
	}
}

// TestFollowLive: a watcher receives events appended after it started,
// and signals reach the owner.
func TestFollowLiveAndSignal(t *testing.T) {
	s := open(t, "")
	ctx := context.Background()
	if _, _, err := s.Create(ctx, "t", 1, []byte("r"), func(sig string) []byte { return []byte("got " + sig) }); err != nil {
		t.Fatal(err)
	}
	got := make(chan []string)
	go func() { got <- collect(t, s, "t", 1, 0, 3) }()
	for i := range 3 {
		if err := s.Append(ctx, "t", 1, fmt.Appendf(nil, "e%d", i), func(error) {}); err != nil {
			t.Fatal(err)
		}
	}
	if g := <-got; fmt.Sprint(g) != "[e0 e1 e2]" {
		t.Errorf("live events = %v", g)
	}
	reply, err := s.Signal(ctx, "t", 1, "cancel")
	if err != nil || string(reply) != "got cancel" {
		t.Errorf("Signal = %q, %v", reply, err)
	}
	if err := s.Finish(ctx, "t", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Signal(ctx, "t", 1, "cancel"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Signal after Finish: %v", err)
	}
}

// TestOwnerGone: a watcher of a run whose owner stopped without a last
// event learns it once the lease expires.
func TestOwnerGone(t *testing.T) {
	dir := t.TempDir()
	cfg := store.DefaultConfig()
	cfg.Dir, cfg.LeaseTTL = dir, 500*time.Millisecond
	owner, err := store.Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, _, err := owner.Create(ctx, "t", 1, []byte("r"), func(string) []byte { return nil }); err != nil {
		t.Fatal(err)
	}
	acked := make(chan error, 1)
	if err := owner.Append(ctx, "t", 1, []byte("e1"), func(err error) { acked <- err }); err != nil {
		t.Fatal(err)
	}
	if err := <-acked; err != nil {
		t.Fatal(err)
	}
	owner.Close() // no Finish: the lease is left to expire
	s := open(t, dir)
	var got []string
	var last error
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for b, err := range s.Events(wctx, "t", 1, 0) {
		if err != nil {
			last = err
			break
		}
		got = append(got, string(b))
	}
	if fmt.Sprint(got) != "[e1]" || !errors.Is(last, store.ErrNoOwner) {
		t.Fatalf("got %v, %v; want [e1], ErrNoOwner", got, last)
	}
}

// TestOneProcessPerDir: a second store on the same directory fails with
// an error that says what to do.
func TestOneProcessPerDir(t *testing.T) {
	dir := t.TempDir()
	open(t, dir)
	cfg := store.DefaultConfig()
	cfg.Dir = dir
	s, err := store.Open(context.Background(), cfg, nil)
	if err == nil {
		s.Close()
		t.Fatal("a second store opened the same directory")
	}
	if !strings.Contains(err.Error(), "in use by another turnstile process") {
		t.Errorf("error = %v", err)
	}
}
