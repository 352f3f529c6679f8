package store

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// SignalLost is the signal a run's owner receives, from its own store,
// when it finds that another replica took the run over: it must stop the
// run, whose appends fail from then on.
const SignalLost = "lost"

// WatchExpired calls fn, on its own goroutine, with each run whose lease
// expired without its owner giving it up, or that its owner released
// ([Store.Release]), until ctx is done: the runs to take over. It
// includes the runs whose lease expired within the last ten minutes
// before the call.
//
// With the embedded store there are no leases: the process holds its
// runs itself (see [leases.local]), and what it reports are the runs it
// released, at once, as a released lease is reported (see
// [expiries.watch]).
func (s *Store) WatchExpired(ctx context.Context, fn func(turnID string, attempt uint32)) error {
	return s.leases.watchExpired(ctx, fn)
}

// leases says which replica owns each run. It owns the lease bucket (with
// a NATS cluster, a lease per run, written and renewed by its owner: see
// [writer.renewLoop]), the runs this process owns or is claiming (with the
// embedded store, which writes no lease, their ownership itself: see
// local), and the runs the embedded store released, for WatchExpired
// ([expiries], with its own lock).
type leases struct {
	cfg    Config
	logger *slog.Logger
	id     string          // this replica's id, the value of its leases
	closed <-chan struct{} // the store's: closed by Close
	// local says that the runs' ownership is held in this process, not by
	// leases in the lease bucket: the embedded store (see below).
	local bool

	// Set by newLeases and read-only after.
	nc     *nats.Conn          // for the owner's liveness question
	js     jetstream.JetStream // for remakeLeases
	stream jetstream.Stream    // the log, whose last owner records name the owners
	pub    *publisher          // dropLease's tombstones
	kv     jetstream.KeyValue  // the lease bucket
	kvCfg  jetstream.KeyValueConfig
	watch  bucketWatch // of the lease bucket

	// expiries hands the runs this process released to WatchExpired's
	// callbacks, when local.
	expiries expiries

	// mu guards runs and claiming.
	mu   sync.Mutex
	runs map[runKey]*writer
	// claiming holds the runs this process is claiming, until they are
	// owned (in runs) or the claim fails: with the embedded store, what
	// the lease bucket held (see local).
	claiming map[runKey]struct{}
}

// newLeases returns the leases of a store of cfg whose lease bucket is kv
// (made with kvCfg).
func newLeases(cfg Config, logger *slog.Logger, id string, closed <-chan struct{}, nc *nats.Conn, js jetstream.JetStream, stream jetstream.Stream, pub *publisher, kv jetstream.KeyValue, kvCfg jetstream.KeyValueConfig) *leases {
	return &leases{
		cfg: cfg, logger: logger, id: id, closed: closed, local: cfg.Mode == ModeEmbedded,
		nc: nc, js: js, stream: stream, pub: pub, kv: kv, kvCfg: kvCfg,
		watch: bucketWatch{logger: logger, closed: closed},
		runs:  map[runKey]*writer{}, claiming: map[runKey]struct{}{},
	}
}

// watchExpired is [Store.WatchExpired].
func (l *leases) watchExpired(ctx context.Context, fn func(turnID string, attempt uint32)) error {
	if l.local {
		l.expiries.watch(ctx, l.closed, fn)
		return nil
	}
	return l.watch.all(ctx, l.kv, func(e jetstream.KeyValueEntry) {
		if e.Operation() != jetstream.KeyValuePurge {
			return
		}
		tok, n, found := strings.Cut(e.Key(), ".")
		id, err := base64.RawURLEncoding.DecodeString(tok)
		attempt, aerr := strconv.ParseUint(n, 10, 32)
		if !found || err != nil || aerr != nil {
			return
		}
		fn(string(id), uint32(attempt))
	})
}

