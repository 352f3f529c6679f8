package durable

import (
	"context"
	"time"

	"github.com/turnstile-dev/turnstile/server/delivery"
)

// A run nobody reads waits for a reader: it goes no faster than its
// clients read.
//
// A durable turn outlives its stream, so a client that stops reading does
// not stop it, as it does without a store (gRPC's flow control holds the
// turn's sink there). Left alone, every turn whose client reads nothing
// would run to its end at the model's pace, each holding its whole reply
// and encoding it for the log and the stream meanwhile: 300 such streams
// with 20,000-word replies took the server to 3.6 times the memory of the
// same streams without a store (issue 37). So the sink of a run whose
// every stream here lags (with more than a window's bytes of the run still
// to send, or events the window no longer holds: its client reads slower
// than the model writes, or not at all), and which no watcher elsewhere
// reads, waits before it stores the next event, its last included, as the
// turn without a store waits for its Send: the runtime stops reading the
// model's stream, and the run holds what a turn without a store holds, no
// more than a window ahead of what its stream sent. A run whose last
// stream here was closed for reading nothing for the send timeout keeps
// waiting while no client watches it: its detach grace then cancels it,
// as it cancels a run nobody watches. A client that reads on, watches it
// (here or elsewhere), approves or steers it, or cancels it ends the wait;
// a run being cancelled, stopped or handed off never waits, so it stores
// its last events.
//
// The signal is the run's alone (unread, from its streams' positions and
// what clients said): it is checked in the run's sink, before anything
// else there, and touches neither the runtime nor the store, so a pace
// set elsewhere (a floor between stored events, say) composes with it.
//
// So what a client that reads slowly, or not at all, makes the server hold
// is bounded as without a store: per turn, gRPC's queue of its stream (64
// KiB), the run's window (64 KiB, and its newest event) and the batch its
// stream took from it; per key, that many times its concurrent_turns; in
// all, max_running_turns times.

// The pauses of a sink waiting for a reader between two looks at its run: short at first,
// so that a client that reads slowly is not held up, then longer, so that
// runs nobody reads cost next to nothing. A client attaching or watching
// ends the pause at once.
const (
	readerCheckMin = 5 * time.Millisecond
	readerCheckMax = 200 * time.Millisecond
)

// unread reports whether nobody reads the run now: it has streams here and
// each lags behind its window, or its last one was closed stalled and none
// followed; and no client said it is there otherwise (a watcher elsewhere,
// an approval, a steering message) within grace. r.mu is held.
func (r *run) unread(grace time.Duration) bool {
	if r.done || time.Since(r.heard) < grace {
		return false
	}
	if len(r.streams) == 0 {
		return r.stalledOut
	}
	for _, out := range r.streams {
		if !r.lags(out) {
			return false
		}
	}
	return true
}

// lags reports whether out has more than a window's bytes of the run's
// events still to send, or needs events the window no longer holds; r.mu
// is held.
func (r *run) lags(out *delivery.Stream[Item]) bool {
	sent := out.Sent()
	first := r.first()
	if sent+1 < first {
		return true
	}
	ahead := 0
	for _, b := range r.window[sent+1-first:] {
		ahead += len(b)
	}
	return ahead > windowBytes
}

// awaitReader waits while nobody reads the run (see unread), until ctx, the
// run's own context, is done or the run is handed off.
func (r *run) awaitReader(ctx context.Context, grace time.Duration) {
	wait := readerCheckMin
	for ctx.Err() == nil && !r.handedOff.Load() {
		r.mu.Lock()
		unread := r.unread(grace)
		wake := r.readerWake
		if unread && wake == nil {
			wake = make(chan struct{})
			r.readerWake = wake
		}
		r.mu.Unlock()
		if !unread {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-wake:
		case <-t.C:
		}
		t.Stop()
		wait = min(2*wait, readerCheckMax)
	}
}

// heardFrom records that a client acts on the run (it approves or
// steers): a sink waiting for a reader goes on, so that what the
// client did is stored at once.
func (r *run) heardFrom() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.heard = time.Now()
	r.wakeAwaiting()
}

// wakeAwaiting ends a sink's wait for a reader at once: a client attached, watches,
// or left; r.mu is held.
func (r *run) wakeAwaiting() {
	if r.readerWake != nil {
		close(r.readerWake)
		r.readerWake = nil
	}
}

// ShedUnread ends with cause every run of client key client ("" without
// keys) whose turn runs here and that nobody reads now (see unread), and
// returns how many it ended: the server sheds them when its memory is near
// its limit (server.memory_limit), so that what they hold goes to the
// turns that are read. A run that waits for a reader stops waiting once
// cancelled, so each stores cause as its terminal error, which its client
// reads when it reads on or watches the turn again.
func (rs *Runs) ShedUnread(client string, cause error) int {
	return rs.owned.cancelUnread(client, rs.grace, cause)
}

// cancelUnread ends with cause the runs of client running here that
// nobody reads (see [Runs.ShedUnread]).
func (o *owned) cancelUnread(client string, grace time.Duration, cause error) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for r := range o.running {
		if r.key.Client != client {
			continue
		}
		r.mu.Lock()
		unread := r.unread(grace)
		r.mu.Unlock()
		if unread {
			r.cancel(cause)
			n++
		}
	}
	return n
}
