package store

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoOwner is the failure of a watch whose run stopped receiving events
// and has no live owner: the replica that ran it went away.
var ErrNoOwner = errors.New("store: the run has no live owner and no terminal event")

// ErrLost is the failure of appends to a run this replica no longer owns.
var ErrLost = errors.New("store: this replica no longer owns the run")

// ErrClosed is the failure of appends pending when the store closed.
var ErrClosed = errors.New("store: closed")

// runKey names one run: a turn id and an attempt.
type runKey struct {
	turnID  string
	attempt uint32
}

// token encodes the turn id as one subject token: any UTF-8 id maps to
// letters, digits, '-' and '_', without collisions.
func (k runKey) token() string { return base64.RawURLEncoding.EncodeToString([]byte(k.turnID)) }

func (k runKey) prefix() string {
	return subjectRoot + "." + k.token() + "." + strconv.FormatUint(uint64(k.attempt), 10)
}

// own is the subject of the run's owner records; the first holds its
// request.
func (k runKey) own() string { return k.prefix() + ".own" }

// events is the subject of the run's events.
func (k runKey) events() string { return k.prefix() + ".ev" }

// control is the core NATS subject on which the run's owner listens.
func (k runKey) control() string {
	return controlRoot + "." + k.token() + "." + strconv.FormatUint(uint64(k.attempt), 10)
}

// lease is the run's key in the lease bucket.
func (k runKey) lease() string { return k.token() + "." + strconv.FormatUint(uint64(k.attempt), 10) }

// writer is this replica's hold on a run it owns. Its events are stored
// by group commit: one message, a frame of every event appended since the
// last one was sent, is in flight at a time, under the owner fence; the
// next frame goes as soon as it is acknowledged. A burst of events costs
// one round trip per frame, not per event, and the fence holds on
// replicated streams, which take one expectation per subject at a time.
type writer struct {
	s      *Store
	key    runKey
	ownSeq uint64 // the stream sequence of the owner record appends expect
	next   uint64 // the index (seq) of the next event the run stores, from 1
	sub    *nats.Subscription
	stop   chan struct{} // ends the lease renewal
	renew  sync.WaitGroup
	sent   chan struct{} // closed when the sender has sent everything and ended

	onSignal func(signal string) []byte
	// lease is the first write of the lease, when not waited for: its
	// acknowledgement gives leaseRev. The renewal takes it (and sets it to
	// nil); Finish waits for it when the renewal had not.
	lease jetstream.PubAckFuture
	// leaseRev is the lease's revision this replica wrote last, 0 when
	// not known: the renewal updates the lease against it. Only the
	// renewal goroutine uses it once started.
	leaseRev uint64

	mu      sync.Mutex
	queued  []pending     // appended, not yet sent
	kick    chan struct{} // wakes the sender; buffered, 1
	room    *sync.Cond    // signalled when the queue shrinks
	closing bool          // Finish was called: send what is queued, then end
	err     error         // the first failure; every later append fails with it
}

type pending struct {
	event []byte
	done  func(error)
}

// firstHeader is the header of a frame that holds the index (the seq) of
// its first event, so a frame read on its own is placed in the run.
const firstHeader = "Turnstile-First-Event"

// maxFrame bounds the bytes of one frame; an event larger than that goes
// alone.
const maxFrame = 256 << 10

