package durable

import (
	"context"
	"errors"
	"io/fs"
	"iter"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/admission"
	"github.com/turnstile-dev/turnstile/server/wire"
)

// TurnStore is the durable log of runs that [Runs] needs; package store
// implements it over NATS JetStream. A run is one attempt of one
// turn. The store holds bytes: Runs stores each run's record
// (its request) and each event in its wire form, so what a watcher
// replays is what live clients were sent.
type TurnStore interface {
	// Create stores record as the first record of the run unless the run
	// exists; then it returns the run's first record. The creator owns
	// the run: it appends with Append, answers signals with onSignal, and
	// ends with Finish. Of concurrent Creates on any replicas, one creates.
	Create(ctx context.Context, turnID string, attempt uint32, record []byte, onSignal func(signal string) []byte) (created bool, existing []byte, err error)
	// Append appends an event without waiting for its acknowledgement;
	// done reports it, in order.
	Append(ctx context.Context, turnID string, attempt uint32, event []byte, done func(error)) error
	// Finish waits for every append's acknowledgement and gives the run up.
	Finish(ctx context.Context, turnID string, attempt uint32) error
	// Release waits for every append's acknowledgement and gives up a run
	// that has not ended, for another replica to take it over at once
	// (WatchExpired reports it there).
	Release(ctx context.Context, turnID string, attempt uint32) error
	// Record returns the run's first record, or an error matching
	// fs.ErrNotExist.
	Record(ctx context.Context, turnID string, attempt uint32) ([]byte, error)
	// LatestAttempt returns the highest attempt of the turn stored, or an
	// error matching fs.ErrNotExist.
	LatestAttempt(ctx context.Context, turnID string) (uint32, error)
	// Events yields the run's events after the first afterSeq, then each
	// one as it is stored, until the caller stops; it yields an error
	// when the store fails or the run's owner went away.
	Events(ctx context.Context, turnID string, attempt uint32, afterSeq uint64) iter.Seq2[[]byte, error]
	// LastEvent returns the run's last stored event, or an error matching
	// fs.ErrNotExist when it has none.
	LastEvent(ctx context.Context, turnID string, attempt uint32) ([]byte, error)
	// Signal sends a signal to the run's owner and returns its reply, or
	// an error matching fs.ErrNotExist when no replica owns the run.
	Signal(ctx context.Context, turnID string, attempt uint32, signal string) ([]byte, error)
	// Notify sends a signal to the run's owner without waiting.
	Notify(turnID string, attempt uint32, signal string)
	// WatchExpired calls fn with each run whose owner's lease expired
	// (the replica died) until ctx is done.
	WatchExpired(ctx context.Context, fn func(turnID string, attempt uint32)) error
	// Claim takes over a run whose owner's lease expired: it fences the
	// old owner out and returns the run's first record and every event
	// stored, and how many times the run was claimed, this claim's
	// included. The claimer then owns the run as its creator would.
	Claim(ctx context.Context, turnID string, attempt uint32, onSignal func(signal string) []byte) (record []byte, events [][]byte, claims int, err error)
}

// Signals sent to the owner of a run.
const (
	signalCancel = "cancel"
	signalWatch  = "watch"
	// signalLost comes from this replica's own store when another replica
	// took the run over (store.SignalLost).
	signalLost = "lost"
)

// Key names a run: one attempt of one turn of one client key.
type Key struct {
	// Client is the name of the client key whose turn it is; "" without
	// keys.
	Client string
	// TurnID is the turn's id as the client sent it (or as the server
	// made it): the one on its events, log lines and messages.
	TurnID  string
	Attempt uint32
}

// id is the run's turn id in the store: the client's id in its key's
// namespace, an unambiguous encoding of (key name, turn id), so that one
// key's ids never meet another's. Without keys it is the client's id.
func (k Key) id() string {
	if k.Client == "" {
		return k.TurnID
	}
	return strconv.Itoa(len(k.Client)) + ":" + k.Client + ":" + k.TurnID
}

