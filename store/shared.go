package store

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Shared is what the replicas of a deployment share beside the turns'
// log, each in a key-value bucket of its own: the models' cooldowns
// (cooldown.go) and retry budgets (budget.go), and the client keys'
// limits (limits.go). [Store.Shared] returns it; it is the runtime's
// CooldownSharer and BudgetSharer and the server's LimitSharer.
type Shared struct {
	id        string // this replica's, written with each value
	logger    *slog.Logger
	js        jetstream.JetStream
	cooldowns jetstream.KeyValue
	budgets   jetstream.KeyValue
	limits    jetstream.KeyValue
	watch     bucketWatch
}

// Shared returns what the replicas share beside the turns' log.
func (s *Store) Shared() *Shared { return &s.shared }

// bucketWatch follows key-value buckets for as long as its store is open.
type bucketWatch struct {
	logger *slog.Logger
	closed <-chan struct{} // the store's: closed by Close
}

// all calls fn with the latest entry of each of kv's keys, then with each
// new one, until ctx is done or the store closes. A watch that
// ends on its own (the client library gives up its consumer, as it may
// after failed resets in a cluster) is made again, after a pause that
// grows to rewatchMax, and delivers the latest entries again: fn must take
// an entry twice. Only a first watch that cannot be made is an error.
func (b bucketWatch) all(ctx context.Context, kv jetstream.KeyValue, fn func(jetstream.KeyValueEntry)) error {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("store: watch %s: %w", kv.Bucket(), err)
	}
	pause := rewatchMin
	for {
		if err == nil && b.follow(ctx, w, fn) {
			return nil
		}
		if err == nil {
			b.logger.Warn("turn store: a bucket's watch ended; watching it again", "bucket", kv.Bucket())
		} else {
			b.logger.Warn("turn store: cannot watch a bucket again", "bucket", kv.Bucket(), "error", err, "retry_in", pause)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-b.closed:
			return nil
		case <-time.After(pause):
		}
		pause = min(2*pause, rewatchMax)
		if w, err = kv.WatchAll(ctx); err == nil {
			pause = rewatchMin
		}
	}
}

// The pauses before a bucket is watched again (see [bucketWatch.all]).
const (
	rewatchMin = 100 * time.Millisecond
	rewatchMax = 5 * time.Second
)

// follow passes w's entries to fn until ctx is done or the store closes
// (it reports true), or w ends on its own (false). It stops w.
func (b bucketWatch) follow(ctx context.Context, w jetstream.KeyWatcher, fn func(jetstream.KeyValueEntry)) (done bool) {
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return true
		case <-b.closed:
			return true
		case e, ok := <-w.Updates():
			if !ok {
				return false
			}
			if e != nil {
				fn(e)
			}
		}
	}
}