// SignalLost is the signal a run's owner receives, from its own store,
// when it finds that another replica took the run over: it must stop the
// run, whose appends fail from then on.
const SignalLost = "lost"

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
	opts := []jetstream.PublishOpt{jetstream.WithExpectLastSequencePerSubject(0)}
	dedupe := s.cfg.Mode == ModeNATS
	var msgID string
	if dedupe {
		msgID = k.prefix() + ".create." + s.id + "." + newID()
		opts = append(opts, jetstream.WithMsgID(msgID))
	}
	ack, err := s.publishRetried(pctx, &nats.Msg{Subject: k.own(), Data: record}, dedupe, opts...)
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
	// The lease is written without waiting: the run starts at once, and
	// Finish waits for it before deleting it.
	lease, err := s.js.PublishAsync("$KV."+LeaseBucket+"."+k.lease(), []byte(s.id))
	if err != nil {
		return false, nil, fmt.Errorf("store: lease: %w", err)
	}
	if err := s.own(ctx, k, ack.Sequence, 1, onSignal, lease, 0); err != nil {
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
// run's log is gone.
func (s *Store) Claim(ctx context.Context, turnID string, attempt uint32, onSignal func(signal string) []byte) (record []byte, events [][]byte, err error) {
	k := runKey{turnID, attempt}
	leaseRev, err := s.leases.Create(ctx, k.lease(), []byte(s.id))
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, nil, ErrNotClaimed
		}
		return nil, nil, fmt.Errorf("store: claim lease: %w", err)
	}
	release := func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.LeaseTTL)
		defer cancel()
		_ = s.dropLease(dctx, k)
	}
	last, err := s.stream.GetLastMsgForSubject(ctx, k.own())
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		release()
		return nil, nil, fmt.Errorf("store: run %q attempt %d: %w", turnID, attempt, fs.ErrNotExist)
	}
	if err != nil {
		release()
		return nil, nil, fmt.Errorf("store: claim: %w", err)
	}
	// The fence: appends expect the last owner record, which is now ours.
	// A replicated stream refuses it while an append of the old owner,
	// which expects the same record, is in flight: try again shortly.
	ack, err := s.js.Publish(ctx, k.own(), []byte("claimed by "+s.id), jetstream.WithExpectLastSequencePerSubject(last.Sequence))
	for try := 0; try < 20 && isInFlightConflict(err); try++ {
		time.Sleep(25 * time.Millisecond)
		ack, err = s.js.Publish(ctx, k.own(), []byte("claimed by "+s.id), jetstream.WithExpectLastSequencePerSubject(last.Sequence))
	}
	if isWrongLastSeq(err) {
		release()
		return nil, nil, ErrNotClaimed
	}
	if err != nil {
		release()
		return nil, nil, fmt.Errorf("store: claim: %w", err)
	}
	if record, err = s.Record(ctx, turnID, attempt); err == nil {
		events, err = s.readAll(ctx, k)
	}
	if err != nil {
		release()
		return nil, nil, err
	}
	if err := s.own(ctx, k, ack.Sequence, uint64(len(events))+1, onSignal, nil, leaseRev); err != nil {
		release()
		return nil, nil, err
	}
	return record, events, nil
}

// readAll returns every event of run k stored now.
func (s *Store) readAll(ctx context.Context, k runKey) ([][]byte, error) {
	var out [][]byte
	_, err := s.readFrames(ctx, k, 0, func(first uint64, events [][]byte) bool {
		out = append(out, events...)
		return true
	})
	return out, err
}

// readFrames calls fn with each frame of run k stored after the stream
// sequence after, in order, with the index of its first event, until fn
// returns false or no frame is left; it returns the stream sequence of the
// last frame read (after, when none). A frame is one direct get, served by
// any replica of the stream: no consumer is made.
func (s *Store) readFrames(ctx context.Context, k runKey, after uint64, fn func(first uint64, events [][]byte) bool) (uint64, error) {
	for {
		m, err := s.stream.GetMsg(ctx, after+1, jetstream.WithGetMsgSubject(k.events()))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return after, nil
		}
		if err != nil {
			return after, fmt.Errorf("store: read run: %w", err)
		}
		after = m.Sequence
		first, events, err := decodeFrame(m.Header, m.Data)
		if err != nil {
			return after, err
		}
		if !fn(first, events) {
			return after, nil
		}
	}
}

// decodeFrame returns the index of a frame's first event and its events.
func decodeFrame(h nats.Header, data []byte) (uint64, [][]byte, error) {
	first, err := strconv.ParseUint(h.Get(firstHeader), 10, 64)
	if err != nil || first == 0 {
		return 0, nil, errors.New("store: a frame of the log has no first event index")
	}
	events, err := splitFrame(data)
	return first, events, err
}

