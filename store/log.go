package store

import (
	"context"
	"encoding/base64"
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

// writer is this replica's hold on a run it owns.
type writer struct {
	s      *Store
	key    runKey
	ownSeq uint64 // the stream sequence of the owner record appends expect
	queue  chan pending
	acked  chan struct{} // closed when every queued append was acknowledged
	sub    *nats.Subscription
	stop   chan struct{} // ends the lease renewal
	renew  sync.WaitGroup

	onSignal func(signal string) []byte

	mu  sync.Mutex
	err error // the first failure; every later append fails with it
}

// SignalLost is the signal a run's owner receives, from its own store,
// when it finds that another replica took the run over: it must stop the
// run, whose appends fail from then on.
const SignalLost = "lost"

type pending struct {
	fut  jetstream.PubAckFuture
	done func(error)
}

// Create opens the log of the run (turnID, attempt) with record as its
// first record, unless the run exists. When it creates the run, this
// replica owns it: it holds its lease, appends its events with [Store.Append],
// answers the signals sent to it with onSignal (called on its own
// goroutine; the reply of a signal sent with [Store.Signal] is its result),
// and must end with [Store.Finish]. When the run exists, Create returns its
// first record and created is false. Of concurrent Creates of one run, on
// any replicas, exactly one creates it.
func (s *Store) Create(ctx context.Context, turnID string, attempt uint32, record []byte, onSignal func(signal string) []byte) (created bool, existing []byte, err error) {
	k := runKey{turnID, attempt}
	ack, err := s.js.Publish(ctx, k.own(), record, jetstream.WithExpectLastSequencePerSubject(0))
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
	if _, err := s.leases.Put(ctx, k.lease(), []byte(s.id)); err != nil {
		return false, nil, fmt.Errorf("store: lease: %w", err)
	}
	if err := s.own(ctx, k, ack.Sequence, onSignal); err != nil {
		_ = s.leases.Delete(ctx, k.lease())
		return false, nil, err
	}
	return true, nil, nil
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
	if _, err := s.leases.Create(ctx, k.lease(), []byte(s.id)); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, nil, ErrNotClaimed
		}
		return nil, nil, fmt.Errorf("store: claim lease: %w", err)
	}
	release := func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.LeaseTTL)
		defer cancel()
		_ = s.leases.Delete(dctx, k.lease())
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
	ack, err := s.js.Publish(ctx, k.own(), []byte("claimed by "+s.id), jetstream.WithExpectLastSequencePerSubject(last.Sequence))
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
	if err := s.own(ctx, k, ack.Sequence, onSignal); err != nil {
		release()
		return nil, nil, err
	}
	return record, events, nil
}

// readAll returns every event of run k stored now.
func (s *Store) readAll(ctx context.Context, k runKey) ([][]byte, error) {
	last, err := s.stream.GetLastMsgForSubject(ctx, k.events())
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: read run: %w", err)
	}
	cons, err := s.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{k.events()},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("store: read run: %w", err)
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("store: read run: %w", err)
	}
	defer it.Stop()
	var out [][]byte
	for {
		m, err := it.Next()
		if err != nil {
			return nil, fmt.Errorf("store: read run: %w", err)
		}
		out = append(out, m.Data())
		if meta, err := m.Metadata(); err == nil && meta.Sequence.Stream >= last.Sequence {
			return out, nil
		}
	}
}

// WatchExpired calls fn, on its own goroutine, with each run whose lease
// expired without its owner giving it up, until ctx is done: the runs to
// take over. It includes the runs whose lease expired within the last
// ten minutes before the call.
func (s *Store) WatchExpired(ctx context.Context, fn func(turnID string, attempt uint32)) error {
	w, err := s.leases.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("store: watch leases: %w", err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.closed:
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return nil
			}
			if e == nil || e.Operation() != jetstream.KeyValuePurge {
				continue
			}
			tok, n, found := strings.Cut(e.Key(), ".")
			id, err := base64.RawURLEncoding.DecodeString(tok)
			attempt, aerr := strconv.ParseUint(n, 10, 32)
			if !found || err != nil || aerr != nil {
				continue
			}
			fn(string(id), uint32(attempt))
		}
	}
}

// own makes this replica the owner of run k, whose appends expect the
// owner record at ownSeq; the caller holds the lease.
func (s *Store) own(ctx context.Context, k runKey, ownSeq uint64, onSignal func(signal string) []byte) error {
	w := &writer{s: s, key: k, ownSeq: ownSeq, queue: make(chan pending, maxInFlight), acked: make(chan struct{}), stop: make(chan struct{}), onSignal: onSignal}
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
	go w.ackLoop()
	w.renew.Add(1)
	go w.renewLoop()
	s.mu.Lock()
	s.runs[k] = w
	s.mu.Unlock()
	return nil
}

func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// ackLoop waits for the acknowledgement of each append, in order, and
// reports it.
func (w *writer) ackLoop() {
	defer close(w.acked)
	for {
		var p pending
		var ok bool
		select {
		case p, ok = <-w.queue:
			if !ok {
				return
			}
		case <-w.s.closed:
			w.fail(ErrClosed)
			return
		}
		var err error
		select {
		case <-w.s.closed:
			w.fail(ErrClosed)
			p.done(ErrClosed)
			return
		case <-p.fut.Ok():
		case err = <-p.fut.Err():
			if isWrongLastSeq(err) {
				err = fmt.Errorf("%w: %w", ErrLost, err)
			}
			w.fail(err)
		}
		if err == nil {
			err = w.failure()
		}
		p.done(err)
	}
}

