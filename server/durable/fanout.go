package durable

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/admission"
	"github.com/turnstile-dev/turnstile/server/delivery"
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
// windows (plus the newest event of each, which the window always keeps,
// outside the bound). The window holds each event once, as its wire form:
// what a stream sends and the log stores.
const (
	// windowEvents bounds the events of a run's window.
	windowEvents = 256
	// windowBytes bounds the wire size of those before the newest.
	windowBytes = 64 << 10
	// windowFirstCap is the window's first capacity: the events of a short
	// turn (a reply of a few dozen deltas).
	windowFirstCap = 32
)

// run is a run this replica owns: the window of its latest acknowledged
// events, fanned out to the clients watching it here.
type run struct {
	key    Key
	hash   []byte
	cancel context.CancelCauseFunc
	ended  chan struct{} // closed once the run is over and its log flushed

	mu sync.Mutex
	// window holds the wire forms, as stored, of the latest acknowledged
	// events, in order: window[i] is the event of seq
	// last-len(window)+1+i. Each is the event's only form here: streams
	// send it as it is, and nothing keeps the event decoded beside it
	// (the text of a reply's merged deltas would be held twice).
	window     [][]byte
	windowSize int    // the sum of the window's lengths
	last       uint64 // the seq of the last acknowledged event
	done       bool
	final      error // how watchers end, once done: nil when the turn completed
	// wake is closed and replaced when something changes, once a waiter
	// took it (wakeTaken; see wakeChan): an event no one waits for costs
	// no channel.
	wake      chan struct{}
	wakeTaken bool
	// streams are the streams that follow the run here, fed from its
	// window by their own workers: publish kicks them (see
	// [delivery.Stream]).
	streams []*delivery.Stream[Item]
	// watchers counts the streams following the run here; seen is when
	// the last one left or a watcher elsewhere last said it watches.
	watchers int
	seen     time.Time
	detach   *time.Timer
	// heard is when a client last said it is there without a stream
	// here: a watcher elsewhere said it watches, or a client approved or
	// steered; stalledOut says the last stream here was closed stuck, and
	// none followed; a sink waiting for a reader waits on readerWake
	// (unread.go).
	heard      time.Time
	stalledOut bool
	readerWake chan struct{}
	stopped    bool // CancelTurn stopped it
	// charge spends the tokens the run uses from its client key's limits;
	// nil without keys.
	charge *admission.Charger
	// handedOff is set when this replica, shutting down, gives the run to
	// another: nothing more of it is stored here.
	handedOff atomic.Bool
	// takeover is the run's takeover that this replica owns it by: 0 for
	// the replica that created it. Every event it stores carries it
	// (AgentEvent.takeover), so the next takeover tells one that made
	// progress from one that did not (see fruitless).
	takeover uint32
	// ctl reaches the turn (approvals, steering; approve.go).
	ctl *runtime.Controls
}

func newRun(k Key, hash []byte, cancel context.CancelCauseFunc) *run {
	return &run{key: k, hash: hash, cancel: cancel, ended: make(chan struct{}), wake: make(chan struct{}), ctl: runtime.NewControls()}
}

// publish adds the acknowledged event of seq seq, whose wire form as
// stored is wire, to the window, drops the oldest ones beyond its bounds,
// and wakes the watchers. wire is never changed afterwards: streams send
// it, and gRPC may queue it, as it is.
func (r *run) publish(seq uint64, wire []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return
	}
	r.add(seq, wire)
	for _, out := range r.streams {
		out.Kick()
	}
	r.wakeUp()
}

// Item is an event of a run as a stream sends it: its seq and its wire
// form as stored (what the log holds), which the stream sends as it is,
// without decoding or encoding it again.
type Item struct {
	// Seq is the event's seq.
	Seq uint64
	// Wire is the event's wire form as stored; it is never changed.
	Wire []byte
}

