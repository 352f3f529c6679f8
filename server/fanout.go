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
// windows (plus the newest event of each, which the window always keeps).
const (
	// windowEvents bounds the events of a run's window.
	windowEvents = 256
	// windowBytes bounds their wire size.
	windowBytes = 64 << 10
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
	// window[i].Seq == last-len(window)+1+i; sizes their wire sizes.
	window     []*turnstilev1.AgentEvent
	sizes      []int
	windowSize int    // the sum of sizes
	last       uint64 // the seq of the last acknowledged event
	done       bool
	final      *status.Status // how watchers end, once done
	wake       chan struct{}  // closed and replaced when something changes
	// watchers counts the streams following the run here; seen is when
	// the last one left or a watcher elsewhere last said it watches.
	watchers int
	seen     time.Time
	detach   *time.Timer
	stopped  bool // CancelTurn stopped it
	// charge spends the tokens the run uses from its client key's limits;
	// nil without keys.
	charge *usageCharger
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
func (r *run) publish(ev *turnstilev1.AgentEvent, size int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return
	}
	r.add(ev, size)
	close(r.wake)
	r.wake = make(chan struct{})
}

// add appends ev to the window and keeps the window within its bounds,
// the newest event always; r.mu is held.
func (r *run) add(ev *turnstilev1.AgentEvent, size int) {
	r.window = append(r.window, ev)
	r.sizes = append(r.sizes, size)
	r.windowSize += size
	r.last = ev.GetSeq()
	n := 0
	for len(r.window)-n > 1 && (len(r.window)-n > windowEvents || r.windowSize > windowBytes) {
		r.windowSize -= r.sizes[n]
		r.window[n] = nil
		n++
	}
	if n > 0 {
		// Shift in place: the backing arrays stay at the window's bound.
		r.window = append(r.window[:0], r.window[n:]...)
		r.sizes = append(r.sizes[:0], r.sizes[n:]...)
		clear(r.window[len(r.window):cap(r.window)])
	}
}

// fill sets the window from the events of a run taken over, read from its
// log (events[i].Seq == i+1): their tail, within the window's bounds.
func (r *run) fill(events []*turnstilev1.AgentEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range events[max(0, len(events)-windowEvents):] {
		r.add(ev, proto.Size(ev))
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
	close(r.wake)
	r.wake = make(chan struct{})
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
		done, final, wake := r.done, r.final, r.wake
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