// WatchExpired calls fn, on its own goroutine, with each run whose lease
// expired without its owner giving it up, or that its owner released
// ([Store.Release]), until ctx is done: the runs to take over. It
// includes the runs whose lease expired within the last ten minutes
// before the call.
func (s *Store) WatchExpired(ctx context.Context, fn func(turnID string, attempt uint32)) error {
	return s.watchBucket(ctx, s.leases, func(e jetstream.KeyValueEntry) {
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

// watchBucket calls fn with the latest entry of each of kv's keys, then
// with each new one, until ctx is done or the store closes. A watch that
// ends on its own (the client library gives up its consumer, as it may
// after failed resets in a cluster) is made again, after a pause that
// grows to rewatchMax, and delivers the latest entries again: fn must take
// an entry twice. Only a first watch that cannot be made is an error.
func (s *Store) watchBucket(ctx context.Context, kv jetstream.KeyValue, fn func(jetstream.KeyValueEntry)) error {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("store: watch %s: %w", kv.Bucket(), err)
	}
	pause := rewatchMin
	for {
		if err == nil && s.follow(ctx, w, fn) {
			return nil
		}
		if err == nil {
			s.logger.Warn("turn store: a bucket's watch ended; watching it again", "bucket", kv.Bucket())
		} else {
			s.logger.Warn("turn store: cannot watch a bucket again", "bucket", kv.Bucket(), "error", err, "retry_in", pause)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.closed:
			return nil
		case <-time.After(pause):
		}
		pause = min(2*pause, rewatchMax)
		if w, err = kv.WatchAll(ctx); err == nil {
			pause = rewatchMin
		}
	}
}

// The pauses before a bucket is watched again (see watchBucket).
const (
	rewatchMin = 100 * time.Millisecond
	rewatchMax = 5 * time.Second
)

// follow passes w's entries to fn until ctx is done or the store closes
// (it reports true), or w ends on its own (false). It stops w.
func (s *Store) follow(ctx context.Context, w jetstream.KeyWatcher, fn func(jetstream.KeyValueEntry)) (done bool) {
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return true
		case <-s.closed:
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

// own makes this replica the owner of run k, whose appends expect the
// owner record at ownSeq; the caller holds the lease, written at revision
// leaseRev or by the pending publish lease.
func (s *Store) own(ctx context.Context, k runKey, ownSeq, next uint64, onSignal func(signal string) []byte, lease jetstream.PubAckFuture, leaseRev uint64) error {
	w := &writer{s: s, key: k, ownSeq: ownSeq, next: next, sent: make(chan struct{}), stop: make(chan struct{}), onSignal: onSignal, kick: make(chan struct{}, 1), lease: lease, leaseRev: leaseRev}
	w.room = sync.NewCond(&w.mu)
	var err error
	w.sub, err = s.nc.Subscribe(k.control(), func(m *nats.Msg) {
		reply := onSignal(string(m.Data))
		if m.Reply != "" {
			_ = m.Respond(reply)
		}
	})
	if err != nil {
		return fmt.Errorf("store: control subscription: %w", err)
	}
	go w.sender()
	w.renew.Add(1)
	go w.renewLoop()
	s.mu.Lock()
	s.runs[k] = w
	s.mu.Unlock()
	return nil
}

// isInFlightConflict reports whether a replicated stream refused an
// expectation because another message with one on the same subject is in
// flight.
func isInFlightConflict(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// sender sends the queued events as frames, one in flight at a time,
// and reports each event's outcome in order, until Finish or the store's
// end.
func (w *writer) sender() {
	defer close(w.sent)
	for {
		w.mu.Lock()
		for len(w.queued) == 0 && !w.closing {
			w.mu.Unlock()
			select {
			case <-w.kick:
			case <-w.s.closed:
				w.abandon(ErrClosed)
				return
			}
			w.mu.Lock()
		}
		if len(w.queued) == 0 {
			w.mu.Unlock()
			return
		}
		batch, frame := takeFrame(w.queued)
		w.queued = w.queued[len(batch):]
		failed := w.err
		w.room.Broadcast()
		w.mu.Unlock()

		err := failed
		if err == nil {
			err = w.publish(frame)
		}
		if err == nil {
			w.next += uint64(len(batch))
		}
		if err != nil {
			w.fail(err)
		}
		for _, p := range batch {
			p.done(err)
		}
	}
}

// takeFrame takes the events at the head of q that fit one frame (at
// least one) and encodes them: each as a uvarint length and its bytes.
func takeFrame(q []pending) ([]pending, []byte) {
	n, size := 0, 0
	for n < len(q) && (n == 0 || size+len(q[n].event)+binary.MaxVarintLen64 <= maxFrame) {
		size += len(q[n].event) + binary.MaxVarintLen64
		n++
	}
	frame := make([]byte, 0, size)
	for _, p := range q[:n] {
		frame = binary.AppendUvarint(frame, uint64(len(p.event)))
		frame = append(frame, p.event...)
	}
	return q[:n], frame
}

// splitFrame returns the events of a frame.
func splitFrame(frame []byte) ([][]byte, error) {
	var out [][]byte
	for len(frame) > 0 {
		n, k := binary.Uvarint(frame)
		if k <= 0 || uint64(len(frame)-k) < n {
			return nil, errors.New("store: a corrupt frame in the log")
		}
		out = append(out, frame[k:k+int(n)])
		frame = frame[k+int(n):]
	}
	return out, nil
}

// Bounds of storing one frame: how long an attempt waits for its
// acknowledgement, and how long all of them may take.
const (
	publishTry     = 500 * time.Millisecond
	publishTimeout = 10 * time.Second
	publishBackoff = 50 * time.Millisecond
	// duplicateWindow is how long the stream remembers the message ids
	// of frames: longer than a frame's attempts take.
	duplicateWindow = publishTimeout + 5*time.Second
)

// publish stores one frame under the owner fence and waits for the
// acknowledgement. An attempt the stream refused for now (no responders,
// JetStream temporarily unavailable, a new leader catching up) is made
// again. With a NATS cluster (mode nats), so is one that got no answer
// (the stream's leader or the server this replica is connected to went
// away mid-request): the frame carries a message id, so a frame whose
// first attempt was stored after all is stored once (JetStream's duplicate
// window, [duplicateWindow]). The embedded server, in-process, fails over
// to nothing: its frames carry no id, which would cost its memory a
// duplicate window's worth of ids.
func (w *writer) publish(frame []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	done := make(chan struct{})
	go func() {
		select {
		case <-w.s.closed:
			cancel()
		case <-done:
		}
	}()
	defer close(done)
	msg := &nats.Msg{Subject: w.key.events(), Data: frame, Header: nats.Header{}}
	msg.Header.Set(firstHeader, strconv.FormatUint(w.next, 10))
	opts := []jetstream.PublishOpt{jetstream.WithExpectLastSequenceForSubject(w.ownSeq, w.key.own())}
	dedupe := w.s.cfg.Mode == ModeNATS
	if dedupe {
		// One id per frame of one owner: a retry is the same frame; a new
		// owner's frames are others.
		opts = append(opts, jetstream.WithMsgID(w.key.prefix()+"."+strconv.FormatUint(w.ownSeq, 10)+"."+strconv.FormatUint(w.next, 10)))
	}
	_, err := w.s.publishRetried(ctx, msg, dedupe, opts...)
	switch {
	case err == nil:
		return nil
	case isWrongLastSeq(err):
		return fmt.Errorf("%w: %w", ErrLost, err)
	case w.s.isClosed():
		return ErrClosed
	}
	return fmt.Errorf("store: append: %w", err)
}

// publishRetried publishes msg and returns its acknowledgement. An attempt
// that [mayPass] is made again after a short pause, each waiting
// publishTry for its answer, all within ctx and until the store closes;
// dedupe says that msg carries a message id, so one that got no answer
// may be made again too. It returns the last attempt's failure.
func (s *Store) publishRetried(ctx context.Context, msg *nats.Msg, dedupe bool, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	for {
		tctx, tcancel := context.WithTimeout(ctx, publishTry)
		ack, err := s.js.PublishMsg(tctx, msg, opts...)
		tcancel()
		if err == nil || isWrongLastSeq(err) || s.isClosed() || ctx.Err() != nil || !mayPass(err, dedupe) {
			return ack, err
		}
		s.logger.Debug("turn store: publish retried", "subject", msg.Subject, "error", err)
		select {
		case <-ctx.Done():
			return nil, err
		case <-s.closed:
			return nil, err
		case <-time.After(publishBackoff):
		}
	}
}

// mayPass reports whether a failed publish may be made again: the stream
// could not take it for now, or, when a retry is deduplicated (answered),
// it got no answer.
func mayPass(err error, answered bool) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		// JetStream temporarily unavailable; this frame's earlier attempt
		// still in process; the subject's last sequence not known yet (a
		// new leader catching up).
		case 10008, 10158, 10163:
			return true
		}
		return false
	}
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) {
		return true // nothing took it
	}
	return answered && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected))
}