// Next implements [delivery.Feed]: the window's events after seq after.
func (r *run) Next(after uint64, buf []Item) ([]Item, delivery.State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	first := r.first()
	if after+1 < first {
		return buf, delivery.Behind
	}
	for i := int(after + 1 - first); i < len(r.window); i++ {
		buf = append(buf, Item{Seq: first + uint64(i), Wire: r.window[i]})
	}
	if r.done {
		return buf, delivery.Over
	}
	return buf, delivery.Open
}

// Seq implements [delivery.Feed].
func (r *run) Seq(it Item) uint64 { return it.Seq }

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

// add appends the event of seq seq, whose wire form is wire, to the window
// and keeps the window within its bounds, the newest event always; r.mu
// is held.
func (r *run) add(seq uint64, wire []byte) {
	if r.window == nil {
		// A turn's events in one allocation, not one per doubling.
		r.window = make([][]byte, 0, windowFirstCap)
	}
	r.window = append(r.window, wire)
	r.windowSize += len(wire)
	r.last = seq
	// The bytes bound the events before the newest: a large event (the
	// deltas merged over a store's round trip, a completed message) does
	// not push out the events before it, which a stream one Send behind
	// has still to send. It pushed them all out, so that every stream not
	// at the run's very end fell behind and read the log, whose reads load
	// the embedded server's 8 MB blocks (issue 37, row 2).
	n := 0
	for len(r.window)-n > 1 && (len(r.window)-n > windowEvents || r.windowSize-len(wire) > windowBytes) {
		r.windowSize -= len(r.window[n])
		r.window[n] = nil
		n++
	}
	if n > 0 {
		// Shift in place: the backing array stays at the window's bound.
		r.window = append(r.window[:0], r.window[n:]...)
		clear(r.window[len(r.window):cap(r.window)])
	}
}

// fill sets the window from the events of a run taken over, read from its
// log (events[i].Seq == i+1): their tail, within the window's bounds, in
// the wire form they are stored in (the log's deterministic encoding). An
// event that does not encode (none this server stored) leaves out of the
// window it and those before it, which its watchers read from the log.
func (r *run) fill(events []*turnstilev1.AgentEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range events[max(0, len(events)-windowEvents):] {
		b, err := marshalEvent(ev)
		if err != nil {
			clear(r.window)
			r.window, r.windowSize = r.window[:0], 0
			continue
		}
		r.add(ev.GetSeq(), b)
	}
	r.last = uint64(len(events))
}

// first returns the seq of the oldest event in the window (last+1 when it
// is empty); r.mu is held.
func (r *run) first() uint64 { return r.last + 1 - uint64(len(r.window)) }

// finish ends the run for its watchers with err (nil: the turn
// completed).
func (r *run) finish(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.detach != nil {
		r.detach.Stop()
	}
	if r.done {
		return
	}
	r.done, r.final = true, err
	r.wakeUp()
	for _, out := range r.streams {
		out.Kick()
	}
}

// watchRun streams r, a run this replica owns, to out from the event
// after afterSeq, and returns the error the stream ends with (nil: the
// turn completed and its last event was sent); final says the stream
// ended with the run, having sent its last event. out is fed from r's
// window by its own workers (publish kicks it); the handler is woken only
// when the stream ends or falls behind the window, when it sends what it
// missed from the log until the stream is back within it.
func (rs *Runs) watchRun(ctx context.Context, r *run, afterSeq uint64, out *delivery.Stream[Item]) (final bool, err error) {
	r.attach(out)
	defer func() {
		r.leave(out, rs.grace, out.Stalled() || errors.Is(err, delivery.ErrStalled) || errors.Is(context.Cause(ctx), delivery.ErrStalled))
	}()
	out.Follow(r, afterSeq)
	for {
		err := out.Wait(ctx)
		switch {
		case err == nil:
			r.mu.Lock()
			defer r.mu.Unlock()
			return true, r.final
		case errors.Is(err, delivery.ErrBehind):
			if done, err := rs.fromLog(ctx, r, out); done {
				return false, err
			}
			out.Resume()
		default:
			return false, err
		}
	}
}

