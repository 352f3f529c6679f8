package durable

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// storeFullRetry is the wait advised to the client of a turn the store
// had no room left for: new turns are refused until space returns, which
// the keeper checks every second.
const storeFullRetry = 5 * time.Second

// errStoreSpent ends the runs owned here when the store says its disk
// filled past its reserve: each stores it as its terminal error
// (STORE_FULL, retryable) in what is left of the reserve.
var errStoreSpent = &llm.Error{Kind: llm.KindStoreFull, RetryAfter: storeFullRetry,
	Message: "the disk under the turn store filled past its reserve (store.reserve) and the turn was ended; run its next attempt once space returns"}

// endsTurns reports whether full, the store's refusal of new runs, says
// that the runs running must end too; the store's error says so by a
// method, as this package does not import the store.
func endsTurns(full error) bool {
	var e interface{ EndsTurns() bool }
	return errors.As(full, &e) && e.EndsTurns()
}

// StoreRoom is told each change of whether the store takes new runs:
// full is nil when it does, else why not (package store's Store.OnRoom,
// through the server). When the store says the runs running must end (its
// disk filled past its reserve), every run owned here ends with a stored
// STORE_FULL error. When it takes runs again, the runs whose last event
// could not be stored for want of room get it stored now (see [owed]).
func (rs *Runs) StoreRoom(full error) {
	switch {
	case endsTurns(full):
		if n := rs.owned.cancelAll(errStoreSpent); n > 0 {
			rs.logger.Error("turn store full past its reserve: the running turns end with STORE_FULL", "turns", n)
		}
	case full == nil:
		rs.owed.settle(rs)
	}
}

// owed are the runs owned here whose terminal event could not be stored
// for want of room (their last appends failed on a full disk): their
// clients were told to watch them again, and each is owed its terminal
// error, stored once the store has room again, or when a watch adopts it
// first, instead of being taken over: a turn that ended here is never
// finished later elsewhere.
type owed struct {
	mu   sync.Mutex
	runs map[Key]*runtime.TurnError
}

// add records that run k is owed te.
func (o *owed) add(k Key, te *runtime.TurnError) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.runs == nil {
		o.runs = map[Key]*runtime.TurnError{}
	}
	o.runs[k] = te
}

// take returns what run k is owed and forgets it; nil when nothing.
func (o *owed) take(k Key) *runtime.TurnError {
	o.mu.Lock()
	defer o.mu.Unlock()
	te := o.runs[k]
	delete(o.runs, k)
	return te
}

// settle stores the terminal error of each run owed one, on its own
// goroutine; one that cannot be stored yet stays owed.
func (o *owed) settle(rs *Runs) {
	o.mu.Lock()
	runs := o.runs
	o.runs = nil
	o.mu.Unlock()
	if len(runs) == 0 {
		return
	}
	rs.owned.turns.Add(1)
	go func() {
		defer rs.owned.turns.Done()
		for k, te := range runs {
			if _, ok := rs.takeovers.closeOrphan(context.Background(), k, te, "its last event did not fit in the turn store"); ok {
				continue
			}
			// Not stored: kept for the next time, unless the log ended
			// the run since (closeOrphan stores nothing then, either).
			if last, err := rs.lastEvent(context.Background(), k); err != nil || last == nil || !terminal(last) {
				o.add(k, te)
			}
		}
	}()
}

// storeFullError is the terminal error a run owes when its events did not
// fit in the store: STORE_FULL, retryable.
func storeFullError() *runtime.TurnError {
	yes := true
	return &runtime.TurnError{Kind: llm.KindStoreFull, Retryable: &yes, RetryAfter: storeFullRetry, Message: errStoreSpent.Message}
}
