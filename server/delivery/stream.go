package delivery

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Errors a [Stream] ends with.
var (
	// ErrStalled is the failure of a stream whose client accepted no
	// message for the send timeout.
	ErrStalled = errors.New("delivery: the client accepted no message for the send timeout")
	// ErrBehind says the stream's feed no longer holds the message after
	// the last one sent: its caller must [Stream.Put] the messages it
	// missed (from a log), then [Stream.Resume] the feed.
	ErrBehind = errors.New("delivery: the stream fell behind its feed")
	// errClosed is the failure of a Put on a closed stream.
	errClosed = errors.New("delivery: the stream is closed")
)

// State is what a [Feed] says of itself besides the messages it hands
// over.
type State uint8

// The states of a feed.
const (
	// Open: more messages may come.
	Open State = iota
	// Over: the messages handed over are the last; none will come after
	// them.
	Over
	// Behind: the feed no longer holds the message after the one asked
	// for (see [ErrBehind]).
	Behind
)

// A Feed holds the messages a [Stream] sends, in order, each with its
// seq, from 1 without gaps. The stream takes them on its worker when it
// is kicked ([Stream.Kick]) and none of its Sends is under way.
type Feed[M any] interface {
	// Next appends to buf the messages ready after seq after, in order,
	// and returns it, with the feed's state after them. It must not block.
	Next(after uint64, buf []M) ([]M, State)
	// Seq returns m's seq.
	Seq(m M) uint64
}

// Stream delivers one stream's messages to its client: one Send at a
// time, each run on a worker's goroutine, under one stall watchdog.
//
// grpc-go's Send blocks while the client's flow-control window is full,
// and nothing but the end of the handler unblocks it: flow control is the
// backpressure, and the send timeout its end. So no Send runs on the
// goroutine of the handler or of the turn. The messages come in one of
// two ways:
//
//   - [Stream.Put] hands one message over once the one before was sent,
//     waiting at most the send timeout for it: the turn's goroutine (a
//     turn without a store) or the handler reading a log is held back by
//     a client that reads slowly, and at most one message waits.
//   - A [Feed] (a durable run's window of events) is drained by the
//     stream itself: [Stream.Kick], called by whoever adds to the feed,
//     starts a Send on a worker when none is under way, which goes on
//     with what was added meanwhile (a batch per wake-up, not a hand-off
//     per message). The handler is not woken per message; the feed never
//     waits for the stream.
//
// The watchdog is one timer for the stream's life (not one per Send): a
// Send under way for the send timeout stalls the stream (ErrStalled),
// which ends it, and the Send with it when the handler returns. While no
// Send is under way the stream holds no goroutine.
type Stream[M any] struct {
	send    func(M) error
	start   func(func())
	timeout time.Duration
	onStall func()
	drainFn func() // s.drain, made once
	// idle, when set, is called each time the stream has no Send under
	// way any more.
	idle func()
	// wake tells the handler waiting in Wait to look again.
	wake chan struct{}

	// dirty says Kick was called since the drain last looked; sending
	// that a drain is under way (started by the CAS that sets it).
	dirty   atomic.Bool
	sending atomic.Bool
	stalled atomic.Bool
	stopped atomic.Bool // closed: the watchdog is off
	// sentSeq is sent, read without the lock (Sent).
	sentSeq atomic.Uint64
	// The watchdog: since is when the Send under way began (nanoseconds
	// after base, 0 between Sends).
	base  time.Time
	since atomic.Int64
	dog   *time.Timer

	mu   sync.Mutex
	cond sync.Cond // on mu: a Send ended, the stream stalled or failed
	feed Feed[M]
	slot M    // the message Put and not yet taken by the drain
	full bool // slot holds one
	buf  []M  // the drain's batch
	// sent is the seq of the last message sent (with a feed); state the
	// feed's, as the drain last saw it; over that a drain sent the feed's
	// last message.
	sent    uint64
	state   State
	over    bool
	err     error // the first Send's failure, which ends the stream
	closed  bool
	waiters int
}