// abandon fails every queued event with err: the store closed.
func (w *writer) abandon(err error) {
	w.mu.Lock()
	q := w.queued
	w.queued = nil
	if w.err == nil {
		w.err = err
	}
	w.room.Broadcast()
	w.mu.Unlock()
	for _, p := range q {
		p.done(err)
	}
}

// renewLoop renews the run's lease three times per lease TTL until the
// run ends. A renewal is one update of the lease against the revision this
// replica wrote last; only when that is refused (another write came
// between: another replica's claim, or the lease expired during a long
// pause) or its outcome is unknown does the renewal read the lease: an
// expired lease is taken again unless another replica holds it, and a
// lease another replica holds means the run is lost.
func (w *writer) renewLoop() {
	defer w.renew.Done()
	t := time.NewTicker(w.s.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-w.s.closed:
			return
		case <-t.C:
		}
		if !w.renewOnce() {
			return
		}
	}
}

// renewOnce renews the lease once; it reports false when the run is lost.
func (w *writer) renewOnce() bool {
	s := w.s
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.LeaseTTL)
	defer cancel()
	if w.lease != nil {
		// The first write's revision; its acknowledgement came long ago.
		select {
		case ack := <-w.lease.Ok():
			w.leaseRev = ack.Sequence
		case <-w.lease.Err():
		case <-ctx.Done():
		}
		w.lease = nil
	}
	var err error
	if w.leaseRev != 0 {
		var rev uint64
		rev, err = s.leases.Update(ctx, w.key.lease(), []byte(s.id), w.leaseRev)
		if err == nil {
			w.leaseRev = rev
			return true
		}
		// Refused: somebody else wrote it. Unknown (no answer): it may
		// have been written; either way the next revision is read.
		w.leaseRev = 0
		if !isWrongLastSeq(err) {
			s.logger.Warn("turn lease not renewed", "turn_id", w.key.turnID, "attempt", w.key.attempt, "error", err)
			return true
		}
	}
	e, err := s.leases.Get(ctx, w.key.lease())
	switch {
	case err == nil && string(e.Value()) == s.id:
		w.leaseRev, err = s.leases.Update(ctx, w.key.lease(), []byte(s.id), e.Revision())
	case errors.Is(err, jetstream.ErrKeyNotFound):
		w.leaseRev, err = s.leases.Create(ctx, w.key.lease(), []byte(s.id))
	case err == nil:
		err = fmt.Errorf("%w: replica %s holds its lease", ErrLost, e.Value())
		w.fail(err)
		go w.onSignal(SignalLost)
		return false
	}
	if err != nil {
		s.logger.Warn("turn lease not renewed", "turn_id", w.key.turnID, "attempt", w.key.attempt, "error", err)
	}
	return true
}