// The embedded store holds its runs in the process, not by leases.
//
// A lease tells the replicas of a NATS cluster which of them runs a turn,
// and, when it expires, that its owner went away. The embedded server is
// in-process and its directory locked (one process per store.dir): the
// only replica that could read a lease is the one that wrote it, and its
// runs are in its own map ([leases.runs]). So with the embedded store a
// run's ownership is that map's entry, and nothing of it is a NATS
// message: no lease written at Create or Claim, no renewal while the run
// lasts, no tombstone at Finish (2+ of the ~6 messages a short turn cost,
// each with its scheduling: BENCHMARKS.md, issue #26). Each reader of a
// lease reads the map instead:
//
//   - [Store.Claim] is refused for a run the process owns or is claiming
//     ([leases.claiming] holds it while the claim is under way, as the lease
//     it created did), and asks no owner whether it is renewing: the owner
//     could only be this process, whose map answers;
//   - [Store.WatchExpired] reports what a purged or expired lease
//     reported. A lease expired only when its owner stopped renewing it
//     without giving it up: the process died (nobody is left to read the
//     bucket, which is in memory; a restart finds the run by adoption), or
//     its renewal ran late, which a claim refused as this process's own
//     run. So what is left is [Store.Release]'s purge, reported at once to
//     every watcher, and to one that starts within markerTTL (the time an
//     expiry's marker was kept);
//   - a watcher's [Store.Events] finds the owner gone, the keeper may evict
//     a run, and [Store.Signal] finds an owner of the version before, by
//     [leases.leased].
//
// With a NATS cluster (mode nats) every replica reads the others' leases,
// and all of this is as before.

// leased reports whether run k has a live owner: with the embedded store,
// whether this process owns it or is claiming it; else whether its lease
// is in the bucket.
func (l *leases) leased(ctx context.Context, k runKey) (bool, error) {
	if l.local {
		return l.heldHere(k), nil
	}
	_, err := l.kv.Get(ctx, k.lease())
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	}
	return false, err
}

// heldHere reports whether this process owns run k or is claiming it.
func (l *leases) heldHere(k runKey) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, owned := l.runs[k]
	_, claiming := l.claiming[k]
	return owned || claiming
}

// claimHere starts this process's claim of run k (the embedded store): it
// fails with [ErrNotClaimed] when the process owns the run or claims it
// already. [Store.own] ends the claim ([leases.add]), as does unclaim when
// it fails.
func (l *leases) claimHere(k runKey) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, owned := l.runs[k]; owned {
		return fmt.Errorf("%w: this replica owns it", ErrNotClaimed)
	}
	if _, claiming := l.claiming[k]; claiming {
		return fmt.Errorf("%w: this replica is claiming it", ErrNotClaimed)
	}
	l.claiming[k] = struct{}{}
	return nil
}

// unclaim ends a claim of run k that failed.
func (l *leases) unclaim(k runKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.claiming, k)
}

// expiries hands the runs the embedded store released ([Store.Release])
// to the callbacks of [Store.WatchExpired]: each watcher's queue, and the
// runs released within markerTTL, for a watcher that starts later.
type expiries struct {
	mu       sync.Mutex
	watchers map[*expiryWatch]struct{}
	recent   []expiredRun // oldest first
}

// expiredRun is a run released at a time.
type expiredRun struct {
	key runKey
	at  time.Time
}

// expiryWatch is one WatchExpired's queue; its runs are under
// [expiries.mu], and wake tells that some came.
type expiryWatch struct {
	wake    chan struct{}
	pending []runKey
}

// expire reports run k, which this process released, to every
// WatchExpired (the embedded store).
func (e *expiries) expire(k runKey) {
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.prune(now)
	e.recent = append(e.recent, expiredRun{k, now})
	for w := range e.watchers {
		w.pending = append(w.pending, k)
		select {
		case w.wake <- struct{}{}:
		default: // woken already
		}
	}
}

// prune forgets the runs released more than markerTTL before now; e.mu is
// held.
func (e *expiries) prune(now time.Time) {
	i := 0
	for i < len(e.recent) && now.Sub(e.recent[i].at) > markerTTL {
		i++
	}
	if i > 0 {
		e.recent = append(e.recent[:0], e.recent[i:]...)
	}
}

