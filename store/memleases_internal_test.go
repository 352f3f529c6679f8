package store

import (
	"context"
	"errors"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestEmbeddedLeasesInMemory: with the log in files, the embedded store
// keeps its lease bucket in memory (see dropFileLeases). A directory whose
// lease bucket an earlier version made in files gets it again in memory;
// the log and the other buckets stay in files. A run the previous process
// left has no lease after a restart, and is taken over by a claim (as a
// watcher's adoption makes it).
func TestEmbeddedLeasesInMemory(t *testing.T) {
	dir := t.TempDir()
	fileLeaseBucket(t, dir)

	cfg := DefaultConfig()
	cfg.Dir, cfg.LeaseTTL = dir, 500*time.Millisecond
	s, err := Open(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	wantStorage(t, s, map[string]jetstream.StorageType{
		"KV_" + LeaseBucket:    jetstream.MemoryStorage,
		StreamName:             jetstream.FileStorage,
		"KV_" + CooldownBucket: jetstream.FileStorage,
		"KV_" + BudgetBucket:   jetstream.FileStorage,
		"KV_" + LimitBucket:    jetstream.FileStorage,
	})
	if _, err := s.leases.kv.Get(ctx, "old"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("the file bucket's lease: %v, want ErrKeyNotFound", err)
	}
	if created, _, err := s.Create(ctx, "left", 1, []byte("req"), func(string) []byte { return nil }); err != nil || !created {
		t.Fatalf("Create = %v, %v", created, err)
	}
	acked := make(chan error, 1)
	if err := s.Append(ctx, "left", 1, []byte("e1"), func(err error) { acked <- err }); err != nil {
		t.Fatal(err)
	}
	if err := <-acked; err != nil {
		t.Fatal(err)
	}
	k := runKey{"left", 1}
	// The running run is held in the process, by no lease (see
	// [leases.local]).
	if !s.leases.heldHere(k) {
		t.Fatal("the running run is not held by the process")
	}
	if _, err := s.leases.kv.Get(ctx, k.lease()); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the running run's lease: %v, want ErrKeyNotFound (no lease)", err)
	}
	s.Close() // no Finish: the process went away

	s, err = Open(ctx, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	wantStorage(t, s, map[string]jetstream.StorageType{"KV_" + LeaseBucket: jetstream.MemoryStorage})
	if _, err := s.leases.kv.Get(ctx, k.lease()); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the previous process's lease after a restart: %v, want ErrKeyNotFound", err)
	}
	record, events, claims, err := s.Claim(ctx, "left", 1, func(string) []byte { return nil })
	if err != nil {
		t.Fatalf("Claim of the run left: %v", err)
	}
	if string(record) != "req" || len(events) != 1 || string(events[0]) != "e1" || claims != 1 {
		t.Errorf("Claim = %q, %q, %d; want req, [e1], 1", record, events, claims)
	}
	if !s.leases.heldHere(k) {
		t.Error("the claimed run is not held by the process")
	}
	if err := s.Finish(ctx, "left", 1); err != nil {
		t.Fatal(err)
	}
	if s.leases.heldHere(k) {
		t.Error("the run is held by the process after Finish")
	}
}

// fileLeaseBucket makes the lease bucket in files under dir, with one key,
// as earlier versions did.
func fileLeaseBucket(t *testing.T, dir string) {
	t.Helper()
	srv, err := natsserver.NewServer(&natsserver.Options{DontListen: true, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("the server did not start")
	}
	nc, err := nats.Connect("", nats.InProcessServer(srv))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: LeaseBucket, History: 1, Storage: jetstream.FileStorage, TTL: time.Hour, LimitMarkerTTL: markerTTL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "old", []byte("x")); err != nil {
		t.Fatal(err)
	}
}

func wantStorage(t *testing.T, s *Store, want map[string]jetstream.StorageType) {
	t.Helper()
	for name, st := range want {
		info, err := s.js.Stream(t.Context(), name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		if got := info.CachedInfo().Config.Storage; got != st {
			t.Errorf("stream %s: storage %v, want %v", name, got, st)
		}
	}
}