func (w *writer) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
}

func (w *writer) failure() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (s *Store) writer(turnID string, attempt uint32) (*writer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.runs[runKey{turnID, attempt}]
	if w == nil {
		return nil, fmt.Errorf("%w: run %q attempt %d", ErrLost, turnID, attempt)
	}
	return w, nil
}

// Append appends event to the log of a run this replica owns, without
// waiting for the store's acknowledgement: done is called with nil once
// the event is stored, or with the failure, for each append in order, on
// one goroutine. Events appended while a frame is in flight go together in
// the next one. Append waits only while 256 events of the run are queued,
// and fails at once when an earlier one failed. Appends of one run must
// not be concurrent.
func (s *Store) Append(ctx context.Context, turnID string, attempt uint32, event []byte, done func(error)) error {
	w, err := s.writer(turnID, attempt)
	if err != nil {
		return err
	}
	w.mu.Lock()
	for len(w.queued) >= maxInFlight && w.err == nil && ctx.Err() == nil {
		w.room.Wait()
	}
	if err := w.err; err != nil {
		w.mu.Unlock()
		return err
	}
	if err := ctx.Err(); err != nil {
		w.mu.Unlock()
		return err
	}
	w.queued = append(w.queued, pending{event: event, done: done})
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
	return nil
}

// Finish waits until every append of the run is acknowledged (or ctx is
// done), then gives the run up: its lease is deleted and signals are no
// longer answered. It returns the first failure of the run's appends.
func (s *Store) Finish(ctx context.Context, turnID string, attempt uint32) error {
	return s.giveUp(ctx, turnID, attempt, false)
}

