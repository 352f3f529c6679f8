package server

import (
	"context"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// localTurn is a turn that runs without a store: it lives in the RunTurn
// stream that runs it, on this replica, and CancelTurn, ApproveToolCall
// and SteerTurn reach it only here.
type localTurn struct {
	cancel  context.CancelCauseFunc
	client  string // the name of its client key; "" without keys
	turnID  string
	attempt uint32
	ctl     *runtime.Controls
	// ended is closed once the turn has sent its last event, whose seq
	// lastSeq then is; stopped is set, under the turns' mu, by the
	// CancelTurn that stopped it.
	ended   chan struct{}
	lastSeq uint64
	stopped bool
}

// localTurns are the turns running here without a store.
type localTurns struct {
	mu       sync.Mutex
	draining bool
	active   map[*localTurn]struct{}
}

func newLocalTurns() *localTurns { return &localTurns{active: map[*localTurn]struct{}{}} }

// track counts t in, unless the server drains.
func (l *localTurns) track(t *localTurn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.draining {
		return false
	}
	l.active[t] = struct{}{}
	return true
}

func (l *localTurns) untrack(t *localTurn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.active, t)
}

// drain makes track refuse new turns.
func (l *localTurns) drain() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.draining = true
}

// cancelAll cancels every turn with cause, and returns how many there
// were.
func (l *localTurns) cancelAll(cause error) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	for t := range l.active {
		t.cancel(cause)
	}
	return len(l.active)
}

// find returns the turn turnID of client running here, its latest
// attempt when attempt is 0; nil when it runs elsewhere or has ended.
// l.mu is held.
func (l *localTurns) find(client, turnID string, attempt uint32) *localTurn {
	var best *localTurn
	for t := range l.active {
		if t.client != client || t.turnID != turnID {
			continue
		}
		if attempt != 0 && t.attempt != attempt {
			continue
		}
		if best == nil || t.attempt > best.attempt {
			best = t
		}
	}
	return best
}

// controls returns the controls of the turn turnID of client running
// here, and its attempt; nil when it runs elsewhere or has ended.
func (l *localTurns) controls(client, turnID string, attempt uint32) (*runtime.Controls, uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t := l.find(client, turnID, attempt); t != nil {
		return t.ctl, t.attempt
	}
	return nil, 0
}

// stop cancels the turn turnID of client running here as a durable run
// is cancelled, and returns it once its stream has sent the last event;
// cancelled says this call stopped it. It returns nil when the turn runs
// elsewhere or has ended, and ctx's error when ctx ended first.
func (l *localTurns) stop(ctx context.Context, client, turnID string, attempt uint32) (t *localTurn, cancelled bool, err error) {
	l.mu.Lock()
	t = l.find(client, turnID, attempt)
	if t != nil {
		select {
		case <-t.ended:
		default:
			cancelled = !t.stopped
			t.stopped = true
		}
	}
	l.mu.Unlock()
	if t == nil {
		return nil, false, nil
	}
	t.cancel(&llm.Error{Kind: llm.KindCancelled, Message: "the turn was cancelled by CancelTurn"})
	select {
	case <-t.ended:
	case <-ctx.Done():
		return t, cancelled, ctx.Err()
	}
	return t, cancelled, nil
}

// notHere is the status of ApproveToolCall and SteerTurn on a server that
// keeps no turn log, for a turn that does not run on it.
func notHere() *status.Status {
	return status.New(codes.FailedPrecondition, "this server keeps no turn log (store.mode: off) and the turn does not run on it: send the call to the server running the turn")
}
