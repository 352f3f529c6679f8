package server

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/admission"
	"github.com/turnstile-dev/turnstile/server/guard"
	"github.com/turnstile-dev/turnstile/server/wire"
)

// TurnStore is the durable log of runs that the service needs; package
// store implements it over NATS JetStream. A run is one attempt of one
// turn. The store holds bytes: the service stores each run's record
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

// ReasonTurnIDReused is the ErrorInfo reason of a RunTurn that reuses a
// turn id and attempt for a different request.
const ReasonTurnIDReused = "TURN_ID_REUSED"

// runKey names a run: one attempt of one turn of one client key.
type runKey struct {
	// client is the name of the client key whose turn it is; "" without
	// keys.
	client string
	// turnID is the turn's id as the client sent it (or as the server
	// made it): the one on its events, log lines and messages.
	turnID  string
	attempt uint32
}

// id is the run's turn id in the store: the client's id in its key's
// namespace, an unambiguous encoding of (key name, turn id), so that one
// key's ids never meet another's. Without keys it is the client's id.
func (k runKey) id() string {
	if k.client == "" {
		return k.turnID
	}
	return strconv.Itoa(len(k.client)) + ":" + k.client + ":" + k.turnID
}

// storedKey returns the key of the run the store names (id, attempt);
// keyed says the server has client keys, whose ids are all namespaced. An
// id that does not parse (a run stored before ids were namespaced) is
// taken as it is.
func storedKey(id string, attempt uint32, keyed bool) runKey {
	k := runKey{turnID: id, attempt: attempt}
	if !keyed {
		return k
	}
	n, rest, ok := strings.Cut(id, ":")
	size, err := strconv.Atoi(n)
	if !ok || err != nil || size <= 0 || size >= len(rest) || rest[size] != ':' || strconv.Itoa(size) != n {
		return k
	}
	k.client, k.turnID = rest[:size], rest[size+1:]
	return k
}

// runRecord is the first record of a run's log.
type runRecord struct {
	// Hash identifies the request's content: every field but turn_id and
	// attempt.
	Hash []byte `json:"hash"`
	// Request is the request as the client sent it, in its wire form.
	Request []byte `json:"request"`
	// Started is when the run was created.
	Started time.Time `json:"started"`
	// Deadline is the turn's deadline, the first request's; zero is none.
	Deadline time.Time `json:"deadline,omitzero"`
	// Model is the alias the turn runs on, as the server resolved it (a
	// client key may change the default).
	Model string `json:"model,omitempty"`
	// Client is the name of the client key that created the run; only
	// that key may watch, cancel or attach to it. Empty without keys.
	Client string `json:"client,omitempty"`
}

// requestContent returns the request's wire form, in protobuf's
// deterministic encoding, and the hash of its content: every field but
// turn_id and attempt. The fields of a deterministic encoding come one
// record each, in field-number order, so the records of the whole
// request less those two are the encoding of the request without them:
// the hash is that of a copy with both cleared (requestHashTest), made
// without copying the request and without a second encoding.
func requestContent(req *turnstilev1.RunTurnRequest) (hash, wire []byte, err error) {
	wire, err = proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		return nil, nil, err
	}
	h := sha256.New()
	for b := wire; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, nil, protowire.ParseError(n)
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, nil, protowire.ParseError(m)
		}
		if num != turnIDField && num != attemptField {
			h.Write(b[:n+m])
		}
		b = b[n+m:]
	}
	return h.Sum(nil), wire, nil
}

// The field numbers of RunTurnRequest that are not its content.
var (
	turnIDField  = requestField("turn_id")
	attemptField = requestField("attempt")
)

// requestField returns the number of RunTurnRequest's field name.
func requestField(name protoreflect.Name) protowire.Number {
	return (*turnstilev1.RunTurnRequest)(nil).ProtoReflect().Descriptor().Fields().ByName(name).Number()
}