// Release gives up a run this replica owns that has not ended, for another
// replica to take over at once (this one is shutting down): it waits until
// every append is acknowledged, as Finish does, then purges the run's
// lease, which every replica's [Store.WatchExpired] reports as it does an
// expired one, so none waits for the lease TTL. The run's appends must have
// stopped.
func (s *Store) Release(ctx context.Context, turnID string, attempt uint32) error {
	return s.giveUp(ctx, turnID, attempt, true)
}

func (s *Store) giveUp(ctx context.Context, turnID string, attempt uint32, handOff bool) error {
	w, err := s.writer(turnID, attempt)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.closing = true
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
	select {
	case <-w.sent:
	case <-ctx.Done():
		w.fail(ctx.Err())
	}
	close(w.stop)
	w.renew.Wait()
	if w.lease != nil {
		select {
		case <-w.lease.Ok():
		case <-w.lease.Err():
		case <-ctx.Done():
		case <-s.closed:
		}
	}
	_ = w.sub.Unsubscribe()
	s.mu.Lock()
	delete(s.runs, w.key)
	s.mu.Unlock()
	err = w.failure()
	if err == nil || !errors.Is(err, ErrLost) {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.LeaseTTL)
		defer cancel()
		if handOff {
			if perr := s.leases.Purge(dctx, w.key.lease()); perr != nil && err == nil {
				err = fmt.Errorf("store: release lease: %w", perr)
			}
		} else {
			_ = s.dropLease(dctx, w.key)
		}
	}
	return err
}

// dropLease gives up run k's lease without a word to the other replicas:
// it purges the lease's subject from the bucket's stream, which removes
// every entry of the key and leaves no tombstone. A tombstone (the bucket's
// Delete) would age out of the bucket like any entry, and the marker the
// server then places reads to every replica's [Store.WatchExpired] as an
// expired lease: each would claim the run, find it ended, and give its
// lease up again, which leaves a new tombstone — a churn that never ends,
// for every run ever finished.
func (s *Store) dropLease(ctx context.Context, k runKey) error {
	return s.leaseLog.Purge(ctx, jetstream.WithPurgeSubject("$KV."+LeaseBucket+"."+k.lease()))
}

// Record returns the first record of the run (turnID, attempt): the one
// Create stored. It fails with [fs.ErrNotExist] when the store holds no
// such run.
func (s *Store) Record(ctx context.Context, turnID string, attempt uint32) ([]byte, error) {
	k := runKey{turnID, attempt}
	m, err := s.stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(k.own()))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("store: run %q attempt %d: %w", turnID, attempt, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("store: read run: %w", err)
	}
	return m.Data, nil
}

// LatestAttempt returns the highest attempt of turnID the store holds, or
// [fs.ErrNotExist].
func (s *Store) LatestAttempt(ctx context.Context, turnID string) (uint32, error) {
	k := runKey{turnID: turnID}
	filter := subjectRoot + "." + k.token() + ".*.own"
	info, err := s.stream.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return 0, fmt.Errorf("store: list attempts: %w", err)
	}
	var latest uint64
	for subj := range info.State.Subjects {
		parts := strings.Split(subj, ".")
		if len(parts) < 2 {
			continue
		}
		if n, err := strconv.ParseUint(parts[len(parts)-2], 10, 32); err == nil && n > latest {
			latest = n
		}
	}
	if latest == 0 {
		return 0, fmt.Errorf("store: turn %q: %w", turnID, fs.ErrNotExist)
	}
	return uint32(latest), nil
}