// New returns the stream that sends with send, running each Send on a
// goroutine start gives it (see [Workers]); a Send under way for timeout
// stalls it, and onStall (when not nil) is called then, once, on the
// watchdog's goroutine. Close it when done.
func New[M any](send func(M) error, timeout time.Duration, start func(func()), onStall func()) *Stream[M] {
	s := &Stream[M]{send: send, start: start, timeout: timeout, onStall: onStall, wake: make(chan struct{}, 1), base: time.Now()}
	s.cond.L = &s.mu
	s.drainFn = s.drain
	// Armed once s.dog is set: a timer that fires at once (a short
	// timeout on a busy machine) finds it in watch.
	s.dog = time.AfterFunc(time.Duration(math.MaxInt64), s.watch)
	s.dog.Reset(timeout)
	return s
}

// OnIdle sets the function called each time the stream stops having a
// Send under way (a [runtime.IdleSink]'s). Set it before the first
// message.
func (s *Stream[M]) OnIdle(f func()) { s.idle = f }

// Busy reports whether a Send is under way or a message waits for one.
func (s *Stream[M]) Busy() bool { return s.sending.Load() }

// Stalled reports whether the watchdog closed the stream: its client
// accepted no message for the send timeout.
func (s *Stream[M]) Stalled() bool { return s.stalled.Load() }

// Follow makes the stream send from feed, from the message after the one
// of seq after on, and starts a Send if one is ready.
func (s *Stream[M]) Follow(feed Feed[M], after uint64) {
	s.mu.Lock()
	s.feed, s.sent, s.state = feed, after, Open
	s.sentSeq.Store(after)
	s.mu.Unlock()
	s.Kick()
}

// Resume makes a stream whose feed fell behind ([ErrBehind]) send from it
// again, once the messages it missed were Put: from the message after the
// last one sent.
func (s *Stream[M]) Resume() {
	s.mu.Lock()
	if s.state == Behind {
		s.state = Open
	}
	s.mu.Unlock()
	s.Kick()
}

// Sent returns the seq of the last message sent (0 before any, and
// without a feed). It takes no lock.
func (s *Stream[M]) Sent() uint64 { return s.sentSeq.Load() }

// Kick tells the stream its feed holds more: a Send starts on a worker
// unless one is under way, which then goes on with them. It never blocks
// and may be called holding the feed's lock.
func (s *Stream[M]) Kick() {
	s.dirty.Store(true)
	if s.sending.CompareAndSwap(false, true) {
		s.start(s.drainFn)
	}
}

// Put hands m over once the message before was sent: it waits at most the
// send timeout from when that Send began, and fails with [ErrStalled] when
// it did not end by then, or with the Send's error.
func (s *Stream[M]) Put(m M) error {
	s.mu.Lock()
	if err := s.waitSent(); err != nil {
		s.mu.Unlock()
		return err
	}
	s.slot, s.full = m, true
	s.mu.Unlock()
	s.Kick()
	return nil
}

// Flush waits until what was Put is sent, at most the send timeout from
// when its Send began, and returns the stream's failure if any:
// [ErrStalled], or the Send's error.
func (s *Stream[M]) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waitSent()
}

// waitSent waits until no message waits and no Send is under way, or the
// stream failed; s.mu is held.
func (s *Stream[M]) waitSent() error {
	for {
		switch {
		case s.stalled.Load():
			return ErrStalled
		case s.err != nil:
			return s.err
		case s.closed:
			return errClosed
		case !s.full && !s.sending.Load():
			return nil
		}
		s.waiters++
		s.cond.Wait()
		s.waiters--
	}
}

// Wait waits until the stream ended or needs its handler, and says why:
// nil when it sent its feed's last message; [ErrBehind] when the feed
// fell behind it; [ErrStalled]; the Send's failure; or ctx's error.
func (s *Stream[M]) Wait(ctx context.Context) error {
	for {
		if err := s.status(); err != errOpen {
			return err
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			if s.stalled.Load() {
				return ErrStalled
			}
			return ctx.Err()
		}
	}
}

// errOpen is status's answer while the stream goes on.
var errOpen = errors.New("delivery: open")

