package server

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/admission"
)

// Bounds of the window of a run's latest acknowledged events that the
// replica owning it keeps in memory. A watcher keeping up with the run is
// served from the window; one that falls behind it (its client reads
// slowly, or it asks for events older than the window: a re-attach, a run
// taken over) reads the log until it is back within the window. So a run
// costs at most one window here, however many events it has and however
// slow its watchers are. A watcher that keeps up is never more than a
// Send behind, and a Send takes one event while gRPC queues at most 64 KiB
// of a stream's messages before Send blocks: a window of the same size
// serves from memory every watcher whose stream is not stalled, and 1,024
// running turns (the default max_running_turns) hold at most 64 MiB of
// windows' wire forms (plus the newest event of each, which the window
// always keeps), and the decoded events beside them.
const (
	// windowEvents bounds the events of a run's window.
	windowEvents = 256
	// windowBytes bounds their wire size.
	windowBytes = 64 << 10
	// windowFirstCap is the window's first capacity: the events of a short
	// turn (a reply of a few dozen deltas).
	windowFirstCap = 32
)

// run is a run this replica owns: the window of its latest acknowledged
// events, fanned out to the clients watching it here.
type run struct {
	key    runKey
	hash   []byte
	cancel context.CancelCauseFunc
	ended  chan struct{} // closed once the run is over and its log flushed

	mu sync.Mutex
	// window holds the latest acknowledged events, in order:
	// window[i].Seq == last-len(window)+1+i; sizes their wire sizes;
	// wires their wire forms as stored, where known (nil for the events
	// of a run taken over), which the stream of the RPC that created the
	// run sends without encoding them again.
	window     []*turnstilev1.AgentEvent
	sizes      []int
	wires      [][]byte
	windowSize int    // the sum of sizes
	last       uint64 // the seq of the last acknowledged event
	done       bool
	final      *status.Status // how watchers end, once done
	// wake is closed and replaced when something changes, once a waiter
	// took it (wakeTaken; see wakeChan): an event no one waits for costs
	// no channel.
	wake      chan struct{}
	wakeTaken bool
	// push, when set, is the stream of the RPC that created the run, fed
	// by publish itself (see pusher).
	push *pusher
	// watchers counts the streams following the run here; seen is when
	// the last one left or a watcher elsewhere last said it watches.
	watchers int
	seen     time.Time
	detach   *time.Timer
	stopped  bool // CancelTurn stopped it
	// charge spends the tokens the run uses from its client key's limits;
	// nil without keys.
	charge *admission.Charger
	// handedOff is set when this replica, shutting down, gives the run to
	// another: nothing more of it is stored here.
	handedOff atomic.Bool
	// ctl reaches the turn (approvals, steering; approve.go).
	ctl *runtime.Controls
}

func newRun(k runKey, hash []byte, cancel context.CancelCauseFunc) *run {
	return &run{key: k, hash: hash, cancel: cancel, ended: make(chan struct{}), wake: make(chan struct{}), ctl: runtime.NewControls()}
}

// publish adds an acknowledged event of size bytes on the wire to the
// window, drops the oldest ones beyond its bounds, and wakes the watchers.
func (r *run) publish(ev *turnstilev1.AgentEvent, size int) { r.publishWire(ev, nil, size) }

// publishWire is publish of an event whose wire form, as stored, is wire
// (nil when not known).
func (r *run) publishWire(ev *turnstilev1.AgentEvent, wire []byte, size int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return
	}
	r.add(ev, wire, size)
	if p := r.push; p != nil && !p.sending {
		p.drainIfBehind()
	}
	r.wakeUp()
}

// wakeChan returns the channel closed at the run's next change; r.mu is
// held.
func (r *run) wakeChan() chan struct{} {
	r.wakeTaken = true
	return r.wake
}

// wakeUp wakes whoever waits on the run's wake channel; r.mu is held.
func (r *run) wakeUp() {
	if r.wakeTaken {
		close(r.wake)
		r.wake = make(chan struct{})
		r.wakeTaken = false
	}
}

