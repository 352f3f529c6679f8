package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Create opens the log of the run (turnID, attempt) with record as its
// first record, unless the run exists. When it creates the run, this
// replica owns it: it holds its lease, appends its events with [Store.Append],
// answers the signals sent to it with onSignal (called on its own
// goroutine; the reply of a signal sent with [Store.Signal] is its result),
// and must end with [Store.Finish]. When the run exists, Create returns its
// first record and created is false. Of concurrent Creates of one run, on
// any replicas, exactly one creates it.
//
// The record's publish is made again, as an append's is, when the stream
// could not take it for now and, with a NATS cluster, when it got no
// answer: it carries a message id of its own (this call's, not the run's:
// another replica's Create of the run is not a duplicate of this one), so
// an attempt stored after all is stored once and answered as such.
func (s *Store) Create(ctx context.Context, turnID string, attempt uint32, record []byte, onSignal func(signal string) []byte) (created bool, existing []byte, err error) {
	k := runKey{turnID, attempt}
	pctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	// Created only if the run has no owner record yet.
	// The record names this replica: signals to the run come to it.
	msg := &nats.Msg{Subject: k.own(), Data: record, Header: s.ownerRecord()}
	msg.Header[jetstream.ExpectedLastSubjSeqHeader] = []string{"0"}
	dedupe := s.cfg.Mode == ModeNATS
	var msgID string
	if dedupe {
		msgID = k.prefix() + ".create." + s.id + "." + newID()
		msg.Header[jetstream.MsgIDHeader] = []string{msgID}
	}
	ack, err := s.pub.publishRetried(pctx, msg, dedupe, s.pub.storedRecord(msg))
	if isWrongLastSeq(err) && dedupe {
		// A server that is not clustered checks the expectation before
		// the message id: a retry of a record stored after all is refused
		// as any later record is. The record tells whose it is.
		if seq, ok := s.ownRecord(pctx, k, msgID); ok {
			ack, err = &jetstream.PubAck{Sequence: seq}, nil
		}
	}
	if isWrongLastSeq(err) {
		existing, err := s.Record(ctx, turnID, attempt)
		if errors.Is(err, fs.ErrNotExist) {
			// Written and already expired: the run is not ours to redo.
			return false, nil, fmt.Errorf("store: run %q attempt %d exists but its record is gone: %w", turnID, attempt, err)
		}
		return false, existing, err
	}
	if err != nil {
		return false, nil, fmt.Errorf("store: create run: %w", err)
	}
	var lease jetstream.PubAckFuture
	if !s.leases.local {
		// The lease is written without waiting: the run starts at once,
		// and Finish waits for it before deleting it. The embedded store
		// holds its runs in the process instead (see [leases.local]).
		lease, err = s.pub.publishAsync(&nats.Msg{Subject: "$KV." + LeaseBucket + "." + k.lease(), Data: []byte(s.id)})
		if err != nil {
			return false, nil, fmt.Errorf("store: lease: %w", err)
		}
	}
	if err := s.own(ctx, k, ack.Sequence, 1, onSignal, lease, 0); err != nil {
		if lease != nil {
			s.pub.forgetAck(lease)
		}
		return false, nil, err
	}
	return true, nil, nil
}

// ownRecord reports whether the last owner record of run k is the one
// published with message id msgID, and its stream sequence.
func (s *Store) ownRecord(ctx context.Context, k runKey, msgID string) (uint64, bool) {
	m, err := s.stream.GetLastMsgForSubject(ctx, k.own())
	if err != nil || m.Header.Get(jetstream.MsgIDHeader) != msgID {
		return 0, false
	}
	return m.Sequence, true
}

// ErrNotClaimed is the failure of a Claim that another replica won, or of
// a run that needs no taking over.
var ErrNotClaimed = errors.New("store: the run was not claimed")