// Events returns the events of the run (turnID, attempt) after the first
// afterSeq ones, in order: the stored ones, then each one as it is
// stored. The sequence never ends by itself while the run has an owner:
// the caller stops when it has seen the run's last event. When no event
// arrives for a lease TTL and the run has no live owner, it yields
// [ErrNoOwner]; a failure of the store or ctx's end is yielded too, last.
//
// It holds no JetStream consumer: stored frames are read by direct gets,
// and live ones arrive on a core NATS subscription to the run's subject,
// made first; a frame missed there (a slow reader) is read from the store.
func (s *Store) Events(ctx context.Context, turnID string, attempt uint32, afterSeq uint64) iter.Seq2[[]byte, error] {
	return func(yield func([]byte, error) bool) {
		k := runKey{turnID, attempt}
		live := make(chan *nats.Msg, 256)
		sub, err := s.nc.ChanSubscribe(k.events(), live)
		if err != nil {
			yield(nil, fmt.Errorf("store: watch run: %w", err))
			return
		}
		defer func() { _ = sub.Unsubscribe() }()
		next := afterSeq + 1 // the index of the next event to yield
		stopped := false
		// deliver yields the events of a frame that are due; it reports
		// whether the frame left a gap before them.
		deliver := func(first uint64, events [][]byte) (gap bool) {
			if first > next {
				return true
			}
			for i, ev := range events {
				if first+uint64(i) < next {
					continue
				}
				if !yield(ev, nil) {
					stopped = true
					return false
				}
				next++
			}
			return false
		}
		var read uint64 // the stream sequence of the last frame read
		catchUp := func() error {
			var err error
			read, err = s.readFrames(ctx, k, read, func(first uint64, events [][]byte) bool {
				deliver(first, events)
				return !stopped
			})
			return err
		}
		if err := catchUp(); err != nil {
			yield(nil, err)
			return
		}
		quiet := time.NewTimer(s.cfg.LeaseTTL)
		defer quiet.Stop()
		for !stopped {
			select {
			case m := <-live:
				first, events, err := decodeFrame(m.Header, m.Data)
				if err != nil {
					yield(nil, err)
					return
				}
				if deliver(first, events) {
					// Missed frames: the store has them, this one included.
					if err := catchUp(); err != nil {
						yield(nil, err)
						return
					}
				}
				quiet.Reset(s.cfg.LeaseTTL)
			case <-quiet.C:
				gone, err := s.ownerGone(ctx, k, next-1)
				if err == nil && gone {
					// One more look: events stored since the last frame seen.
					before := next
					if err = catchUp(); err == nil && next == before {
						err = ErrNoOwner
					}
				}
				if err != nil {
					if !stopped {
						yield(nil, err)
					}
					return
				}
				quiet.Reset(s.cfg.LeaseTTL)
			case <-ctx.Done():
				yield(nil, ctx.Err())
				return
			}
		}
	}
}

// ownerGone reports whether run k has no lease and no event stored after
// the one at index last.
func (s *Store) ownerGone(ctx context.Context, k runKey, last uint64) (bool, error) {
	_, err := s.leases.Get(ctx, k.lease())
	switch {
	case err == nil:
		return false, nil
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return false, fmt.Errorf("store: read lease: %w", err)
	}
	// An owner that took the run less than a lease TTL ago may not have
	// written its lease yet (the first write is not waited for).
	own, err := s.stream.GetLastMsgForSubject(ctx, k.own())
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("store: read run: %w", err)
	case time.Since(own.Time) < s.cfg.LeaseTTL:
		return false, nil
	}
	m, err := s.stream.GetLastMsgForSubject(ctx, k.events())
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("store: read run: %w", err)
	}
	first, events, err := decodeFrame(m.Header, m.Data)
	if err != nil {
		return false, err
	}
	return first+uint64(len(events))-1 <= last, nil
}

// LastEvent returns the last event stored for the run, or
// [fs.ErrNotExist] when it has none.
func (s *Store) LastEvent(ctx context.Context, turnID string, attempt uint32) ([]byte, error) {
	m, err := s.stream.GetLastMsgForSubject(ctx, runKey{turnID, attempt}.events())
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("store: run %q attempt %d has no event: %w", turnID, attempt, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("store: read run: %w", err)
	}
	_, events, err := decodeFrame(m.Header, m.Data)
	if err != nil || len(events) == 0 {
		return nil, fmt.Errorf("store: read run: %w", cmp.Or(err, errors.New("an empty frame")))
	}
	return events[len(events)-1], nil
}

// Signal sends signal to the owner of the run and returns its reply; it
// fails with [fs.ErrNotExist] when no replica owns the run.
func (s *Store) Signal(ctx context.Context, turnID string, attempt uint32, signal string) ([]byte, error) {
	m, err := s.nc.RequestWithContext(ctx, runKey{turnID, attempt}.control(), []byte(signal))
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, fmt.Errorf("store: run %q attempt %d has no owner: %w", turnID, attempt, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("store: signal: %w", err)
	}
	return m.Data, nil
}

// Notify sends signal to the owner of the run without waiting for a reply;
// nobody may be listening.
func (s *Store) Notify(turnID string, attempt uint32, signal string) {
	_ = s.nc.Publish(runKey{turnID, attempt}.control(), []byte(signal))
}