// add appends ev to the window and keeps the window within its bounds,
// the newest event always; r.mu is held.
func (r *run) add(ev *turnstilev1.AgentEvent, wire []byte, size int) {
	if r.window == nil {
		// A turn's events in three allocations, not one per doubling.
		r.window = make([]*turnstilev1.AgentEvent, 0, windowFirstCap)
		r.sizes = make([]int, 0, windowFirstCap)
		r.wires = make([][]byte, 0, windowFirstCap)
	}
	r.window = append(r.window, ev)
	r.sizes = append(r.sizes, size)
	r.wires = append(r.wires, wire)
	r.windowSize += size
	r.last = ev.GetSeq()
	n := 0
	for len(r.window)-n > 1 && (len(r.window)-n > windowEvents || r.windowSize > windowBytes) {
		r.windowSize -= r.sizes[n]
		r.window[n], r.wires[n] = nil, nil
		n++
	}
	if n > 0 {
		// Shift in place: the backing arrays stay at the window's bound.
		r.window = append(r.window[:0], r.window[n:]...)
		r.sizes = append(r.sizes[:0], r.sizes[n:]...)
		r.wires = append(r.wires[:0], r.wires[n:]...)
		clear(r.window[len(r.window):cap(r.window)])
		clear(r.wires[len(r.wires):cap(r.wires)])
	}
}

// fill sets the window from the events of a run taken over, read from its
// log (events[i].Seq == i+1): their tail, within the window's bounds.
func (r *run) fill(events []*turnstilev1.AgentEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range events[max(0, len(events)-windowEvents):] {
		r.add(ev, nil, proto.Size(ev))
	}
	r.last = uint64(len(events))
}

// first returns the seq of the oldest event in the window (last+1 when it
// is empty); r.mu is held.
func (r *run) first() uint64 { return r.last + 1 - uint64(len(r.window)) }

// finish ends the run for its watchers with st.
func (r *run) finish(st *status.Status) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.detach != nil {
		r.detach.Stop()
	}
	if r.done {
		return
	}
	r.done, r.final = true, st
	r.wakeUp()
	if r.push != nil {
		r.push.kickHandler()
	}
}

// watchRun sends the events of r, a run this replica owns, after afterSeq
// to send as they are acknowledged, and returns the status the stream
// ends with. Events in r's window come from memory; older ones from the
// log, until the watcher is back within the window.
func (s *service) watchRun(ctx context.Context, r *run, afterSeq uint64, send func(*turnstilev1.AgentEvent) error) *status.Status {
	r.attach()
	defer r.leave(s.grace)
	next := afterSeq // the seq of the last event sent
	var evs []*turnstilev1.AgentEvent
	for {
		r.mu.Lock()
		behind := next+1 < r.first()
		evs = evs[:0]
		if !behind && next < r.last {
			evs = append(evs, r.window[next+1-r.first():]...)
		}
		done, final := r.done, r.final
		var wake chan struct{}
		if len(evs) == 0 && !done && !behind {
			wake = r.wakeChan()
		}
		r.mu.Unlock()
		if behind {
			var st *status.Status
			if next, st = s.fromLog(ctx, r, next, send); st != nil {
				return st
			}
			continue
		}
		for i, ev := range evs {
			evs[i] = nil
			if err := send(ev); err != nil {
				return status.Convert(err)
			}
			next = ev.GetSeq()
		}
		switch {
		case len(evs) > 0:
			continue
		case done:
			return final
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err())
		}
	}
}

// fromLog sends the events of r after next from the log until the
// watcher is back within r's window, and returns the seq of the last
// event it sent; or the status the stream ends with, when it does.
func (s *service) fromLog(ctx context.Context, r *run, next uint64, send func(*turnstilev1.AgentEvent) error) (uint64, *status.Status) {
	k := r.key
	s.logger.Debug("a watcher fell behind the turn's window: served from the log", "turn_id", k.turnID, "attempt", k.attempt, "after_seq", next)
	for b, err := range s.store.Events(ctx, k.id(), k.attempt, next) {
		if err != nil {
			if ctx.Err() != nil {
				return next, status.FromContextError(ctx.Err())
			}
			s.logger.Warn("turn store: watch ended", "turn_id", k.turnID, "attempt", k.attempt, "after_seq", next, "error", err)
			return next, storeUnreachable()
		}
		ev := &turnstilev1.AgentEvent{}
		if err := proto.Unmarshal(b, ev); err != nil {
			s.logger.Error("turn store: undecodable event", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
			return next, status.New(codes.Internal, "internal error")
		}
		if ev.GetSeq() != next+1 {
			s.logger.Error("turn store: an event out of order in the log", "turn_id", k.turnID, "attempt", k.attempt, "seq", ev.GetSeq(), "want", next+1)
			return next, status.New(codes.Internal, "internal error")
		}
		if err := send(ev); err != nil {
			return next, status.Convert(err)
		}
		next = ev.GetSeq()
		if ev.GetError() != nil || ev.GetTurnCompleted() != nil {
			return next, eventStatus(ev)
		}
		r.mu.Lock()
		back := next+1 >= r.first()
		r.mu.Unlock()
		if back {
			return next, nil
		}
	}
	return next, status.FromContextError(ctx.Err())
}

func (r *run) attach() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watchers++
	if r.detach != nil {
		r.detach.Stop()
	}
}

