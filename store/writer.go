package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrLost is the failure of appends to a run this replica no longer owns.
// It has the method TakenOver, true, by which a caller that does not
// import the store tells it from a failure of the store.
var ErrLost error = lostError{}

type lostError struct{}

func (lostError) Error() string { return "store: this replica no longer owns the run" }

// TakenOver reports that another replica owns the run.
func (lostError) TakenOver() bool { return true }

// ErrClosed is the failure of appends pending when the store closed.
var ErrClosed = errors.New("store: closed")

// writer is this replica's hold on a run it owns. Its events are stored
// by group commit: one message, a frame of every event appended since the
// last one was sent, is in flight at a time, under the owner fence; the
// next frame goes as soon as it is acknowledged. A burst of events costs
// one round trip per frame, not per event, and the fence holds on
// replicated streams, which take one expectation per subject at a time.
type writer struct {
	s      *Store
	key    runKey
	ownSeq uint64        // the stream sequence of the owner record appends expect
	next   uint64        // the index (seq) of the next event the run stores, from 1
	stop   chan struct{} // ends the lease renewal
	renew  sync.WaitGroup
	sent   chan struct{} // closed once Finish was called and the sender has sent everything
	send   func()        // w.sender, made once: what wake starts

	// evSubject and ownSubject are key.events() and key.own(), made once:
	// every frame's publish names both.
	evSubject, ownSubject string

	onSignal func(signal string) []byte
	// lease is the first write of the lease, when not waited for: its
	// acknowledgement gives leaseRev. The renewal takes it (and sets it to
	// nil); Finish waits for it when the renewal had not.
	lease jetstream.PubAckFuture
	// leaseRev is the lease's revision this replica wrote last, 0 when
	// not known: the renewal updates the lease against it. Only the
	// renewal goroutine uses it once started.
	leaseRev uint64
	// beatAt is when the renewal last ran, in Unix nanoseconds; trying
	// says an attempt is under way (see renewing).
	beatAt atomic.Int64
	trying atomic.Bool
	// The renewal's timer, and whether it was halted and has ended (see
	// renewLoop).
	renewMu     sync.Mutex
	renewTimer  *time.Timer
	renewHalted bool
	renewEnded  bool

	mu     sync.Mutex
	queued []pending  // appended, not yet sent
	room   *sync.Cond // signalled when the queue shrinks
	// sending says the sender runs (see [writer.wake]); closing that
	// Finish was called, and ended that sent is closed.
	sending bool
	closing bool
	ended   bool
	err     error // the first failure; every later append fails with it
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

// senders keeps the goroutines of the writers' senders between frames,
// at most maxIdleSenders waiting: a sender's stack grows as it stores (the
// JSON of each acknowledgement is decoded on it), and a fresh goroutine
// per run paid for that growth again, a copy at each doubling.
type senders struct {
	work chan func()
	idle atomic.Int32
}

// maxIdleSenders bounds the senders' goroutines waiting for a run.
const maxIdleSenders = 64

// run runs f, a writer's sender, on a waiting goroutine, or on a new one
// if none waits; the goroutines end when closed is.
func (sd *senders) run(f func(), closed <-chan struct{}) {
	select {
	case sd.work <- f:
	default:
		go sd.loop(f, closed)
	}
}

// loop runs f, then the senders it is given while it waits, until closed
// is.
func (sd *senders) loop(f func(), closed <-chan struct{}) {
	for {
		f()
		if sd.idle.Add(1) > maxIdleSenders {
			sd.idle.Add(-1)
			return
		}
		select {
		case f = <-sd.work:
			sd.idle.Add(-1)
		case <-closed:
			sd.idle.Add(-1)
			return
		}
	}
}

// wake starts the sender on one of the store's goroutines unless it runs;
// w.mu is held. The sender runs only while the run has events to store: a
// run waiting for its model (a slow turn, held open for minutes) holds no
// goroutine of its own here, where a sender per run waited for the run's
// whole life (one goroutine and its grown stack per held turn).
func (w *writer) wake() {
	if !w.sending {
		w.sending = true
		w.s.senders.run(w.send, w.s.closed)
	}
}

// end closes sent, once: the sender has sent everything and Finish was
// called; w.mu is held.
func (w *writer) end() {
	if !w.ended {
		w.ended = true
		close(w.sent)
	}
}

// sender sends the queued events as frames, one in flight at a time, and
// reports each event's outcome in order, until the queue is empty; then
// it ends, and the next append starts it again ([writer.wake]).
func (w *writer) sender() {
	for {
		w.mu.Lock()
		if len(w.queued) == 0 {
			w.sending = false
			if w.closing {
				w.end()
			}
			w.mu.Unlock()
			return
		}
		batch := takeFrame(w.queued)
		w.queued = w.queued[len(batch):]
		failed := w.err
		w.room.Broadcast()
		w.mu.Unlock()

		err := failed
		if err == nil {
			err = w.publish(batch)
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

// takeFrame returns the events at the head of q that fit one frame (at
// least one).
func takeFrame(q []pending) []pending {
	n, size := 0, 0
	for n < len(q) && (n == 0 || size+len(q[n].event)+binary.MaxVarintLen64 <= maxFrame) {
		size += len(q[n].event) + binary.MaxVarintLen64
		n++
	}
	return q[:n]
}

// encodeFrame encodes batch into buf (emptied; grown when its capacity is
// short): each event as a uvarint length and its bytes.
func encodeFrame(batch []pending, buf []byte) []byte {
	size := 0
	for _, p := range batch {
		size += binary.MaxVarintLen64 + len(p.event)
	}
	frame := buf[:0]
	if cap(frame) < size {
		frame = make([]byte, 0, size)
	}
	for _, p := range batch {
		frame = binary.AppendUvarint(frame, uint64(len(p.event)))
		frame = append(frame, p.event...)
	}
	return frame
}

// framePool holds the buffers frames are encoded into with a NATS
// cluster, one for each attempt to publish a frame under way (see
// [publisher.publishOut]). A new buffer a frame made a copy of every
// event stored, garbage once published (363 MB over a run of 1,000
// streams of 20,000-word replies: BENCHMARKS.md, issue 37), which the
// collector's goal let pile up.
var framePool = sync.Pool{New: func() any { return new([]byte) }}

// keepFrameBuffer puts buf back in framePool, holding frame, which was
// encoded into it: a frame of one event larger than maxFrame is not kept
// for the next.
func keepFrameBuffer(buf *[]byte, frame []byte) {
	if cap(frame) <= maxFrame {
		*buf = frame[:0]
		framePool.Put(buf)
	}
}

// outFrame is a frame on its way to the log: its events, which the writer
// holds until they are acknowledged anyway, encoded for each attempt to
// publish them into a buffer given back as soon as the attempt's publish
// returned, not when it is acknowledged (see [publisher.publishOut]).
// nats.go copies a message into its connection's buffer before its
// publish returns, so the encoded frame is needed after that only to
// publish it again, and a retry encodes the same bytes afresh. A frame
// held across its acknowledgement made every writer with a frame in
// flight hold a buffer of up to maxFrame bytes, all at once when the
// turns write at the same tick (51 MB of 255 MB live at the peak of 300
// never-reading streams: BENCHMARKS.md, issue 37).
type outFrame struct {
	batch []pending
}

// size returns the encoded frame's length, without encoding it.
func (f *outFrame) size() int {
	n := 0
	for _, p := range f.batch {
		n += uvarintLen(uint64(len(p.event))) + len(p.event)
	}
	return n
}

// uvarintLen returns the length of x's uvarint encoding.
func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// holds reports whether frame, as stored, holds the events of batch,
// encoded as encodeFrame encodes them.
func (f *outFrame) holds(frame []byte) bool {
	for _, p := range f.batch {
		n, k := binary.Uvarint(frame)
		if k <= 0 || n != uint64(len(p.event)) || uint64(len(frame)-k) < n || !bytes.Equal(frame[k:k+int(n)], p.event) {
			return false
		}
		frame = frame[k+int(n):]
	}
	return len(frame) == 0
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
//
// They follow the cluster's elections. A NATS server that dies uncleanly
// (SIGKILL, a lost node) leaves its streams without a leader until a
// follower's election timer fires: nats-server waits 4–9 s (random, not
// configurable) after the dead leader's last heartbeat, and meanwhile an
// append gets no answer. The attempts are short, so the first one after
// the election is made within publishTry+publishBackoff of it (a frame
// sent again carries the same message id and is stored once), and all of
// them together outlast the slowest election and the new leader's
// catching up three times over, so a turn pauses through a leader's loss
// instead of failing.
const (
	publishTry     = 250 * time.Millisecond
	publishTimeout = 30 * time.Second
	publishBackoff = 50 * time.Millisecond
	// duplicateWindow is how long the stream remembers the message ids
	// of frames: longer than a frame's attempts take.
	duplicateWindow = publishTimeout + 5*time.Second
)

// publish stores the frame of batch under the owner fence and waits for
// the acknowledgement. An attempt the stream refused for now (no responders,
// JetStream temporarily unavailable, a new leader catching up) is made
// again. With a NATS cluster (mode nats), so is one that got no answer
// (the stream's leader or the server this replica is connected to went
// away mid-request): the frame carries a message id, so a frame whose
// first attempt was stored after all is stored once (JetStream's duplicate
// window, [duplicateWindow]). The embedded server, in-process, fails over
// to nothing: its frames carry no id, which would cost its memory a
// duplicate window's worth of ids.
func (w *writer) publish(batch []pending) error {
	// Cut short when the store closes, without a goroutine per frame.
	ctx, cancel := context.WithTimeout(w.s.closing, publishTimeout)
	defer cancel()
	// The owner fence: the last record on the run's owner subject must be
	// the one this replica's ownership began with.
	msg := &nats.Msg{Subject: w.evSubject, Header: nats.Header{
		firstHeader:                             {strconv.FormatUint(w.next, 10)},
		jetstream.ExpectedLastSubjSeqHeader:     {strconv.FormatUint(w.ownSeq, 10)},
		jetstream.ExpectedLastSubjSeqSubjHeader: {w.ownSubject},
	}}
	dedupe := w.s.cfg.Mode == ModeNATS
	if dedupe {
		// One id per frame of one owner: a retry is the same frame; a new
		// owner's frames are others.
		msg.Header[jetstream.MsgIDHeader] = []string{w.key.prefix() + "." + strconv.FormatUint(w.ownSeq, 10) + "." + strconv.FormatUint(w.next, 10)}
	}
	f := &outFrame{batch: batch}
	_, err := w.s.pub.publishFrame(ctx, msg, f, dedupe, w.storedFrame(f))
	switch {
	case err == nil:
		return nil
	case isWrongLastSeq(err):
		return fmt.Errorf("%w: %w", ErrLost, err)
	case isClosed(w.s.closed):
		return ErrClosed
	case roomError(err) != nil:
		return fmt.Errorf("store: append: %w: %w", roomError(err), err)
	}
	return fmt.Errorf("store: append: %w", err)
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

// Append appends event to the log of a run this replica owns, without
// waiting for the store's acknowledgement: done is called with nil once
// the event is stored, or with the failure, for each append in order, one
// at a time. Events appended while a frame is in flight go together in
// the next one. Append waits only while 256 events of the run are queued,
// and fails at once when an earlier one failed. Appends of one run must
// not be concurrent.
func (s *Store) Append(ctx context.Context, turnID string, attempt uint32, event []byte, done func(error)) error {
	w, err := s.leases.writer(turnID, attempt)
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
	w.wake()
	w.mu.Unlock()
	return nil
}

// Finish waits until every append of the run is acknowledged (or ctx is
// done), then gives the run up: its lease is deleted (with the embedded
// store, its entry in the process's runs) and signals are no longer
// answered. It returns the first failure of the run's appends.
func (s *Store) Finish(ctx context.Context, turnID string, attempt uint32) error {
	return s.giveUp(ctx, turnID, attempt, false)
}

// Release gives up a run this replica owns that has not ended, for another
// replica to take over at once (this one is shutting down): it waits until
// every append is acknowledged, as Finish does, then purges the run's
// lease, which every replica's [Store.WatchExpired] reports as it does an
// expired one, so none waits for the lease TTL; the purge names this
// replica, so a claim of the run asks it nothing ([leases.releaseLease]).
// With the embedded store, whose runs have no lease, the run is reported
// to this process's WatchExpired at once. The run's appends must have
// stopped.
func (s *Store) Release(ctx context.Context, turnID string, attempt uint32) error {
	return s.giveUp(ctx, turnID, attempt, true)
}

func (s *Store) giveUp(ctx context.Context, turnID string, attempt uint32, handOff bool) error {
	w, err := s.leases.writer(turnID, attempt)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.closing = true
	if !w.sending {
		w.end()
	}
	w.mu.Unlock()
	select {
	case <-w.sent:
	case <-ctx.Done():
		w.fail(ctx.Err())
	}
	close(w.stop)
	w.haltRenewal()
	w.renew.Wait()
	if w.lease != nil {
		// The lease's first write, when the renewal never took it. It is
		// waited for at most a lease TTL, as the renewal waits: a stream
		// without a leader acknowledges nothing until a follower's
		// election, and the publish's own timeout (publishTimeout) would
		// hold the end of the turn that long. A write that lands after the
		// drop below expires with the bucket's TTL.
		wait := time.NewTimer(s.cfg.LeaseTTL)
		select {
		case <-w.lease.Ok():
		case <-w.lease.Err():
		case <-ctx.Done():
		case <-s.closed:
		case <-wait.C:
		}
		wait.Stop()
		s.pub.forgetAck(w.lease)
	}
	s.inbox.leave(w)
	return s.leases.release(ctx, w, handOff)
}
