package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnstile-dev/turnstile/internal/natstest"
	"github.com/turnstile-dev/turnstile/store"
)

// openSmall opens an embedded store in dir whose log holds maxBytes.
func openSmall(t *testing.T, dir string, maxBytes int64) *store.Store {
	t.Helper()
	cfg := store.DefaultConfig()
	cfg.Dir, cfg.MaxBytes, cfg.LeaseTTL = dir, maxBytes, 500*time.Millisecond
	s, err := store.Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// run creates a run whose record is size bytes and appends one event;
// finish says whether it ends.
func run(t *testing.T, s *store.Store, id string, size int, finish bool) error {
	t.Helper()
	ctx := context.Background()
	created, _, err := s.Create(ctx, id, 1, make([]byte, size), func(string) []byte { return nil })
	if err != nil {
		return err
	}
	if !created {
		t.Fatalf("%s exists", id)
	}
	if err := s.Append(ctx, id, 1, []byte(id+" e1"), func(error) {}); err != nil {
		t.Fatal(err)
	}
	if finish {
		return s.Finish(ctx, id, 1)
	}
	return nil
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestKeeperNeverEvictsRunning: a log filled by finished runs makes room
// by removing the oldest of them, never a running one, however old, and
// refuses new turns only while running turns hold it.
func TestKeeperNeverEvictsRunning(t *testing.T) {
	const max = 1 << 20
	s := openSmall(t, "", max)
	ctx := context.Background()
	// The victim: the oldest run of the log, running all along.
	if err := run(t, s, "victim", 1000, false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond) // older than a lease TTL
	// A flood of finished runs, five times what the log holds.
	for i := range 50 {
		err := run(t, s, fmt.Sprintf("flood-%d", i), 100<<10, true)
		if err != nil && !errors.Is(s.Room(), store.ErrFull) {
			t.Fatalf("flood %d: %v, and Room says %v", i, err, s.Room())
		}
		if err != nil {
			// Refused: wait for the keeper, as a client told to retry does.
			waitFor(t, "room", func() bool { return s.Room() == nil })
			if err := run(t, s, fmt.Sprintf("flood-%d-again", i), 100<<10, true); err != nil {
				t.Fatalf("flood %d again: %v", i, err)
			}
		}
	}
	waitFor(t, "the keeper", func() bool { u := s.Usage(); return u.Evicted > 0 && u.Bytes <= max*9/10 })
	if _, err := s.Record(ctx, "flood-0", 1); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the oldest finished run is still there: %v", err)
	}
	if _, err := s.Record(ctx, "flood-49", 1); err != nil {
		t.Errorf("the newest finished run: %v", err)
	}
	// The victim is whole and goes on.
	if rec, err := s.Record(ctx, "victim", 1); err != nil || len(rec) != 1000 {
		t.Fatalf("victim's record: %d bytes, %v", len(rec), err)
	}
	if err := s.Append(ctx, "victim", 1, []byte("victim e2"), func(err error) {
		if err != nil {
			t.Errorf("victim's append: %v", err)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, "victim", 1); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, s, "victim", 1, 0, 2); fmt.Sprint(got) != "[victim e1 victim e2]" {
		t.Errorf("victim's events: %v", got)
	}
	// What Usage says is the keeper's last pass: the one after the victim
	// finished finds the log no longer held by running turns.
	waitFor(t, "the keeper's pass after the victim finished", func() bool { return s.Usage().Full == nil })
	u := s.Usage()
	if u.Limit != max || u.Oldest.IsZero() || u.Full != nil {
		t.Errorf("usage = %+v", u)
	}
}

// TestFullOfRunningTurns: running turns are never removed; once they hold
// the log, Room refuses new turns, and takes them again once they end and
// the keeper removed them.
func TestFullOfRunningTurns(t *testing.T) {
	const max = 1 << 20
	s := openSmall(t, "", max)
	var mu sync.Mutex
	var calls []error
	s.OnRoom(func(err error) { mu.Lock(); calls = append(calls, err); mu.Unlock() })
	var running []string
	for i := 0; s.Room() == nil; i++ {
		if i > 20 {
			t.Fatal("the log never filled")
		}
		id := fmt.Sprintf("running-%d", i)
		if err := run(t, s, id, 100<<10, false); err != nil {
			if errors.Is(s.Room(), store.ErrFull) {
				break
			}
			t.Fatal(err)
		}
		running = append(running, id)
		time.Sleep(1100 * time.Millisecond) // a keeper pass
	}
	err := s.Room()
	if !errors.Is(err, store.ErrFull) || !strings.Contains(err.Error(), "running") {
		t.Fatalf("Room = %v", err)
	}
	for _, id := range running {
		if _, err := s.Record(context.Background(), id, 1); err != nil {
			t.Errorf("running %s removed: %v", id, err)
		}
		if err := s.Finish(context.Background(), id, 1); err != nil {
			t.Errorf("finish %s: %v", id, err)
		}
	}
	waitFor(t, "room after the runs ended", func() bool { return s.Room() == nil })
	mu.Lock()
	defer mu.Unlock()
	if len(calls) < 3 || calls[0] != nil || !errors.Is(calls[1], store.ErrFull) || calls[len(calls)-1] != nil {
		t.Errorf("OnRoom calls: %v", calls)
	}
}

// openTurns opens an embedded store in memory whose log keeps maxTurns
// turns, its bytes unbounded.
func openTurns(t *testing.T, maxTurns int64) *store.Store {
	t.Helper()
	cfg := store.DefaultConfig()
	cfg.Dir, cfg.MaxBytes, cfg.MaxTurns, cfg.LeaseTTL = "", -1, maxTurns, 500*time.Millisecond
	s, err := store.Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestKeeperBoundsTurns: a log that keeps at most 10 turns, flooded with
// small finished ones, is brought down to 8 by removing the oldest
// finished turns, never a running one; Usage counts the turns.
func TestKeeperBoundsTurns(t *testing.T) {
	s := openTurns(t, 10)
	ctx := context.Background()
	if err := run(t, s, "victim", 100, false); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		if err := run(t, s, fmt.Sprintf("flood-%d", i), 100, true); err != nil {
			t.Fatalf("flood %d: %v", i, err)
		}
	}
	waitFor(t, "the keeper", func() bool { u := s.Usage(); return u.Evicted > 0 && u.Turns <= 8 })
	if _, err := s.Record(ctx, "flood-0", 1); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the oldest finished turn is still there: %v", err)
	}
	for _, id := range []string{"victim", "flood-39"} {
		if _, err := s.Record(ctx, id, 1); err != nil {
			t.Errorf("%s: %v", id, err)
		}
	}
	if err := s.Room(); err != nil {
		t.Errorf("Room = %v", err)
	}
	if err := s.Finish(ctx, "victim", 1); err != nil {
		t.Fatal(err)
	}
}

// TestFullOfRunningTurnsByCount: when running turns hold store.max_turns,
// none can be removed and Room refuses new turns, naming the bound; once
// they end and are removed, turns are taken again.
func TestFullOfRunningTurnsByCount(t *testing.T) {
	s := openTurns(t, 4)
	ctx := context.Background()
	var running []string
	for i := range 4 {
		id := fmt.Sprintf("running-%d", i)
		if err := run(t, s, id, 100, false); err != nil {
			t.Fatal(err)
		}
		running = append(running, id)
	}
	waitFor(t, "the log full of running turns", func() bool { return s.Room() != nil })
	if err := s.Room(); !errors.Is(err, store.ErrFull) || !strings.Contains(err.Error(), "store.max_turns") {
		t.Fatalf("Room = %v", err)
	}
	for _, id := range running {
		if _, err := s.Record(ctx, id, 1); err != nil {
			t.Errorf("running %s removed: %v", id, err)
		}
		if err := s.Finish(ctx, id, 1); err != nil {
			t.Errorf("finish %s: %v", id, err)
		}
	}
	waitFor(t, "room after the turns ended", func() bool { return s.Room() == nil })
	if u := s.Usage(); u.Turns > 3 || u.Evicted == 0 {
		t.Errorf("usage %+v: want 3 turns at most, some removed", u)
	}
}

// TestDiscardOldUpdated: a log made by an earlier version, which dropped
// the oldest records when full, refuses instead once the store opens it.
func TestDiscardOldUpdated(t *testing.T) {
	dir := t.TempDir()
	opts := &natsserver.Options{DontListen: true, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true}
	srv, err := natsserver.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("not ready")
	}
	nc, err := nats.Connect("", nats.InProcessServer(srv))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: store.StreamName, Subjects: []string{"turnstile.run.>"}, MaxBytes: 1 << 20, Discard: jetstream.DiscardOld}); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	srv.Shutdown()
	srv.WaitForShutdown()

	s := openSmall(t, dir, 1<<20)
	for i := 0; ; i++ {
		err := run(t, s, fmt.Sprintf("r%d", i), 100<<10, false)
		if err != nil {
			if !errors.Is(s.Room(), store.ErrFull) {
				t.Fatalf("run %d: %v; Room = %v", i, err, s.Room())
			}
			break
		}
		if i > 20 {
			t.Fatal("the log took more than it holds")
		}
	}
	if _, err := s.Record(ctx, "r0", 1); err != nil {
		t.Errorf("the oldest running run was dropped: %v", err)
	}
}