// storedKey returns the key of the run the store names (id, attempt);
// keyed says the server has client keys, whose ids are all namespaced. An
// id that does not parse (a run stored before ids were namespaced) is
// taken as it is.
func storedKey(id string, attempt uint32, keyed bool) Key {
	k := Key{TurnID: id, Attempt: attempt}
	if !keyed {
		return k
	}
	n, rest, ok := strings.Cut(id, ":")
	size, err := strconv.Atoi(n)
	if !ok || err != nil || size <= 0 || size >= len(rest) || rest[size] != ':' || strconv.Itoa(size) != n {
		return k
	}
	k.Client, k.TurnID = rest[:size], rest[size+1:]
	return k
}

// Request is a RunTurn with a turn store, validated: the request as the
// client sent it, and as the runtime runs it.
type Request struct {
	// Key names the run: the caller's key, the turn id (made by the
	// server when the client sent none) and the attempt.
	Key Key
	// Wire is the request as the client sent it: the run's record keeps
	// it, and its hash tells a repeat from a different request.
	Wire *turnstilev1.RunTurnRequest
	// Turn is the request converted and checked (wire.TurnRequest,
	// admission.ModelFor, the runner's Validate).
	Turn *runtime.TurnRequest
}

// Outcome says how a RunTurn with a store went besides its error.
type Outcome struct {
	// Attached: the run existed (the same request, repeated), and the call
	// followed it from its log rather than running it.
	Attached bool
	// Delivered: the turn ran here and its outcome reached the client.
	Delivered bool
}