// Claim takes over the run (turnID, attempt) whose owner's lease expired:
// it takes the lease (one replica wins), fences the previous owner out of
// the log (its appends fail from then on), and returns the run's first
// record and every event stored, which no other replica can add to any
// more. Then this replica owns the run as if it had created it: Append,
// signals to onSignal, and Finish. It fails with [ErrNotClaimed] when
// another replica holds the lease, and with [fs.ErrNotExist] when the
// run's log is gone. claims counts the run's claims, this one's included:
// how many times its owner went away.
//
// A lease that expired is taken over only when its owner does not say it
// is renewing it (asked on a core NATS subject, which needs no stream
// leader): a claim of a run whose owner is alive waits until the owner has
// written its lease again, then fails with [ErrNotClaimed], or until the
// owner stops answering, then claims it. A lease its owner released
// ([Store.Release]) is taken without the question. A lease not expired yet
// whose holder is the run's owner and does not answer at all (it went
// away less than a lease TTL ago) is waited for, and taken when it
// expires. A claim that took the lease and fails because this replica
// stops gives it back so that the other replicas are told (see
// [handBack]).
//
// A claim is four round trips to NATS after one another when its owner
// released the run: its reads that need no lease, at once (the lease's
// last entry, the last owner record: see [Store.readForClaim]); the lease;
// the fence, with the run's first record read beside it; the log, in
// batches. Its number comes from the owner record it fences over
// ([claimHeader]), not from a count the stream is asked for. Of the
// replicas that claim a run at once, the ones that lose at the lease read
// neither the first record, which holds the run's request, nor the log.
//
// With the embedded store, whose runs have no lease (see [leases.local]),
// the claim is held in the process: it fails with [ErrNotClaimed] when
// this process owns the run or is claiming it already.
func (s *Store) Claim(ctx context.Context, turnID string, attempt uint32, onSignal func(signal string) []byte) (record []byte, events [][]byte, claims int, err error) {
	k := runKey{turnID, attempt}
	var leaseRev uint64
	var release func()
	if s.leases.local {
		// The embedded store: the claim is held in the process (see
		// [leases.local]).
		if err := s.leases.claimHere(k); err != nil {
			return nil, nil, 0, err
		}
		defer func() {
			if err != nil {
				s.leases.unclaim(k)
			}
		}()
	} else if err := s.leases.notMine(k); err != nil {
		return nil, nil, 0, err
	}
	// What needs no lease is read at once, before it: the owner record the
	// fence expects, the lease's last entry.
	reads, err := s.readForClaim(ctx, k)
	if err != nil {
		return nil, nil, 0, err
	}
	if !s.leases.local {
		if leaseRev, err = s.leases.claimLease(ctx, k, reads); err != nil {
			return nil, nil, 0, err
		}
		release = func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.LeaseTTL)
			defer cancel()
			if handBack(ctx, s.closed, err) {
				_ = s.leases.releaseLease(dctx, k)
			} else {
				_ = s.leases.dropLease(dctx, k)
			}
		}
	}
	fail := func(e error) ([]byte, [][]byte, int, error) {
		err = e
		if release != nil {
			release()
		}
		return nil, nil, 0, err
	}
	// The first record never changes: read while the fence is written.
	var first []byte
	var firstErr error
	var wg sync.WaitGroup
	wg.Go(func() { first, firstErr = s.readFirst(ctx, k) })
	ack, _, claims, err := s.fence(ctx, k, reads.last)
	wg.Wait()
	if err = cmp.Or(err, firstErr); err != nil {
		return fail(err)
	}
	if events, err = s.readAll(ctx, k); err != nil {
		return fail(err)
	}
	if err = s.own(ctx, k, ack.Sequence, uint64(len(events))+1, onSignal, nil, leaseRev); err != nil {
		return fail(err)
	}
	return first, events, claims, nil
}

// fence writes this replica's owner record of run k over last, the run's
// last owner record as read before the claim took the lease: appends
// expect it from then on, and the previous owner's fail. It returns the
// record's acknowledgement, the record it followed and the claim's number
// (see [Store.claimNumber]), which the record carries ([claimHeader]) with
// the name of this replica, to which signals go from then on.
//
// A record written between that read and the lease (another claim's,
// which held the lease before this one) is read again, once: the fence is
// then made over it, as a claim that read the record after taking the
// lease would have. A fence refused over a record that is still the last,
// or refused again, is [ErrNotClaimed]: another replica's fence came
// first, and the run is its.
func (s *Store) fence(ctx context.Context, k runKey, last *jetstream.RawStreamMsg) (*jetstream.PubAck, *jetstream.RawStreamMsg, int, error) {
	for reread := false; ; reread = true {
		n, err := s.claimNumber(ctx, k, last)
		if err != nil {
			return nil, nil, 0, err
		}
		ack, err := s.fenceOver(ctx, k, last, n)
		if !isWrongLastSeq(err) {
			if err != nil {
				return nil, nil, 0, fmt.Errorf("store: claim: %w", err)
			}
			return ack, last, n, nil
		}
		if reread {
			return nil, nil, 0, ErrNotClaimed
		}
		now, err := s.stream.GetLastMsgForSubject(ctx, k.own())
		if err != nil {
			return nil, nil, 0, fmt.Errorf("store: claim: %w", err)
		}
		if now.Sequence == last.Sequence {
			return nil, nil, 0, ErrNotClaimed
		}
		last = now
	}
}