// fromLog sends the events of r after the last one out sent from the log
// until out is back within r's window; done says the stream ended
// instead, with err.
func (rs *Runs) fromLog(ctx context.Context, r *run, out *delivery.Stream[Item]) (done bool, err error) {
	k := r.key
	next := out.Sent()
	rs.logger.Debug("a watcher fell behind the turn's window: served from the log", "turn_id", k.TurnID, "attempt", k.Attempt, "after_seq", next)
	for b, err := range rs.store.Events(ctx, k.id(), k.Attempt, next) {
		if err != nil {
			if ctx.Err() != nil {
				return true, ctx.Err()
			}
			rs.logger.Warn("turn store: watch ended", "turn_id", k.TurnID, "attempt", k.Attempt, "after_seq", next, "error", err)
			return true, ErrStoreUnreachable
		}
		ev := &turnstilev1.AgentEvent{}
		if err := proto.Unmarshal(b, ev); err != nil {
			rs.logger.Error("turn store: undecodable event", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
			return true, ErrCorrupt
		}
		if ev.GetSeq() != next+1 {
			rs.logger.Error("turn store: an event out of order in the log", "turn_id", k.TurnID, "attempt", k.Attempt, "seq", ev.GetSeq(), "want", next+1)
			return true, ErrCorrupt
		}
		if err := out.Put(Item{Seq: ev.GetSeq(), Wire: b}); err != nil {
			return true, err
		}
		next = ev.GetSeq()
		if terminal(ev) {
			return true, outcome(ev)
		}
		r.mu.Lock()
		back := next+1 >= r.first()
		r.mu.Unlock()
		if back {
			return false, nil
		}
	}
	return true, ctx.Err()
}

// stream streams run k after afterSeq to send, as watchRun and follow
// do, through one [delivery.Stream] under the send timeout: r, when not
// nil, is the run, which this replica owns (the stream of the RPC that
// created it). A client that accepts no event for the send timeout has its
// stream closed with delivery.ErrStalled, also while no new event comes
// (the stream's context ends then); the turn goes on. It returns once the
// last event was sent, or the stream stalled; final says the stream ended
// with the run it watched here.
func (rs *Runs) stream(ctx context.Context, k Key, r *run, afterSeq uint64, send func(Item) error) (final bool, err error) {
	fctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	out := delivery.New(send, rs.streams.SendTimeout, rs.streams.Start, func() { stop(delivery.ErrStalled) })
	if r != nil {
		final, err = rs.watchRun(fctx, r, afterSeq, out)
	} else {
		err = rs.follow(fctx, k, afterSeq, out)
	}
	ferr := out.Flush()
	switch {
	case errors.Is(ferr, delivery.ErrStalled), ctx.Err() == nil && errors.Is(context.Cause(fctx), delivery.ErrStalled):
		// The stream's outcome was not delivered.
		final, err = false, delivery.ErrStalled
	case ferr != nil && err == nil:
		final, err = false, ferr
	}
	out.Close()
	return final, err
}

// attach counts out as a watcher of r, which feeds it from now on.
func (r *run) attach(out *delivery.Stream[Item]) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.streams = append(r.streams, out)
	r.watchers++
	r.stalledOut = false
	r.wakeAwaiting()
	if r.detach != nil {
		r.detach.Stop()
	}
}

// leave stops feeding out and counts its watcher out; when none is left,
// the run is cancelled after grace unless a watcher comes back or one
// elsewhere says it watches. stuck says out was closed because its client
// read nothing for the send timeout: the last stream closed so leaves the
// run waiting for a reader (unread.go).
func (r *run) leave(out *delivery.Stream[Item], grace time.Duration, stuck bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.streams = slices.DeleteFunc(r.streams, func(o *delivery.Stream[Item]) bool { return o == out })
	r.watchers--
	r.seen = time.Now()
	if len(r.streams) == 0 {
		r.stalledOut = stuck
	}
	r.wakeAwaiting()
	if r.watchers == 0 && !r.done {
		r.armDetach(grace)
	}
}

// touched records that a watcher on another replica follows the run.
func (r *run) touched(grace time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = time.Now()
	r.heard = r.seen
	r.wakeAwaiting()
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