// Run serves RunTurn with a turn store: it creates the run req names or
// attaches to the one the store holds, and streams it to send, an event
// (its seq and its wire form as stored) at a time, until its end. ctx is the call's:
// its values (the caller's key and turn slots, its trace, its log fields)
// and its deadline, which is the turn's own, go with the run, which
// outlives it. The error is the stream's end: nil when the turn completed
// and its last event was sent; the turn's *runtime.TurnError; one of this
// package's errors; a *runtime.FieldError (an attempt that cannot run); an
// *admission.Refusal (the key's stored_bytes); the context's or the Send's
// error.
func (rs *Runs) Run(ctx context.Context, req Request, send func(Item) error) (Outcome, error) {
	k, tr := req.Key, req.Turn
	tr.TurnID = k.TurnID
	if err := rs.attemptFollows(ctx, k); err != nil {
		return Outcome{}, err
	}
	hash, wireForm, err := requestContent(req.Wire)
	if err != nil {
		return Outcome{}, ErrCorrupt
	}
	record := runRecord{Hash: hash, Request: wireForm, Started: time.Now().UTC(), Model: tr.Model, Client: tr.Client}
	if dl, ok := ctx.Deadline(); ok {
		record.Deadline = dl.UTC()
	}
	rec := record.marshal()

	// The store's room, and the key's.
	if err := rs.refuseStore(ctx, k, len(rec)); err != nil {
		return Outcome{}, err
	}
	if err := rs.owned.admit(); err != nil {
		return Outcome{}, err
	}
	// The turn outlives the stream: a disconnect is not a cancel. It keeps
	// the call's values (its trace, its log fields, its client key) and
	// its deadline, which is the turn's own.
	rctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	if dl, ok := ctx.Deadline(); ok {
		var cancelDL context.CancelFunc
		rctx, cancelDL = context.WithDeadline(rctx, dl)
		stop := cancel
		cancel = func(cause error) { stop(cause); cancelDL() }
	}
	r := newRun(k, hash, cancel)
	tr.Controls = r.ctl
	r.charge = admission.ChargerFrom(ctx)
	created, existing, err := rs.store.Create(ctx, k.id(), k.Attempt, rec, func(sig string) []byte { return rs.signals.answer(r, sig) })
	if err != nil {
		cancel(nil)
		rs.owned.unadmit()
		if rs.storeFull() {
			// Refused for room: the store says so from now on.
			return Outcome{}, ErrStoreFull
		}
		if ctx.Err() != nil {
			// The client left or ran out of time: the store is not at fault.
			return Outcome{}, ctx.Err()
		}
		rs.logger.Error("turn store unreachable: run not created", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
		return Outcome{}, ErrStoreUnreachable
	}
	if !created {
		cancel(nil)
		rs.owned.unadmit()
		// This call follows a turn another call runs: it holds no turn
		// slot, as a WatchTurn holds none.
		admission.SlotsFrom(ctx).CallEnded()
		if prev, err := readRecord(existing); err != nil || string(prev.Hash) != string(hash) || prev.Client != tr.Client {
			return Outcome{}, &ReusedError{TurnID: k.TurnID, Attempt: k.Attempt}
		}
		_, err := rs.stream(ctx, k, nil, 0, send)
		return Outcome{Attached: true}, err
	}
	// Counted to its key; refuseStore checked the room (concurrent
	// turns of the key may pass it together).
	_ = r.charge.Store(len(rec))
	rs.owned.put(k, r)
	// The turn holds the call's turn slots (the server's and its key's)
	// until it ends, not until its client goes.
	rs.own(rctx, r, tr, admission.SlotsFrom(ctx).Keep())
	// This RPC's stream is fed from the run's window by the run's publish
	// itself, not by a watcher woken for each event.
	final, err := rs.stream(ctx, k, r, 0, send)
	return Outcome{Delivered: final}, err
}

// attemptFollows checks the attempt of a RunTurn: attempt n of a turn may
// run only when attempt n-1 of it is stored in the caller's namespace (1
// always), or when n itself is (a repeat of it). Anything else is a
// *runtime.FieldError naming the attempt field.
func (rs *Runs) attemptFollows(ctx context.Context, k Key) error {
	if k.Attempt <= 1 {
		return nil
	}
	_, err := rs.store.Record(ctx, k.id(), k.Attempt-1)
	if errors.Is(err, fs.ErrNotExist) {
		_, err = rs.store.Record(ctx, k.id(), k.Attempt)
		if errors.Is(err, fs.ErrNotExist) {
			return attemptError(k)
		}
	}
	if err != nil {
		rs.logger.Warn("turn store unreachable: attempt not checked", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
		return ErrStoreUnreachable
	}
	return nil
}

// own runs r's turn on this replica to its end: every event goes to the
// log and, once acknowledged, to the run's watchers; release frees the
// turn's slots (the server's and its client key's) once it has ended. It
// runs on one of the owners' goroutines (see [delivery.Workers]), whose stack a turn
// has grown already: a fresh goroutine per run copied its stack at each
// doubling (about 3% of a durable turn's instructions under callgrind,
// BENCHMARKS.md). Its caller only hands it over.
func (rs *Runs) own(ctx context.Context, r *run, tr *runtime.TurnRequest, release func()) {
	rs.owners.Run(func() { rs.ownRun(ctx, r, tr, release) })
}

// ownRun is own, on the goroutine that runs the turn.
func (rs *Runs) ownRun(ctx context.Context, r *run, tr *runtime.TurnRequest, release func()) {
	// Its slots are free before CancelTurn, which waits for ended, returns.
	defer r.charge.Release()
	defer close(r.ended)
	defer rs.owned.unadmit()
	defer release()
	defer r.cancel(nil)
	k := r.key
	defer rs.owned.runs(r)()
	runCtx := ctx // the run's own: cancelled with it

	var terminal *turnstilev1.AgentEvent
	// tooLarge is the seq of an event too large to store or send: the run
	// ends there, with its terminal error in that event's place.
	var tooLarge uint64
	// The events appended and not yet acknowledged, and their bytes.
	// While any is, the sink is busy: the runtime merges the deltas that
	// come meanwhile and hands them on as one when the store has
	// acknowledged (idle), so each round trip to the store carries what
	// the model streamed during the one before, as one event: fewer,
	// larger events, each stored, numbered and sent once. Beyond
	// maxUnackedBytes the sink waits for the store before it appends
	// more: a slow store holds the turn back (it is the turn's
	// backpressure, not its end), and what a run has on its way to the
	// store, in this process and the embedded server's queues, stays
	// within that bound.
	var (
		ackMu        sync.Mutex
		acked        = sync.NewCond(&ackMu)
		unacked      int
		unackedBytes int
		// idle is the runtime's, set before the first event.
		idle func()
	)
	settled := func(n int) {
		ackMu.Lock()
		unacked--
		unackedBytes -= n
		acked.Broadcast()
		none := unacked == 0
		ackMu.Unlock()
		if none && idle != nil {
			idle()
		}
	}
	// appendWire appends out, whose wire form is b.
	appendWire := func(ctx context.Context, out *turnstilev1.AgentEvent, b []byte) error {
		if out.GetError() != nil || out.GetTurnCompleted() != nil {
			terminal = out
		}
		ackMu.Lock()
		for unacked > 0 && unackedBytes+len(b) > maxUnackedBytes {
			acked.Wait()
		}
		unacked++
		unackedBytes += len(b)
		ackMu.Unlock()
		// Whatever the runtime emits is stored, even once the turn is
		// stopped: it emits nothing more of its work then, but what a
		// cancel commits and its terminal event must not be lost to the
		// cancel racing them. Only its wire form waits for the
		// acknowledgement, and goes to the window: the decoded event is
		// not kept beside it.
		seq := out.GetSeq()
		err := rs.store.Append(context.WithoutCancel(ctx), k.id(), k.Attempt, b, func(err error) {
			if err == nil {
				r.publish(seq, b)
			}
			settled(len(b))
		})
		if err != nil {
			settled(len(b))
		}
		return err
	}
	appendEvent := func(ctx context.Context, out *turnstilev1.AgentEvent) error {
		b, err := marshalEvent(out)
		if err != nil {
			return err
		}
		return appendWire(ctx, out, b)
	}
	emit := runtime.SinkFunc(func(ctx context.Context, ev runtime.Event) error {
		// While nobody reads the run, wait for a client, as a turn without
		// a store waits for its Send (unread.go); on the run's context, not
		// the sink's, which outlives a cancel to store the last events.
		r.awaitReader(runCtx, rs.grace)
		if r.handedOff.Load() {
			// As if this replica had died here: the next owner goes on
			// from what is stored, and stores nothing this one would
			// (a cancelled tool's result, the cancellation).
			return errHandedOff
		}
		r.charge.Event(ev)
		out, err := wire.AgentEvent(ev)
		if err != nil {
			return err
		}
		out.Attempt, out.Takeover = k.Attempt, r.takeover
		// The event is encoded once: its size, as sent and as stored, is
		// that of its wire form.
		b, err := marshalEvent(out)
		if err != nil {
			return err
		}
		if wire.ResponseSize(len(b)) > rs.maxEventBytes {
			if err := wire.Fit(&turnstilev1.RunTurnResponse{Event: out}, rs.maxEventBytes); err != nil {
				// The turn fails with err as its cause (INTERNAL, the
				// message names the limit); its error event takes this
				// one's seq.
				tooLarge = ev.Seq
				r.cancel(err)
				return err
			}
			// It fits without its messages.
			if b, err = marshalEvent(out); err != nil {
				return err
			}
		}
		if err := r.charge.Store(len(b)); err != nil {
			// Over its key's stored_bytes: the same, QUOTA_EXHAUSTED.
			tooLarge = ev.Seq
			r.cancel(err)
			return err
		}
		return appendWire(ctx, out, b)
	})
	sink := busySink{Sink: emit, busy: func() bool {
		ackMu.Lock()
		defer ackMu.Unlock()
		return unacked > 0
	}, onIdle: func(f func()) { idle = f }, pace: rs.pace}
	_, runErr := rs.runner.Run(ctx, tr, sink)
	var te *runtime.TurnError
	if errors.As(runErr, &te) {
		// The turn's use, counted too when its terminal error never
		// reached the sink (a failed sink, or a hand-off: the next owner
		// charges from the totals stored, which a cut call is not in).
		r.charge.Ended(te)
	}
	fctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r.handedOff.Load() && terminal == nil {
		rs.handOver(fctx, r)
		return
	}
	if te != nil && tooLarge != 0 && terminal == nil {
		// The runtime could not emit its terminal error (the sink had
		// failed): store it in the place of the event that did not fit, so
		// live clients and replays end alike.
		if out, err := wire.AgentEvent(runtime.Event{Seq: tooLarge, Time: time.Now(), TurnID: k.TurnID, Payload: te}); err == nil {
			out.Attempt, out.Takeover = k.Attempt, r.takeover
			if err := appendEvent(fctx, out); err != nil {
				rs.logger.Error("turn store: cannot append the turn's last event", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
			}
		}
	}
	err := rs.store.Finish(fctx, k.id(), k.Attempt)
	switch {
	case takenOver(err):
		// Another replica claimed the run (this one was thought dead): it
		// goes on there, from the log, and stores its last event.
		rs.logger.Warn("turn taken over by another server: this replica lost its lease and stops it here", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
		r.finish(ErrTakenOver)
	case err != nil && rs.storeFull():
		// Its clients are told to watch it again; the log gets its end
		// once it has room (StoreRoom), or when a watch adopts it: it is
		// never taken over and finished later.
		rs.logger.Error("turn store full: the turn's last events did not fit; it ends without them, its STORE_FULL error stored once there is room", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
		rs.owed.add(k, storeFullError())
		r.finish(ErrNotStored)
	case err != nil:
		rs.logger.Error("turn store unreachable: the turn ends without its last events", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
		r.finish(ErrStoreUnreachable)
	case terminal == nil:
		// The runtime could not emit its last event (its sink failed).
		rs.logger.Error("turn ended without a terminal event", "turn_id", k.TurnID, "attempt", k.Attempt, "error", runErr)
		r.finish(ErrNotStored)
	default:
		r.finish(outcome(terminal))
	}
	// Not a run of the same key this replica took over since.
	rs.owned.drop(k, r)
}

// marshalEvent returns ev's wire form as the log stores it.
func marshalEvent(ev *turnstilev1.AgentEvent) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(ev)
}

// maxUnackedBytes bounds what a run owned here has on its way to the
// store: it appends nothing more while that many bytes wait for their
// acknowledgement (an event larger than that goes alone). 64 KiB is a
// frame of merged deltas: 1,024 running turns have at most 64 MiB on
// their way.
const maxUnackedBytes = 64 << 10

// busySink is a [runtime.PacedSink] of a Sink, a function that says
// whether it is busy, one that takes the function to call when it stops
// being busy, and the pace of the deltas it stores.
type busySink struct {
	runtime.Sink
	busy   func() bool
	onIdle func(func())
	pace   time.Duration
}

// Busy implements [runtime.BusySink].
func (b busySink) Busy() bool { return b.busy() }

// OnIdle implements [runtime.IdleSink].
func (b busySink) OnIdle(f func()) { b.onIdle(f) }

// Pace implements [runtime.PacedSink]: a reply's text is stored (and
// sent) at most once per pace, the first delta of each at once.
func (b busySink) Pace() time.Duration { return b.pace }

// storeRoom is the part of a TurnStore that says whether it can take a new
// run now, without I/O: nil, or why not (package store's Store has it).
type storeRoom interface {
	Room() error
}

// refuseStore returns ErrStoreFull for a turn the store cannot take now
// (the store is full), or the *admission.Refusal of one whose request of n
// bytes would take its key over its stored_bytes; nil when it may start,
// or when the store holds the run k already: the call attaches to it,
// which stores nothing.
func (rs *Runs) refuseStore(ctx context.Context, k Key, n int) error {
	var err error
	if rs.storeFull() {
		err = ErrStoreFull
	} else {
		err = admission.FromContext(ctx).StoredRefusal(n)
	}
	if err != nil {
		if _, rerr := rs.store.Record(ctx, k.id(), k.Attempt); rerr == nil {
			return nil
		}
	}
	return err
}

// storeFull reports whether the store says it has no room.
func (rs *Runs) storeFull() bool {
	room, ok := rs.store.(storeRoom)
	return ok && room.Room() != nil
}