// TestDiskFullRecovers: the embedded file store on a full filesystem
// refuses new turns, and takes them again, without a restart, once space
// returns, although nats-server takes no write after a failed one until
// its JetStream is restarted. It needs a tmpfs: root, or it is skipped.
func TestDiskFullRecovers(t *testing.T) {
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", mnt).Run() })
	dir := filepath.Join(mnt, "js")
	cfg := store.DefaultConfig()
	cfg.Dir, cfg.MaxBytes, cfg.LeaseTTL = dir, -1, 500*time.Millisecond
	var logs syncBuffer
	s, err := store.Open(context.Background(), cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Something else fills the disk.
	fill := filepath.Join(mnt, "fill")
	if out, err := exec.Command("dd", "if=/dev/zero", "of="+fill, "bs=1M", "count=40").CombinedOutput(); err == nil {
		t.Fatalf("dd filled no disk: %s", out)
	}
	waitFor(t, "the keeper to see the disk", func() bool { return errors.Is(s.Room(), store.ErrFull) })
	if err := s.Room(); !strings.Contains(err.Error(), "disk") {
		t.Errorf("Room = %v", err)
	}
	// A write fails, as a turn's would; nats-server then takes no other.
	if err := run(t, s, "on-full-disk", 1<<20, true); err == nil {
		t.Fatal("a write on the full disk passed")
	}
	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "room after the disk has space", func() bool { return s.Room() == nil })
	if err := run(t, s, "after", 1000, true); err != nil {
		t.Fatalf("a run after space returned: %v", err)
	}
	if got := collect(t, s, "after", 1, 0, 1); fmt.Sprint(got) != "[after e1]" {
		t.Errorf("events = %v", got)
	}
	if !strings.Contains(logs.String(), "restarting its JetStream") {
		t.Errorf("the embedded JetStream was not restarted; logs:\n%s", logs.String())
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestSmallDiskSaysWhatToSet: on a disk smaller than store.max_bytes
// needs, the embedded server refuses the log; Open says which key to set
// and to what, instead of nats-server's "insufficient storage resources".
// It needs a tmpfs: root, or it is skipped.
func TestSmallDiskSaysWhatToSet(t *testing.T) {
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", mnt).Run() })
	cfg := store.DefaultConfig() // max_bytes: 1 GiB
	cfg.Dir = filepath.Join(mnt, "js")
	s, err := store.Open(context.Background(), cfg, nil)
	if err == nil {
		s.Close()
		t.Fatal("a 1 GiB log opened on a 64 MiB disk")
	}
	for _, want := range []string{"store.max_bytes (1073741824 bytes) is more than the embedded JetStream may use on the disk of store.dir", "set store.max_bytes to at most"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	t.Log(err)
	cfg.MaxBytes = 32 << 20
	s, err = store.Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatalf("32 MiB on a 64 MiB disk: %v", err)
	}
	s.Close()
}

// TestKeeperAcrossReplicas: with a NATS server shared by two replicas,
// a flood of finished runs on one does not remove the running run of the
// other, whose lease is the only sign that it runs.
func TestKeeperAcrossReplicas(t *testing.T) {
	url := natstest.Start(t)
	open := func() *store.Store {
		cfg := store.DefaultConfig()
		cfg.Mode, cfg.NATS.URL, cfg.MaxBytes, cfg.LeaseTTL = store.ModeNATS, url, 1<<20, 500*time.Millisecond
		s, err := store.Open(context.Background(), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	a, b := open(), open()
	if err := run(t, a, "victim", 1000, false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond) // older than a lease TTL
	for i := range 40 {
		if err := run(t, b, fmt.Sprintf("flood-%d", i), 100<<10, true); err != nil {
			waitFor(t, "room", func() bool { return b.Room() == nil })
		}
	}
	waitFor(t, "the keepers", func() bool { return b.Usage().Evicted+a.Usage().Evicted > 0 })
	if rec, err := b.Record(context.Background(), "victim", 1); err != nil || len(rec) != 1000 {
		t.Fatalf("victim's record: %d bytes, %v", len(rec), err)
	}
	if err := a.Append(context.Background(), "victim", 1, []byte("victim e2"), func(error) {}); err != nil {
		t.Fatal(err)
	}
	if err := a.Finish(context.Background(), "victim", 1); err != nil {
		t.Fatalf("victim's finish: %v", err)
	}
	if got := collect(t, b, "victim", 1, 0, 2); fmt.Sprint(got) != "[victim e1 victim e2]" {
		t.Errorf("victim's events: %v", got)
	}
}