// fenceOver is one attempt of [Store.fence] over owner record last, as
// claim n. A replicated stream refuses it while an append of the old
// owner, which expects the same record, is in flight: it is made again
// shortly.
func (s *Store) fenceOver(ctx context.Context, k runKey, last *jetstream.RawStreamMsg, n int) (*jetstream.PubAck, error) {
	h := s.ownerRecord()
	h.Set(claimHeader, strconv.Itoa(n))
	publish := func() (*jetstream.PubAck, error) {
		m := &nats.Msg{Subject: k.own(), Data: []byte("claimed by " + s.id), Header: h}
		return s.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(last.Sequence))
	}
	ack, err := publish()
	for try := 0; try < 20 && isInFlightConflict(err); try++ {
		time.Sleep(25 * time.Millisecond)
		ack, err = publish()
	}
	return ack, err
}

// handBack reports whether a claim that took run k's lease and then
// failed with err (closed is the store's) gives the lease back so that every replica is told
// ([leases.releaseLease], reported by [Store.WatchExpired]), not silently
// ([leases.dropLease]). A claim that took the lease is the one of all the
// replicas told of the run that won it: the others gave up, and with a
// silent tombstone nobody would try again until a client watched the run.
// So a claim that fails because this replica stops (ctx ended, the store
// closes) or because a request went unanswered hands the run back; one
// that fails because of the run itself (its log is gone, another
// replica's fence came first, a frame does not read) does not, or every
// replica would fail it again, in turn, without end.
func handBack(ctx context.Context, closed <-chan struct{}, err error) bool {
	return ctx.Err() != nil || isClosed(closed) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, ErrClosed) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected)
}

// notMine fails with [ErrNotClaimed] when this process owns run k and
// has not given it up (mode nats): its lease expired because a renewal
// came late (a loaded process), not because its owner stopped. Claiming
// it would only fence this replica's own turn out of its log.
func (l *leases) notMine(k runKey) error {
	l.mu.Lock()
	_, mine := l.runs[k]
	l.mu.Unlock()
	if mine {
		return fmt.Errorf("%w: this replica owns it", ErrNotClaimed)
	}
	return nil
}

// claimLease takes the lease of run k for a claim (mode nats), reads
// being what the claim read of it before, and returns its revision: see
// [Store.Claim].
func (l *leases) claimLease(ctx context.Context, k runKey, reads claimReads) (uint64, error) {
	// An expired lease is no proof that its owner stopped: a bucket whose
	// leader was lost for longer than the lease TTL expires the leases of
	// live owners too. An owner that says it is renewing keeps the run: it
	// writes its lease again once the bucket answers. An owner that
	// released the lease gave the run up: it is not asked.
	released := reads.released()
	for waited := false; released == 0 && l.ownerRenewing(ctx, k); waited = true {
		if !waited {
			l.logger.Info("turn store: a lease expired under a live owner (the bucket was without a leader?); the run is left to it",
				"turn_id", k.turnID, "attempt", k.attempt)
		}
		if err := l.waitHalfTTL(ctx); err != nil {
			return 0, err
		}
		if _, err := l.kv.Get(ctx, k.lease()); err == nil {
			return 0, fmt.Errorf("%w: its owner is alive and renewed its lease", ErrNotClaimed)
		}
	}
	if released != 0 {
		// Written over the release itself: one request where Create makes
		// three (its write, refused over the release, the key's read, and
		// its write over what it read). Another claim's came first when it
		// is refused.
		leaseRev, err := l.kv.Update(ctx, k.lease(), []byte(l.id), released)
		if isWrongLastSeq(err) {
			return 0, ErrNotClaimed
		}
		if err != nil {
			return 0, fmt.Errorf("store: claim lease: %w", err)
		}
		return leaseRev, nil
	}
	leaseRev, err := l.kv.Create(ctx, k.lease(), []byte(l.id))
	// A lease its owner still holds although it is gone (it died less
	// than a lease TTL ago, or its last renewal wrote the lease again as
	// it stopped) expires within a lease TTL: the claim waits for that,
	// rather than fail with nobody told when it does.
	for tries := 0; errors.Is(err, jetstream.ErrKeyExists) && tries < 3 && l.heldByGoneOwner(ctx, k); tries++ {
		if err := l.waitHalfTTL(ctx); err != nil {
			return 0, err
		}
		leaseRev, err = l.kv.Create(ctx, k.lease(), []byte(l.id))
	}
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return 0, ErrNotClaimed
		}
		return 0, fmt.Errorf("store: claim lease: %w", err)
	}
	return leaseRev, nil
}

