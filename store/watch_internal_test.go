package store

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// endingKV is a real bucket whose first watch ends on its own after its
// first entry, as the client library's watch does when it gives its
// consumer up.
type endingKV struct {
	jetstream.KeyValue
	mu      sync.Mutex
	watches int
}

func (kv *endingKV) WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	w, err := kv.KeyValue.WatchAll(ctx, opts...)
	if err != nil {
		return nil, err
	}
	kv.mu.Lock()
	kv.watches++
	first := kv.watches == 1
	kv.mu.Unlock()
	if !first {
		return w, nil
	}
	out := make(chan jetstream.KeyValueEntry)
	go func() {
		defer close(out)
		for e := range w.Updates() {
			if e == nil {
				continue
			}
			out <- e
			return // the watch ends here
		}
	}()
	return &endingWatcher{KeyWatcher: w, out: out}, nil
}

type endingWatcher struct {
	jetstream.KeyWatcher
	out chan jetstream.KeyValueEntry
}

func (w *endingWatcher) Updates() <-chan jetstream.KeyValueEntry { return w.out }

// TestWatchOutlivesItsConsumer: a bucket's watch that ends on its own is
// made again, and the entries put after it ended still arrive.
func TestWatchOutlivesItsConsumer(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Dir = ""
	s, err := Open(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	kv := &endingKV{KeyValue: s.shared.budgets}
	if _, err := kv.Put(t.Context(), "before", []byte("1")); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 16)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- s.shared.watch.all(ctx, kv, func(e jetstream.KeyValueEntry) { got <- e.Key() })
	}()
	next := func() string {
		select {
		case k := <-got:
			return k
		case <-time.After(10 * time.Second):
			t.Fatal("no entry within 10s: the watch was not made again")
			return ""
		}
	}
	if k := next(); k != "before" {
		t.Fatalf("first entry %q, want before", k)
	}
	if _, err := kv.Put(t.Context(), "after", []byte("2")); err != nil {
		t.Fatal(err)
	}
	// The second watch delivers the latest entries again, then the new one.
	seen := map[string]bool{}
	for !seen["after"] {
		seen[next()] = true
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("the watch = %v after its context ended, want nil", err)
	}
	kv.mu.Lock()
	defer kv.mu.Unlock()
	if kv.watches != 2 {
		t.Errorf("%d watches, want 2", kv.watches)
	}
}