// watch is WatchExpired with the embedded store: it calls fn with the
// runs released within markerTTL, then with each one released, until ctx
// is done or closed (the store's) is.
func (e *expiries) watch(ctx context.Context, closed <-chan struct{}, fn func(turnID string, attempt uint32)) {
	w := &expiryWatch{wake: make(chan struct{}, 1)}
	e.mu.Lock()
	e.prune(time.Now())
	for _, r := range e.recent {
		w.pending = append(w.pending, r.key)
	}
	if e.watchers == nil {
		e.watchers = map[*expiryWatch]struct{}{}
	}
	e.watchers[w] = struct{}{}
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.watchers, w)
		e.mu.Unlock()
	}()
	for {
		e.mu.Lock()
		runs := w.pending
		w.pending = nil
		e.mu.Unlock()
		for _, k := range runs {
			if ctx.Err() != nil || isClosed(closed) {
				return
			}
			fn(k.turnID, k.attempt)
		}
		select {
		case <-ctx.Done():
			return
		case <-closed:
			return
		case <-w.wake:
		}
	}
}

// aliveReply is the answer of an owner whose renewal is running to the
// question a replica asks before it takes a run over (see [Store.Claim]).
const aliveReply = "renewing"

// ownerRenewing asks the owner of run k, the replica its last owner record
// names, on core NATS (which needs no stream leader), whether it is
// renewing the run's lease. No answer (no owner, a replica that does not
// own the run any more, or one that cannot answer in time) is the evidence
// a takeover needs; an owner that answers is alive and will write its
// lease again. When the record cannot be read the question goes to the
// run's own subject, which its owner hears too, whatever its version.
func (l *leases) ownerRenewing(ctx context.Context, k runKey) bool {
	ctx, cancel := context.WithTimeout(ctx, min(l.cfg.LeaseTTL, time.Second))
	defer cancel()
	owner, err := owner(ctx, l.stream, k)
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	subject := k.alive()
	if err == nil {
		subject = k.aliveAt(owner)
	}
	m, err := l.nc.RequestWithContext(ctx, subject, nil)
	return err == nil && string(m.Data) == aliveReply
}

// dropLease gives up run k's lease without a word to the other replicas.
// It writes a tombstone in the lease's place that no replica reads as an
// expiry, then or when it ages out:
//
//   - its KV-Operation is DEL: a deleted key, which [Store.WatchExpired]
//     passes over (it reports purges: a Release's, or the marker the server
//     places when a lease ages out);
//   - it carries a Nats-Marker-Reason header, so the server takes it for a
//     marker itself: when it ages out of the bucket (after a lease TTL) no
//     marker is placed after it. A tombstone without one (the bucket's own
//     Delete) would age out like any lease, and the marker placed then reads
//     to every replica's WatchExpired as an expired lease: each would claim
//     the run, find it ended, and give its lease up again, which leaves a
//     new tombstone — a churn that never ends, for every run ever finished.
//
// It is one publish to the bucket, answered as any other (its
// acknowledgement read by [publisher.publishMsg]), where a purge of the
// lease's subject was a JetStream API request whose JSON the server and
// the client decode and encode (BENCHMARKS.md, issue #26). A claim of the
// run later (its key deleted) creates the lease as it would a new one.
func (l *leases) dropLease(ctx context.Context, k runKey) error {
	_, err := l.pub.publishMsg(ctx, &nats.Msg{Subject: "$KV." + LeaseBucket + "." + k.lease(), Header: nats.Header{
		kvOperation:  {"DEL"},
		markerReason: {"Remove"},
	}})
	return err
}

// The headers of a lease's tombstone (see dropLease): a KV bucket's
// operation, and the reason of a marker the server places.
const (
	kvOperation  = "KV-Operation"
	markerReason = jetstream.MarkerReasonHeader
)

// releaseLease gives up run k's lease for another replica to take the run
// over at once ([Store.Release]): a purge of the key, which every
// replica's [Store.WatchExpired] reports as it does an expiry's marker,
// that names this replica in its body. A claim that finds it the lease's
// last entry, its run's owner record naming the same replica, knows the
// owner gave the run up, and asks it nothing (see [leases.releasedByOwner]);
// the marker of an expiry names nobody. A replica of the version before
// reads it as the bucket's own purge.
func (l *leases) releaseLease(ctx context.Context, k runKey) error {
	_, err := l.pub.publishMsg(ctx, &nats.Msg{Subject: "$KV." + LeaseBucket + "." + k.lease(), Data: []byte(l.id), Header: nats.Header{
		kvOperation:         {"PURGE"},
		jetstream.MsgRollup: {jetstream.MsgRollupSubject},
	}})
	return err
}