// waitHalfTTL waits half a lease TTL between two looks of a claim at a
// lease, or fails with [ErrNotClaimed] when ctx ends or the store closes
// first.
func (l *leases) waitHalfTTL(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrNotClaimed, ctx.Err())
	case <-l.closed:
		return fmt.Errorf("%w: %w", ErrNotClaimed, ErrClosed)
	case <-time.After(l.cfg.LeaseTTL / 2):
		return nil
	}
}

// heldByGoneOwner reports whether run k's lease is held by the replica
// its last owner record names, and that replica does not answer at all
// (NATS says it has no responders, or nothing answers in time): the lease
// of an owner that went away. A replica that answers is alive: an owner
// that says it renews or that its renewal stopped, or a claimer that won
// the lease and fenced the run but does not own it yet ("no owner").
func (l *leases) heldByGoneOwner(ctx context.Context, k runKey) bool {
	ctx, cancel := context.WithTimeout(ctx, min(l.cfg.LeaseTTL, time.Second))
	defer cancel()
	e, err := l.kv.Get(ctx, k.lease())
	if err != nil {
		return false
	}
	name, err := owner(ctx, l.stream, k)
	if err != nil || name == "" || name != string(e.Value()) {
		return false
	}
	_, err = l.nc.RequestWithContext(ctx, k.aliveAt(name), nil)
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}

// claimNumber returns the number of the claim of run k whose fence
// follows owner record last: from last itself (see [claimNumber]), or,
// when a replica of the version before wrote it, from the stream's count
// of the run's owner records, which last is the last of (else the fence
// fails).
func (s *Store) claimNumber(ctx context.Context, k runKey, last *jetstream.RawStreamMsg) (int, error) {
	if n, ok := claimNumber(last); ok {
		return n, nil
	}
	info, err := s.stream.Info(ctx, jetstream.WithSubjectFilter(k.own()))
	if err != nil {
		return 0, fmt.Errorf("store: claim: %w", err)
	}
	return int(info.State.Subjects[k.own()]), nil
}

// readAll returns every event of run k stored now, for a claim: its
// frames' events in order, read in batches whose messages come without
// headers (see [directBatchOf]). A claim reads the whole log, whose events
// follow one another frame after frame (each owner numbers its events
// from the last one stored, and a fenced owner's frames are refused), so
// the index of a frame's first event, in its header, is not needed; the
// next batch begins after the last stream sequence the batch's end names.
// The headers were most of what the server wrote and the claimer parsed
// for each frame: ten of them, six written one at a time by the server
// (BENCHMARKS.md, issue 37, row 4). A batch without headers costs one
// more request, answered "no message": the NATS server (v2.15.2) counts
// down the messages pending only for batches with headers, so a batch's
// end says more are pending where none are; a frame is never missed.
func (s *Store) readAll(ctx context.Context, k runKey) ([][]byte, error) {
	var out [][]byte
	var after uint64
	for {
		b, err := held(s.keeper, ctx, func(ctx context.Context) (directRead, error) {
			return directBatchOf(ctx, s.closed, s.nc, s.stream, k.events(), after+1, true)
		})
		if err != nil {
			return nil, fmt.Errorf("store: read run: %w", err)
		}
		for _, m := range b.msgs {
			events, err := splitFrame(m.Data)
			if err != nil {
				return nil, err
			}
			out = append(out, events...)
		}
		if !b.more {
			return out, nil
		}
		if b.last <= after {
			return nil, errors.New("store: read run: a batch's end without its last stream sequence")
		}
		after = b.last
	}
}

// own makes this replica the owner of run k, whose appends expect the
// owner record at ownSeq; the caller holds the lease, written at revision
// leaseRev or by the pending publish lease.
func (s *Store) own(ctx context.Context, k runKey, ownSeq, next uint64, onSignal func(signal string) []byte, lease jetstream.PubAckFuture, leaseRev uint64) error {
	w := &writer{s: s, key: k, evSubject: k.events(), ownSubject: k.own(), ownSeq: ownSeq, next: next, sent: make(chan struct{}), stop: make(chan struct{}), onSignal: onSignal, lease: lease, leaseRev: leaseRev}
	w.room = sync.NewCond(&w.mu)
	w.send = w.sender
	w.beat()
	s.inbox.listen(w)
	if !s.leases.local {
		// The embedded store's runs have no lease (see [leases.local]).
		w.renew.Add(1)
		w.renewLoop()
	}
	s.leases.add(k, w)
	return nil
}