// leave counts a watcher out; when none is left, the run is cancelled
// after grace unless a watcher comes back or one elsewhere says it
// watches.
func (r *run) leave(grace time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watchers--
	r.seen = time.Now()
	if r.watchers == 0 && !r.done {
		r.armDetach(grace)
	}
}

// touched records that a watcher on another replica follows the run.
func (r *run) touched(grace time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = time.Now()
	if r.watchers == 0 && !r.done {
		r.armDetach(grace)
	}
}

// armDetach (re)starts the detach timer; r.mu is held.
func (r *run) armDetach(grace time.Duration) {
	if r.detach != nil {
		r.detach.Stop()
	}
	r.detach = time.AfterFunc(grace, func() {
		r.mu.Lock()
		idle := r.watchers == 0 && !r.done && time.Since(r.seen) >= grace
		r.mu.Unlock()
		// A person may take longer than the grace to decide: the approval
		// timeout bounds that wait, and a full grace applies again once
		// it is over. (The controls are asked without r.mu: they emit, which
		// takes it, while holding their own lock.)
		if idle && r.ctl != nil && r.ctl.AwaitingApproval(grace) {
			r.mu.Lock()
			if !r.done {
				r.seen = time.Now()
				r.armDetach(grace)
			}
			r.mu.Unlock()
			return
		}
		if idle {
			r.cancel(&llm.Error{Kind: llm.KindCancelled, Message: fmt.Sprintf("no client watched the turn for %s (the server's detach grace)", grace)})
		}
	})
}

// lastSeq returns the seq of the last acknowledged event.
func (r *run) lastSeq() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// pusher feeds the stream of the RPC that created a run (the common case:
// its only watcher) straight from [run.publish], without waking the RPC's
// handler for each event. When the store acknowledges an event and no Send
// of the stream is under way, publish starts one on a worker (see
// [workers]): drain sends the window's events after the last one sent, in
// order, each once, and goes on with those published meanwhile (a batch
// per worker, not a hand-off per event) until it has sent the last one.
// The handler waits for the run's end, the stream's failure or the
// client, not for each event. One drain runs at a time (sending, under
// r.mu), so the stream's Sends stay one at a time and in seq order.
//
// The bounds are [paced]'s: a Send under way for the send timeout closes
// the stream with [streamStalled] (the watchdog, one timer for the
// stream's life, not one per Send), and a stream that falls behind the
// window is handed back to its handler, which serves it from the log as
// [service.watchRun] does. The run never waits for the stream: publish
// only starts a drain.
type pusher struct {
	r       *run
	send    func(ev *turnstilev1.AgentEvent, wire []byte) error
	start   func(func())
	drainFn func() // p.drain, made once
	kick    chan struct{}
	buf     []*turnstilev1.AgentEvent // the drain's batch
	wbuf    [][]byte                  // and their wire forms

	// Under r.mu.
	next    uint64 // the seq of the last event sent (or in its Send, while sending)
	sending bool   // a drain is under way
	behind  bool   // the drain found the window past next: the handler reads the log
	err     error  // the Send's failure, which ends the stream

	stop    atomic.Bool // the handler left: no more Sends
	stalled atomic.Bool // a Send was under way for the send timeout

	// The watchdog: since is when the Send under way began (nanoseconds
	// after base, 0 between Sends); dog fires at most once per timeout
	// while none is, and at the timeout of the one under way.
	base    time.Time
	since   atomic.Int64
	timeout time.Duration
	dog     *time.Timer
}

// kickHandler tells the handler to look at the stream's state again.
func (p *pusher) kickHandler() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// drainIfBehind starts a drain when events after next wait and none is
// under way; r.mu is held.
func (p *pusher) drainIfBehind() {
	if p.sending || p.behind || p.err != nil || p.stop.Load() || p.next >= p.r.last {
		return
	}
	p.sending = true
	p.start(p.drainFn)
}