// status returns what Wait would: errOpen while the stream goes on.
func (s *Stream[M]) status() error {
	if s.stalled.Load() {
		return ErrStalled
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.err != nil:
		return s.err
	case s.over:
		return nil
	case s.state == Behind && !s.sending.Load():
		return ErrBehind
	}
	return errOpen
}

// Close stops the stream: no Send starts after it. It waits for the Send
// under way, unless that one is stuck (the stream stalled), which ends
// with the handler.
func (s *Stream[M]) Close() {
	s.mu.Lock()
	s.closed = true
	for s.sending.Load() && !s.stalled.Load() {
		s.waiters++
		s.cond.Wait()
		s.waiters--
	}
	s.mu.Unlock()
	s.stopped.Store(true)
	s.dog.Stop()
}

// wakeHandler tells Wait to look again.
func (s *Stream[M]) wakeHandler() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// drain sends what was Put and what the feed holds after the last message
// sent until none is left, on a worker; see [Stream].
func (s *Stream[M]) drain() {
	for {
		s.dirty.Store(false)
		batch, last := s.take()
		for i, m := range batch {
			batch[i] = *new(M)
			if err := s.sendOne(m); err != nil {
				clear(batch[i:])
				s.mu.Lock()
				s.err = err
				s.mu.Unlock()
				s.ended()
				return
			}
		}
		if last {
			s.mu.Lock()
			s.over = true
			s.mu.Unlock()
			s.wakeHandler()
		}
		if len(batch) > 0 {
			continue
		}
		// Nothing left: stop, unless a Kick came meanwhile and this drain
		// wins it back.
		s.ended()
		if !s.dirty.Load() || !s.sending.CompareAndSwap(false, true) {
			return
		}
	}
}

// take returns the drain's next batch: the message Put, else the feed's
// messages after the last one sent; last says the batch ends the feed.
func (s *Stream[M]) take() (batch []M, last bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.err != nil || s.over {
		return nil, false
	}
	if s.full {
		var zero M
		s.buf = append(s.buf[:0], s.slot)
		s.slot, s.full = zero, false
		return s.buf, false
	}
	if s.feed == nil || s.state != Open {
		return nil, false
	}
	var st State
	s.buf, st = s.feed.Next(s.sent, s.buf[:0])
	if st == Behind {
		s.state = Behind
		return nil, false
	}
	return s.buf, st == Over
}

// sendOne sends m under the watchdog, and records it sent.
func (s *Stream[M]) sendOne(m M) error {
	s.since.Store(int64(time.Since(s.base)) | 1)
	err := s.send(m)
	s.since.Store(0)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.feed != nil {
		s.sent = s.feed.Seq(m)
		s.sentSeq.Store(s.sent)
	}
	s.mu.Unlock()
	return nil
}

// ended records that the drain stopped: no Send is under way.
func (s *Stream[M]) ended() {
	s.mu.Lock()
	s.sending.Store(false)
	wake := s.state == Behind || s.err != nil
	if s.waiters > 0 {
		s.cond.Broadcast()
	}
	s.mu.Unlock()
	if wake {
		s.wakeHandler()
	}
	if s.idle != nil {
		s.idle()
	}
}

// watch is the watchdog's timer function: it stalls the stream whose Send
// has been under way for the timeout, and is set again for when the Send
// under way (or the next) would reach it.
func (s *Stream[M]) watch() {
	if s.stopped.Load() || s.stalled.Load() {
		return
	}
	s.mu.Lock()
	dog := s.dog
	s.mu.Unlock()
	since := s.since.Load()
	if since == 0 {
		dog.Reset(s.timeout)
		return
	}
	if d := time.Since(s.base) - time.Duration(since); d < s.timeout {
		dog.Reset(s.timeout - d)
		return
	}
	// onStall first: whoever sees the stream stalled sees it called.
	if s.onStall != nil {
		s.onStall()
	}
	s.stalled.Store(true)
	s.mu.Lock()
	s.cond.Broadcast()
	s.mu.Unlock()
	s.wakeHandler()
}
