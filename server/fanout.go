package server

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
)

// run is a run this replica owns: its acknowledged events, fanned out to
// the clients watching it here.
type run struct {
	key    runKey
	hash   []byte
	cancel context.CancelCauseFunc
	ended  chan struct{} // closed once the run is over and its log flushed

	mu     sync.Mutex
	events []*turnstilev1.AgentEvent // acknowledged, in order: events[i].Seq == i+1
	done   bool
	final  *status.Status // how watchers end, once done
	wake   chan struct{}  // closed and replaced when something changes
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
}

func newRun(k runKey, hash []byte, cancel context.CancelCauseFunc) *run {
	return &run{key: k, hash: hash, cancel: cancel, ended: make(chan struct{}), wake: make(chan struct{})}
}

// publish adds an acknowledged event and wakes the watchers.
func (r *run) publish(ev *turnstilev1.AgentEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return
	}
	r.events = append(r.events, ev)
	close(r.wake)
	r.wake = make(chan struct{})
}

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

// watch sends the run's events after afterSeq to send as they are
// acknowledged, and returns the status the stream ends with.
func (r *run) watch(ctx context.Context, afterSeq uint64, send func(*turnstilev1.AgentEvent) error, grace time.Duration) *status.Status {
	r.attach()
	defer r.leave(grace)
	next := afterSeq
	for {
		r.mu.Lock()
		var evs []*turnstilev1.AgentEvent
		if next < uint64(len(r.events)) {
			evs = r.events[next:]
		}
		done, final, wake := r.done, r.final, r.wake
		r.mu.Unlock()
		for _, ev := range evs {
			if err := send(ev); err != nil {
				return status.Convert(err)
			}
			next++
		}
		if len(evs) > 0 {
			continue
		}
		if done {
			return final
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err())
		}
	}
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
		if idle {
			r.cancel(&llm.Error{Kind: llm.KindCancelled, Message: fmt.Sprintf("no client watched the turn for %s (the server's detach grace)", grace)})
		}
	})
}

// lastSeq returns the seq of the last acknowledged event.
func (r *run) lastSeq() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return uint64(len(r.events))
}