// drain sends the window's events after next until none is left, on a
// worker; see [pusher].
func (p *pusher) drain() {
	r := p.r
	for {
		r.mu.Lock()
		switch {
		case p.stop.Load():
			p.sending = false
			r.mu.Unlock()
			p.kickHandler()
			return
		case p.next+1 < r.first():
			p.behind, p.sending = true, false
			r.mu.Unlock()
			p.kickHandler()
			return
		case p.next >= r.last:
			p.sending = false
			done := r.done
			r.mu.Unlock()
			if done {
				p.kickHandler()
			}
			return
		}
		from := p.next + 1 - r.first()
		p.buf = append(p.buf[:0], r.window[from:]...)
		p.wbuf = append(p.wbuf[:0], r.wires[from:]...)
		r.mu.Unlock()
		for i, ev := range p.buf {
			wire := p.wbuf[i]
			p.buf[i], p.wbuf[i] = nil, nil
			if p.stop.Load() {
				clear(p.buf[i:])
				clear(p.wbuf[i:])
				break
			}
			p.since.Store(int64(time.Since(p.base)) | 1)
			err := p.send(ev, wire)
			p.since.Store(0)
			if err != nil {
				clear(p.buf[i:])
				clear(p.wbuf[i:])
				r.mu.Lock()
				p.err, p.sending = err, false
				r.mu.Unlock()
				p.kickHandler()
				return
			}
			r.mu.Lock()
			p.next = ev.GetSeq()
			r.mu.Unlock()
		}
	}
}

// watch is the watchdog's timer function: it closes the stream whose Send
// has been under way for the timeout, and is set again for when the Send
// under way (or the next) would reach it.
func (p *pusher) watch() {
	if p.stop.Load() {
		return
	}
	since := p.since.Load()
	if since == 0 {
		p.dog.Reset(p.timeout)
		return
	}
	if d := time.Since(p.base) - time.Duration(since); d < p.timeout {
		p.dog.Reset(p.timeout - d)
		return
	}
	p.stalled.Store(true)
	p.kickHandler()
}

// pushRun streams r, a run this replica created for this RPC, to send from
// its first event through a [pusher], and returns the status the stream
// ends with; send is given each event and its wire form as stored, when
// the window has it. A stream that falls behind the window goes on as
// [paced] streams, from the log.
func (s *service) pushRun(ctx context.Context, r *run, send func(ev *turnstilev1.AgentEvent, wire []byte) error) *status.Status {
	timeout := s.opts.SendTimeout
	p := &pusher{r: r, send: send, start: s.senders.run, kick: make(chan struct{}, 1), base: time.Now(), timeout: timeout}
	p.drainFn = p.drain
	p.dog = time.AfterFunc(timeout, p.watch)
	r.attach()
	defer r.leave(s.grace)
	r.mu.Lock()
	r.push = p
	p.drainIfBehind()
	r.mu.Unlock()
	// The run may have ended before: the handler looks once in any case.
	p.kickHandler()
	// leave ends the fast path: no drain starts after it; it waits for the
	// one under way unless its Send is stuck, which ends with the handler.
	leave := func() {
		p.stop.Store(true)
		p.dog.Stop()
		r.mu.Lock()
		r.push = nil
		sending := p.sending
		r.mu.Unlock()
		for sending && !p.stalled.Load() {
			t := time.NewTimer(timeout)
			select {
			case <-p.kick:
			case <-t.C:
				// The watchdog is stopped: a Send stuck this long ends with
				// the handler.
				p.stalled.Store(true)
			}
			t.Stop()
			r.mu.Lock()
			sending = p.sending
			r.mu.Unlock()
		}
	}
	for {
		select {
		case <-p.kick:
		case <-ctx.Done():
		}
		if p.stalled.Load() {
			leave()
			return streamStalled(timeout)
		}
		r.mu.Lock()
		err, behind, next := p.err, p.behind, p.next
		over := r.done && !p.sending && p.next >= r.last
		final := r.final
		if r.done && !over {
			p.drainIfBehind()
		}
		r.mu.Unlock()
		switch {
		case err != nil:
			leave()
			return status.Convert(err)
		case ctx.Err() != nil:
			leave()
			if p.stalled.Load() {
				return streamStalled(timeout)
			}
			return status.FromContextError(ctx.Err())
		case behind:
			leave()
			return paced(ctx, s, func(ev *turnstilev1.AgentEvent) error { return send(ev, nil) }, func(ev *turnstilev1.AgentEvent) *turnstilev1.AgentEvent { return ev },
				func(ctx context.Context, send func(*turnstilev1.AgentEvent) error) *status.Status {
					return s.watchRun(ctx, r, next, send)
				})
		case over:
			leave()
			return final
		}
	}
}
