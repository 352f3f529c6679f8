package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/admission"
	"github.com/turnstile-dev/turnstile/server/wire"
)

// takeovers take over the runs of replicas that died, as their lease
// expires, and end the orphanhood of runs a watch finds without a live
// owner: taken over here, or closed with a stored error event.
type takeovers struct{ rs *Runs }

// watch takes over, until ctx is done, every run whose owner died:
// another replica's, or this one's before a restart.
func (to takeovers) watch(ctx context.Context) {
	err := to.rs.store.WatchExpired(ctx, func(id string, attempt uint32) {
		to.rs.owned.turns.Add(1)
		go func() {
			defer to.rs.owned.turns.Done()
			to.takeOver(ctx, storedKey(id, attempt, to.rs.keys != nil))
		}()
	})
	if err != nil {
		to.rs.logger.Error("turn store: cannot watch for runs to take over", "error", err)
	}
}

// takeOver claims run k, whose owner went away, and continues it from
// its log. Of the replicas that try, one wins; the others do nothing. It
// reports false, having claimed nothing, when this replica may run no more
// turns (it drains, or runs max_running_turns or max_concurrent_turns, or
// its memory is near server.memory_limit: see [admission.Memory.Resume]):
// another replica takes the run. The turn holds a slot of the server's
// bounds as any turn does, and one of its client key's concurrent_turns:
// it was admitted within the key's limits where it started, so it goes on
// even when the key is at its limit here, and the key's new turns wait
// until it is back under.
func (to takeovers) takeOver(ctx context.Context, k Key) bool {
	leave, full := to.rs.gate.Enter()
	if full == nil && to.rs.owned.admit() != nil {
		leave()
		full = errors.New("draining or at server.max_running_turns")
	}
	var mem *admission.Resumed
	if full == nil {
		if mem, full = to.rs.memory.Resume(); full != nil {
			leave()
			to.rs.owned.unadmit()
		} else {
			enter := leave
			leave = func() { enter(); mem.End() }
		}
	}
	if full != nil {
		// Another replica takes it; if none may, the first watcher of the
		// run adopts it (adopt).
		to.rs.logger.Warn("turn not taken over: this server runs no more turns", "turn_id", k.TurnID, "attempt", k.Attempt, "reason", full.Error())
		return false
	}
	rctx, cancel := context.WithCancelCause(context.Background())
	r := newRun(k, nil, cancel)
	rec, raw, claims, err := to.rs.store.Claim(ctx, k.id(), k.Attempt, func(sig string) []byte { return to.rs.signals.answer(r, sig) })
	if err != nil {
		cancel(nil)
		leave()
		to.rs.owned.unadmit()
		to.rs.logger.Debug("turn store: run not taken over", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
		return true
	}
	r.takeover = uint32(claims)
	res, err := to.resumption(k, rec, raw, claims)
	first, tr, events := res.first, res.turn, res.events
	if err != nil || tr == nil {
		// Finished after all, or unreadable: give it up as it is.
		if err != nil {
			to.rs.logger.Error("turn store: cannot take the run over", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
		}
		_ = to.rs.store.Finish(ctx, k.id(), k.Attempt)
		cancel(nil)
		leave()
		to.rs.owned.unadmit()
		return true
	}
	r.hash = first.Hash
	mem.Name(first.Client)
	tr.Controls = r.ctl
	release := leave
	if key := to.rs.keys.Named(first.Client); key != nil {
		endKey := key.Hold()
		release = func() { leave(); endKey() }
		// The tokens used before the takeover were charged where they were
		// used.
		r.charge = key.ResumedCharger(tr.Resume.Usage)
		tr.Budget = r.charge.BudgetHook()
	}
	if !first.Deadline.IsZero() {
		var cancelDL context.CancelFunc
		rctx, cancelDL = context.WithDeadline(rctx, first.Deadline)
		stop := r.cancel
		r.cancel = func(cause error) { stop(cause); cancelDL() }
	}
	r.fill(events)
	to.rs.logger.Info("taking over a turn whose server went away", "turn_id", k.TurnID, "attempt", k.Attempt, "takeover", claims,
		"without_progress", res.fruitless, "last_seq", len(events), "discard_from_seq", tr.Resume.DiscardFromSeq,
		"continued", to.rs.runner.ContinuesCut(tr), "committed", len(tr.Resume.Committed), "abort", tr.Resume.Abort != nil)
	to.rs.owned.put(k, r)
	// Its clients re-attach, here or elsewhere; without any, the detach
	// grace ends it.
	r.touched(to.rs.grace)
	to.rs.own(rctx, r, tr, release)
	return true
}

// staleOrphan is how long ago a run without an owner must have stored
// its last event to be closed rather than resumed: the store's markers of
// expired leases, from which replicas take runs over, last as long. A
// client is unlikely to wait for such a run, whose resumption would spend
// tokens for nobody.
const staleOrphan = 10 * time.Minute

// adopt ends the orphanhood of run k, which a watcher found with no live
// owner and no terminal event (its replica died and no other took it
// over: all were full, or its lease expired so long ago that no replica
// was told, before a restart). A recent run is taken over as takeOver
// does; one whose last event is older than staleOrphan, or past its
// deadline, or that this replica may not run, is closed with a stored
// error event. Of the replicas that try, one claims the run. adopt returns
// nil when the run can be followed again, else the error to end with.
func (to takeovers) adopt(ctx context.Context, k Key) error {
	rec, err := to.rs.store.Record(ctx, k.id(), k.Attempt)
	if errors.Is(err, fs.ErrNotExist) {
		return ErrNotFound
	}
	if err != nil {
		to.rs.logger.Warn("turn store unreachable: orphaned run not read", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
		return ErrStoreUnreachable
	}
	// A record that cannot be read is zero here: its last event's time
	// decides, and takeOver gives it up.
	first, _ := readRecord(rec)
	lastAt := first.Started
	last, err := to.rs.lastEvent(ctx, k)
	if err != nil {
		to.rs.logger.Warn("turn store unreachable: orphaned run not read", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
		return ErrStoreUnreachable
	}
	if last != nil {
		if terminal(last) {
			return nil // it ended after all: following it again ends
		}
		lastAt = last.GetTime().AsTime()
	}
	if te := to.rs.owed.take(k); te != nil {
		// It ended here for want of room in the store, its clients told:
		// its end is stored, never a takeover.
		if _, ok := to.closeOrphan(ctx, k, te, "its last event did not fit in the turn store"); !ok {
			to.rs.owed.add(k, te)
			return ErrStoreUnreachable
		}
		return nil
	}
	var why string
	now := to.rs.now()
	switch {
	case !first.Deadline.IsZero() && now.After(first.Deadline):
		why = "its deadline passed"
	case now.Sub(lastAt) > staleOrphan:
		why = fmt.Sprintf("it stored nothing for over %s", staleOrphan)
	case to.takeOver(ctx, k):
		return nil
	default:
		why = "this server runs as many turns as it may"
	}
	yes := true
	to.closeOrphan(ctx, k, &runtime.TurnError{Kind: llm.KindUnavailable, Retryable: &yes,
		Message: fmt.Sprintf("the server running the turn went away and the turn was not resumed (%s); run its next attempt", why)}, why)
	return nil
}

// closeOrphan claims run k, which has no owner, and ends it with te as
// its stored error event (for a watcher that adopts it: UNAVAILABLE,
// retryable, telling the client to run the turn's next attempt), why being
// the reason logged. Another replica's claim wins over it, and a run whose
// log ends with a terminal event is given up as it is: a run has exactly
// one terminal event. It returns the seq of the event it stored, and
// whether it stored one.
func (to takeovers) closeOrphan(ctx context.Context, k Key, te *runtime.TurnError, why string) (uint64, bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var lastSeq atomic.Uint64
	_, raw, claims, err := to.rs.store.Claim(ctx, k.id(), k.Attempt, func(sig string) []byte {
		if sig != signalCancel {
			return nil
		}
		b, _ := json.Marshal(cancelReply{LastSeq: lastSeq.Load()})
		return b
	})
	if err != nil {
		to.rs.logger.Debug("turn store: orphaned run not claimed", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
		return 0, false
	}
	lastSeq.Store(uint64(len(raw)))
	ended := false
	if n := len(raw); n > 0 {
		ev := &turnstilev1.AgentEvent{}
		ended = proto.Unmarshal(raw[n-1], ev) == nil && terminal(ev)
	}
	seq := uint64(len(raw)) + 1
	if !ended {
		ev, err := wire.AgentEvent(runtime.Event{Seq: seq, Time: time.Now(), TurnID: k.TurnID, Payload: te})
		if err == nil {
			ev.Attempt, ev.Takeover = k.Attempt, uint32(claims)
			var b []byte
			if b, err = (proto.MarshalOptions{Deterministic: true}).Marshal(ev); err == nil {
				err = to.rs.store.Append(ctx, k.id(), k.Attempt, b, func(error) {})
			}
		}
		if err != nil {
			to.rs.logger.Error("turn store: cannot close an orphaned run", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
		}
	}
	if err := to.rs.store.Finish(ctx, k.id(), k.Attempt); err != nil {
		to.rs.logger.Error("turn store unreachable: orphaned run not closed", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
		return 0, false
	}
	if ended {
		return 0, false
	}
	to.rs.logger.Warn("closed a turn whose server went away, with an error event", "turn_id", k.TurnID, "attempt", k.Attempt,
		"last_seq", seq, "error_code", te.Kind.String(), "reason", why)
	return seq, true
}

// maxFruitless bounds the takeovers of one run that made no progress:
// a run whose owners went away that many times before storing any of the
// turn's work (runtime.Advances: the model's output, a committed message,
// a tool's result, a compaction) since they took it over (they keep going away, or the
// turn itself brings them down) ends at its next takeover with a
// retryable UNAVAILABLE error instead of looping. Takeovers that made
// progress do not count: a long turn whose owners keep being killed goes
// on, within its own bounds (turn.max_model_calls, its deadline).
const maxFruitless = 3

// resumption is what a takeover resumes a run from.
type resumption struct {
	// first is the run's first record.
	first runRecord
	// turn is the runtime request, its Resume set; nil when the run
	// already ended.
	turn *runtime.TurnRequest
	// events are the run's stored events.
	events []*turnstilev1.AgentEvent
	// fruitless counts the takeovers before this one that made no
	// progress.
	fruitless int
}

// resumption rebuilds what a takeover of run k resumes it from: its first
// record, rec, and its stored events, raw, which the runtime folds into
// the state the turn goes on from (runtime.ResumeFrom). claims counts the
// run's takeovers, this one's included.
func (to takeovers) resumption(k Key, rec []byte, raw [][]byte, claims int) (resumption, error) {
	first, err := readRecord(rec)
	if err != nil {
		return resumption{}, err
	}
	req := &turnstilev1.RunTurnRequest{}
	if err := proto.Unmarshal(first.Request, req); err != nil {
		return resumption{}, fmt.Errorf("run request: %w", err)
	}
	tr, bad := wire.TurnRequest(context.Background(), req, wire.Checks{MaxMediaBytes: to.rs.checks.MaxMediaBytes, MaxRequestMediaBytes: to.rs.checks.MaxRequestMediaBytes})
	if len(bad) > 0 {
		return resumption{}, fmt.Errorf("run request: %v", bad[0])
	}
	tr.TurnID, tr.Client = k.TurnID, first.Client
	if first.Model != "" {
		tr.Model = first.Model
	}
	events := make([]*turnstilev1.AgentEvent, len(raw))
	for i, b := range raw {
		ev := &turnstilev1.AgentEvent{}
		if err := proto.Unmarshal(b, ev); err != nil {
			return resumption{}, fmt.Errorf("event %d: %w", i+1, err)
		}
		events[i] = ev
	}
	if n := len(events); n > 0 && terminal(events[n-1]) {
		return resumption{first: first}, nil // it ended after all
	}
	evs, err := runtimeEvents(events)
	if err != nil {
		return resumption{}, err
	}
	rs, err := runtime.ResumeFrom(evs)
	if err != nil || rs == nil {
		return resumption{first: first}, err
	}
	fruitless := fruitlessTakeovers(events, evs, claims)
	if fruitless >= maxFruitless {
		rs.Abort = &llm.Error{Kind: llm.KindUnavailable, Message: fmt.Sprintf(
			"the turn was taken over %d times, %d of them without progress (at most %d): the servers running it kept going away; run it again",
			claims, fruitless, maxFruitless)}
	}
	tr.Resume = rs
	return resumption{first: first, turn: tr, events: events, fruitless: fruitless}, nil
}

// fruitlessTakeovers counts the takeovers of a run, before the one claims
// counts (this one's included), whose owner stored none of the turn's work
// (runtime.Advances) before it went away: each stored event names the
// takeover that stored it, and events its runtime form. A takeover by a
// replica of the version before, whose events name none, counts as one
// that made no progress.
func fruitlessTakeovers(stored []*turnstilev1.AgentEvent, events []runtime.Event, claims int) int {
	progressed := map[uint32]bool{}
	for i, ev := range stored {
		if runtime.Advances(events[i].Payload) {
			progressed[ev.GetTakeover()] = true
		}
	}
	n := 0
	for t := 1; t < claims; t++ {
		if !progressed[uint32(t)] {
			n++
		}
	}
	return n
}

// runtimeEvents reads a run's stored events back into the runtime's form
// (wire.RuntimeEvent), for the runtime to rebuild the turn from
// (runtime.ResumeFrom).
func runtimeEvents(events []*turnstilev1.AgentEvent) ([]runtime.Event, error) {
	out := make([]runtime.Event, len(events))
	for i, stored := range events {
		ev, err := wire.RuntimeEvent(stored)
		if err != nil {
			return nil, fmt.Errorf("event %d: %w", i+1, err)
		}
		out[i] = ev
	}
	return out, nil
}