// attemptOf returns the request's attempt: its field, else the metadata
// an older client sends, else 1.
func attemptOf(ctx context.Context, req *turnstilev1.RunTurnRequest) uint32 {
	if a := req.GetAttempt(); a > 0 {
		return a
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(AttemptHeader); len(v) > 0 {
			if n, err := strconv.ParseUint(v[0], 10, 32); err == nil && n > 0 {
				return uint32(n)
			}
		}
	}
	return 1
}

// runDurable serves RunTurn with a turn store: it creates the run or
// attaches to the one the store holds, and streams it from its log.
func (s *service) runDurable(req *turnstilev1.RunTurnRequest, tr *runtime.TurnRequest, stream grpc.ServerStreamingServer[turnstilev1.RunTurnResponse]) error {
	ctx := stream.Context()
	k := runKey{client: tr.Client, turnID: req.GetTurnId(), attempt: attemptOf(ctx, req)}
	if k.turnID == "" {
		k.turnID = uuid.NewString()
	}
	tr.TurnID = k.turnID
	logging.AddFields(ctx, logging.Fields{"turn_id", k.turnID, "attempt", k.attempt})
	if st := s.attemptFollows(ctx, k); st != nil {
		return st.Err()
	}
	hash, wire, err := requestContent(req)
	if err != nil {
		return status.Error(codes.Internal, "internal error")
	}
	record := runRecord{Hash: hash, Request: wire, Started: time.Now().UTC(), Model: tr.Model, Client: tr.Client}
	if dl, ok := ctx.Deadline(); ok {
		record.Deadline = dl.UTC()
	}
	rec, _ := json.Marshal(record)

	// The store's room, and the key's (limits.go).
	if st := s.refuseStore(ctx, k, len(rec)); st != nil {
		return st.Err()
	}
	if st := s.admit(); st != nil {
		return st.Err()
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
	r.charge = admission.FromContext(ctx).Charger()
	created, existing, err := s.store.Create(ctx, k.id(), k.attempt, rec, func(sig string) []byte { return s.onSignal(r, sig) })
	if err != nil {
		cancel(nil)
		s.unadmit()
		if st := s.storeFull(); st != nil {
			// Refused for room: the store says so from now on.
			return st.Err()
		}
		s.logger.Error("turn store unreachable: run not created", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
		return storeUnreachable().Err()
	}
	send := runItems(stream)
	if !created {
		cancel(nil)
		s.unadmit()
		// This call follows a turn another call runs: it holds no turn
		// slot, as a WatchTurn holds none.
		admission.SlotsFrom(ctx).CallEnded()
		var prev runRecord
		if err := json.Unmarshal(existing, &prev); err != nil || string(prev.Hash) != string(hash) || prev.Client != tr.Client {
			return turnIDReused(k).Err()
		}
		logging.AddFields(ctx, logging.Fields{"attached", true})
		return s.streamRun(ctx, k, nil, 0, send).Err()
	}
	// Counted to its key; refuseStore checked the room (concurrent
	// turns of the key may pass it together).
	_ = r.charge.Store(len(rec))
	s.mu.Lock()
	s.runs[k] = r
	s.mu.Unlock()
	// The turn holds the call's turn slots (the server's and its key's)
	// until it ends, not until its client goes.
	s.own(rctx, r, tr, admission.SlotsFrom(ctx).Keep())
	// This RPC's stream is fed from the run's window by the run's publish
	// itself, not by a watcher woken for each event.
	st := s.streamRun(ctx, k, r, 0, send)
	r.mu.Lock()
	delivered := r.done && st == r.final
	r.mu.Unlock()
	if delivered {
		// The turn ran here and its outcome reached the client: the turn's
		// own line says it all, and this RPC's goes to DEBUG, as without a
		// store. A stream that ended otherwise keeps its line.
		logging.AddFields(ctx, logging.Fields{guard.RanField, true})
	}
	return st.Err()
}

// attemptFollows checks the attempt of a RunTurn: attempt n of a turn may
// run only when attempt n-1 of it is stored in the caller's namespace (1
// always), or when n itself is (a repeat of it). Anything else is
// INVALID_ARGUMENT naming the attempt field.
func (s *service) attemptFollows(ctx context.Context, k runKey) *status.Status {
	if k.attempt <= 1 {
		return nil
	}
	_, err := s.store.Record(ctx, k.id(), k.attempt-1)
	if errors.Is(err, fs.ErrNotExist) {
		_, err = s.store.Record(ctx, k.id(), k.attempt)
		if errors.Is(err, fs.ErrNotExist) {
			return invalidArgument([]*runtime.FieldError{{Field: "attempt", Description: fmt.Sprintf(
				"attempt %d of turn %q cannot run: its attempt %d was never run (or is older than the log's retention); attempts are numbered from 1, each after the one before",
				k.attempt, wire.Clip(k.turnID, wire.MaxEchoBytes), k.attempt-1)}})
		}
	}
	if err != nil {
		s.logger.Warn("turn store unreachable: attempt not checked", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
		return storeUnreachable()
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
func (s *service) own(ctx context.Context, r *run, tr *runtime.TurnRequest, release func()) {
	s.owners.Run(func() { s.ownRun(ctx, r, tr, release) })
}

// ownRun is own, on the goroutine that runs the turn.
func (s *service) ownRun(ctx context.Context, r *run, tr *runtime.TurnRequest, release func()) {
	// Its slots are free before CancelTurn, which waits for ended, returns.
	defer r.charge.Release()
	defer close(r.ended)
	defer s.unadmit()
	defer release()
	defer r.cancel(nil)
	k := r.key
	t := &activeTurn{cancel: r.cancel}
	s.mu.Lock()
	s.active[t] = struct{}{}
	s.mu.Unlock()
	defer s.untrack(t)

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
		// cancel racing them.
		err := s.store.Append(context.WithoutCancel(ctx), k.id(), k.attempt, b, func(err error) {
			if err == nil {
				r.publishWire(out, b, len(b))
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
		out.Attempt = k.attempt
		// The event is encoded once: its size, as sent and as stored, is
		// that of its wire form.
		b, err := marshalEvent(out)
		if err != nil {
			return err
		}
		if responseSize(len(b)) > s.opts.MaxEventBytes {
			if err := wire.Fit(&turnstilev1.RunTurnResponse{Event: out}, s.opts.MaxEventBytes); err != nil {
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
	}, onIdle: func(f func()) { idle = f }}
	_, runErr := s.runner.Run(ctx, tr, sink)
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
		s.handOver(fctx, r)
		return
	}
	if te != nil && tooLarge != 0 && terminal == nil {
		// The runtime could not emit its terminal error (the sink had
		// failed): store it in the place of the event that did not fit, so
		// live clients and replays end alike.
		if out, err := wire.AgentEvent(runtime.Event{Seq: tooLarge, Time: time.Now(), TurnID: k.turnID, Payload: te}); err == nil {
			out.Attempt = k.attempt
			if err := appendEvent(fctx, out); err != nil {
				s.logger.Error("turn store: cannot append the turn's last event", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
			}
		}
	}
	err := s.store.Finish(fctx, k.id(), k.attempt)
	switch {
	case takenOver(err):
		// Another replica claimed the run (this one was thought dead): it
		// goes on there, from the log, and stores its last event.
		s.logger.Warn("turn taken over by another server: this replica lost its lease and stops it here", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
		r.finish(lostLease())
	case err != nil && s.storeFull() != nil:
		s.logger.Error("turn store full: the turn's last events did not fit; it ends without them", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
		r.finish(turnNotStored())
	case err != nil:
		s.logger.Error("turn store unreachable: the turn ends without its last events", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
		r.finish(storeUnreachable())
	case terminal == nil:
		// The runtime could not emit its last event (its sink failed).
		s.logger.Error("turn ended without a terminal event", "turn_id", k.turnID, "attempt", k.attempt, "error", runErr)
		r.finish(turnNotStored())
	default:
		r.finish(eventStatus(terminal))
	}
	s.mu.Lock()
	if s.runs[k] == r {
		// Not a run of the same key this replica took over since.
		delete(s.runs, k)
	}
	s.mu.Unlock()
}

// marshalEvent returns ev's wire form as the log stores it.
func marshalEvent(ev *turnstilev1.AgentEvent) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(ev)
}

// responseSize is the wire size of a RunTurnResponse holding an event of
// n bytes on the wire: its field's tag, length and bytes.
func responseSize(n int) int {
	return protowire.SizeTag(1) + protowire.SizeBytes(n)
}

// maxUnackedBytes bounds what a run owned here has on its way to the
// store: it appends nothing more while that many bytes wait for their
// acknowledgement (an event larger than that goes alone). 64 KiB is a
// frame of merged deltas: 1,024 running turns have at most 64 MiB on
// their way.
const maxUnackedBytes = 64 << 10

// busySink is a [runtime.IdleSink] of a Sink, a function that says
// whether it is busy and one that takes the function to call when it
// stops being busy.
type busySink struct {
	runtime.Sink
	busy   func() bool
	onIdle func(func())
}

// Busy implements [runtime.BusySink].
func (b busySink) Busy() bool { return b.busy() }

// OnIdle implements [runtime.IdleSink].
func (b busySink) OnIdle(f func()) { b.onIdle(f) }

// ReasonStoreFull is the ErrorInfo reason of a RunTurn refused because the
// turn store cannot take a new turn (full of running turns, or its disk
// is): RESOURCE_EXHAUSTED with RetryInfo, before any event.
const ReasonStoreFull = "STORE_FULL"

// storeFullRetry is the wait advised to a turn refused for a full store.
const storeFullRetry = 5 * time.Second

// storeRoom is the part of a TurnStore that says whether it can take a new
// run now, without I/O: nil, or why not (package store's Store has it).
type storeRoom interface {
	Room() error
}

// refuseStore returns the status of a turn the store cannot take now (the
// store is full), or whose request of n bytes would take its key over its
// stored_bytes; nil when it may start, or when the store holds the run k
// already: the call attaches to it, which stores nothing.
func (s *service) refuseStore(ctx context.Context, k runKey, n int) *status.Status {
	st := s.storeFull()
	if st == nil {
		key := admission.FromContext(ctx)
		if err := key.StoredRefusal(n); err != nil {
			st = refusalStatus(err, key.KeyName())
		}
	}
	if st != nil {
		if _, err := s.store.Record(ctx, k.id(), k.attempt); err == nil {
			return nil
		}
	}
	return st
}

// storeFull returns STORE_FULL while the store says it has no room.
func (s *service) storeFull() *status.Status {
	room, ok := s.store.(storeRoom)
	if !ok || room.Room() == nil {
		return nil
	}
	st := status.New(codes.ResourceExhausted, "the turn store is full: it takes no new turn until running turns end or space returns; retry later, running turns go on")
	return withDetails(st, errorInfo(ReasonStoreFull, nil), &errdetails.RetryInfo{RetryDelay: durationpb.New(storeFullRetry)})
}

// runItems returns the function that sends a run's events on a RunTurn
// stream: an event whose wire form is known (as stored) is sent as that
// form, without a second encoding (codec.go's encodedResponse).
func runItems(stream grpc.ServerStreamingServer[turnstilev1.RunTurnResponse]) func(item) error {
	return func(it item) error {
		if it.wire == nil {
			return stream.Send(&turnstilev1.RunTurnResponse{Event: it.ev})
		}
		// The response and its encoded form in one allocation.
		e := &struct {
			resp turnstilev1.RunTurnResponse
			enc  encodedResponse
		}{}
		e.resp.Event = it.ev
		e.enc.Message, e.enc.event = &e.resp, it.wire
		return stream.SendMsg(&e.enc)
	}
}

// watchItems is runItems for a WatchTurn stream.
func watchItems(stream grpc.ServerStreamingServer[turnstilev1.WatchTurnResponse]) func(item) error {
	return func(it item) error {
		if it.wire == nil {
			return stream.Send(&turnstilev1.WatchTurnResponse{Event: it.ev})
		}
		e := &struct {
			resp turnstilev1.WatchTurnResponse
			enc  encodedResponse
		}{}
		e.resp.Event = it.ev
		e.enc.Message, e.enc.event = &e.resp, it.wire
		return stream.SendMsg(&e.enc)
	}
}