// renewLoop renews the run's lease three times per lease TTL until the
// run ends. A lease that expired (a long pause) is taken again unless
// another replica holds it.
func (w *writer) renewLoop() {
	defer w.renew.Done()
	s := w.s
	t := time.NewTicker(s.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-w.s.closed:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.LeaseTTL)
		e, err := s.leases.Get(ctx, w.key.lease())
		switch {
		case err == nil && string(e.Value()) == s.id:
			_, err = s.leases.Update(ctx, w.key.lease(), []byte(s.id), e.Revision())
		case errors.Is(err, jetstream.ErrKeyNotFound):
			_, err = s.leases.Create(ctx, w.key.lease(), []byte(s.id))
		case err == nil:
			err = fmt.Errorf("%w: replica %s holds its lease", ErrLost, e.Value())
			w.fail(err)
			go w.onSignal(SignalLost)
			cancel()
			return
		}
		cancel()
		if err != nil {
			s.logger.Warn("turn lease not renewed", "turn_id", w.key.turnID, "attempt", w.key.attempt, "error", err)
		}
	}
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
// one goroutine. Append waits only while 256 appends of the run await
// their acknowledgement, and fails at once when an earlier one failed.
// Appends of one run must not be concurrent.
func (s *Store) Append(ctx context.Context, turnID string, attempt uint32, event []byte, done func(error)) error {
	w, err := s.writer(turnID, attempt)
	if err != nil {
		return err
	}
	if err := w.failure(); err != nil {
		return err
	}
	fut, err := s.js.PublishAsync(w.key.events(), event, jetstream.WithExpectLastSequenceForSubject(w.ownSeq, w.key.own()))
	if err != nil {
		w.fail(err)
		return fmt.Errorf("store: append: %w", err)
	}
	select {
	case w.queue <- pending{fut: fut, done: done}:
		return nil
	case <-s.closed:
		return ErrClosed
	case <-ctx.Done():
		w.fail(ctx.Err())
		return ctx.Err()
	}
}

// Finish waits until every append of the run is acknowledged (or ctx is
// done), then gives the run up: its lease is deleted and signals are no
// longer answered. It returns the first failure of the run's appends.
func (s *Store) Finish(ctx context.Context, turnID string, attempt uint32) error {
	w, err := s.writer(turnID, attempt)
	if err != nil {
		return err
	}
	close(w.queue)
	select {
	case <-w.acked:
	case <-ctx.Done():
		w.fail(ctx.Err())
	}
	close(w.stop)
	w.renew.Wait()
	_ = w.sub.Unsubscribe()
	s.mu.Lock()
	delete(s.runs, w.key)
	s.mu.Unlock()
	err = w.failure()
	if err == nil || !errors.Is(err, ErrLost) {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.LeaseTTL)
		defer cancel()
		_ = s.leases.Delete(dctx, w.key.lease())
	}
	return err
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
func (s *Store) Events(ctx context.Context, turnID string, attempt uint32, afterSeq uint64) iter.Seq2[[]byte, error] {
	return func(yield func([]byte, error) bool) {
		k := runKey{turnID, attempt}
		cons, err := s.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{k.events()},
			DeliverPolicy:  jetstream.DeliverAllPolicy,
		})
		if err != nil {
			yield(nil, fmt.Errorf("store: watch run: %w", err))
			return
		}
		done := make(chan struct{})
		defer close(done)
		msgs := make(chan jetstream.Msg, 64)
		cc, err := cons.Consume(func(m jetstream.Msg) {
			select {
			case msgs <- m:
			case <-done:
			}
		})
		if err != nil {
			yield(nil, fmt.Errorf("store: watch run: %w", err))
			return
		}
		defer cc.Stop()
		var n, lastStream uint64
		quiet := time.NewTimer(s.cfg.LeaseTTL)
		defer quiet.Stop()
		for {
			select {
			case m := <-msgs:
				n++
				if meta, err := m.Metadata(); err == nil {
					lastStream = meta.Sequence.Stream
				}
				if n > afterSeq && !yield(m.Data(), nil) {
					return
				}
				quiet.Reset(s.cfg.LeaseTTL)
			case <-quiet.C:
				gone, err := s.ownerGone(ctx, k, lastStream)
				if err == nil && gone {
					err = ErrNoOwner
				}
				if err != nil {
					yield(nil, err)
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
// the stream sequence last.
func (s *Store) ownerGone(ctx context.Context, k runKey, last uint64) (bool, error) {
	_, err := s.leases.Get(ctx, k.lease())
	switch {
	case err == nil:
		return false, nil
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return false, fmt.Errorf("store: read lease: %w", err)
	}
	m, err := s.stream.GetLastMsgForSubject(ctx, k.events())
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("store: read run: %w", err)
	}
	return m.Sequence <= last, nil
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
	return m.Data, nil
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