// dropFileLeases deletes a lease bucket that an earlier version made in
// files, so that set-up makes it again in memory (JetStream does not
// change a stream's storage in place). Only the embedded store does it: it
// holds the directory's lock, so no other process uses the bucket.
//
// The embedded store keeps its lease bucket in memory even when the log is
// in files (store.dir); since its runs are held in the process (see
// [leases.local]) it writes nothing there, and the bucket is kept only for
// what reads it by name. A lease lives for a lease TTL and only the process
// that holds the directory's lock ever reads it, and the file store made
// each turn pay for it in the kernel: a turn's lease is written to the
// bucket's last block and purged at its end ([leases.dropLease]), and a
// purge that empties the last block removes its file and creates a new one
// (14–22% of the server's CPU per sequential turn: BENCHMARKS.md, issue
// #26). In memory the same purge frees a message. What a restart loses is
// only what no process could use any more: the leases and expiry markers
// of the process before, whose runs are found by adoption instead (a
// WatchTurn or re-attaching RunTurn that finds a run with no owner and no
// terminal event takes it over; a CancelTurn closes it).
func dropFileLeases(ctx context.Context, js jetstream.JetStream, logger *slog.Logger) error {
	st, err := js.Stream(ctx, "KV_"+LeaseBucket)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.CachedInfo().Config.Storage == jetstream.MemoryStorage {
		return nil
	}
	logger.Info("turn store: the lease bucket moves from files to memory", "bucket", LeaseBucket)
	return js.DeleteKeyValue(ctx, LeaseBucket)
}

// remakeLeases makes the lease bucket again: see [owners].
func (l *leases) remakeLeases(ctx context.Context) error {
	_, err := l.js.CreateOrUpdateKeyValue(ctx, l.kvCfg)
	return err
}

// writer returns this process's writer of the run (turnID, attempt): it
// fails with [ErrLost] when the process does not own the run, and with
// [ErrClosed] when the store closed.
func (l *leases) writer(turnID string, attempt uint32) (*writer, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.runs[runKey{turnID, attempt}]
	if w == nil && isClosed(l.closed) {
		// Closed: its runs were given up with it, not taken over.
		return nil, ErrClosed
	}
	if w == nil {
		return nil, fmt.Errorf("%w: run %q attempt %d", ErrLost, turnID, attempt)
	}
	return w, nil
}

// add records that this process owns run k, written by w; a claim of it
// under way ends.
func (l *leases) add(k runKey, w *writer) {
	l.mu.Lock()
	l.runs[k] = w
	delete(l.claiming, k)
	l.mu.Unlock()
}

// release ends this process's ownership of w's run, which w gave up
// ([Store.Finish], or with handOff [Store.Release]), and returns the
// run's first failure: its lease is dropped, or with handOff purged, for
// another replica to take the run over at once (see [leases.releaseLease]); with the embedded store,
// whose runs have no lease, a release is reported to WatchExpired.
func (l *leases) release(ctx context.Context, w *writer, handOff bool) error {
	l.mu.Lock()
	if l.runs[w.key] == w {
		delete(l.runs, w.key)
	}
	l.mu.Unlock()
	err := w.failure()
	if l.local {
		// No lease to drop (see [leases.local]): the run's entry is gone
		// from the map above. A release is reported to WatchExpired at
		// once, as its purge is.
		if handOff && !errors.Is(err, ErrLost) {
			l.expiries.expire(w.key)
		}
		return err
	}
	if err == nil || !errors.Is(err, ErrLost) {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.LeaseTTL)
		defer cancel()
		if handOff {
			if perr := l.releaseLease(dctx, w.key); perr != nil && err == nil {
				err = fmt.Errorf("store: release lease: %w", perr)
			}
		} else {
			_ = l.dropLease(dctx, w.key)
		}
	}
	return err
}

// takeAll ends this process's ownership of every run, as the store
// closes, and returns their writers.
func (l *leases) takeAll() map[runKey]*writer {
	l.mu.Lock()
	defer l.mu.Unlock()
	runs := l.runs
	l.runs = map[runKey]*writer{}
	return runs
}
