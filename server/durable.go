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
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
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
	// stored. The claimer then owns the run as its creator would.
	Claim(ctx context.Context, turnID string, attempt uint32, onSignal func(signal string) []byte) (record []byte, events [][]byte, err error)
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

// runKey names a run: one attempt of one turn.
type runKey struct {
	turnID  string
	attempt uint32
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

// requestHash hashes the content of req: every field but turn_id and
// attempt, in protobuf's deterministic encoding.
func requestHash(req *turnstilev1.RunTurnRequest) ([]byte, error) {
	c := proto.CloneOf(req)
	c.TurnId, c.Attempt = "", 0
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	if err != nil {
		return nil, err
	}
	h := sha256.Sum256(b)
	return h[:], nil
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

// cancelReply is an owner's reply to a cancel signal.
type cancelReply struct {
	Cancelled bool   `json:"cancelled"`
	LastSeq   uint64 `json:"last_seq"`
}

// stop cancels the run for CancelTurn, waits until it is over (or ctx is
// done), and says whether this call stopped it.
func (r *run) stop(ctx context.Context) cancelReply {
	r.mu.Lock()
	cancelled := !r.done && !r.stopped
	r.stopped = true
	r.mu.Unlock()
	r.cancel(&llm.Error{Kind: llm.KindCancelled, Message: "the turn was cancelled by CancelTurn"})
	select {
	case <-r.ended:
	case <-ctx.Done():
	}
	return cancelReply{Cancelled: cancelled, LastSeq: r.lastSeq()}
}

// runDurable serves RunTurn with a turn store: it creates the run or
// attaches to the one the store holds, and streams it from its log.
func (s *service) runDurable(req *turnstilev1.RunTurnRequest, tr *runtime.TurnRequest, stream grpc.ServerStreamingServer[turnstilev1.RunTurnResponse]) error {
	ctx := stream.Context()
	k := runKey{turnID: req.GetTurnId(), attempt: attemptOf(ctx, req)}
	if k.turnID == "" {
		k.turnID = uuid.NewString()
	}
	tr.TurnID = k.turnID
	logging.AddFields(ctx, logging.Fields{"turn_id", k.turnID, "attempt", k.attempt})
	hash, err := requestHash(req)
	if err != nil {
		return status.Error(codes.Internal, "internal error")
	}
	wire, err := proto.Marshal(req)
	if err != nil {
		return status.Error(codes.Internal, "internal error")
	}
	record := runRecord{Hash: hash, Request: wire, Started: time.Now().UTC(), Model: tr.Model, Client: tr.Client}
	if dl, ok := ctx.Deadline(); ok {
		record.Deadline = dl.UTC()
	}
	rec, _ := json.Marshal(record)

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
	if key := keyFrom(ctx); key != nil {
		r.charge = &usageCharger{k: key.limiter}
	}
	created, existing, err := s.store.Create(ctx, k.turnID, k.attempt, rec, func(sig string) []byte { return s.onSignal(r, sig) })
	if err != nil {
		cancel(nil)
		s.unadmit()
		s.logger.Error("turn store: create run", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
		return storeUnavailable().Err()
	}
	send := func(ev *turnstilev1.AgentEvent) error { return stream.Send(&turnstilev1.RunTurnResponse{Event: ev}) }
	if !created {
		cancel(nil)
		s.unadmit()
		var prev runRecord
		if err := json.Unmarshal(existing, &prev); err != nil || string(prev.Hash) != string(hash) || prev.Client != tr.Client {
			return turnIDReused(k).Err()
		}
		logging.AddFields(ctx, logging.Fields{"attached", true})
		return s.follow(ctx, k, 0, send).Err()
	}
	s.mu.Lock()
	s.runs[k] = r
	s.mu.Unlock()
	go s.own(rctx, r, tr)
	return r.watch(ctx, 0, send, s.grace).Err()
}

// own runs r's turn on this replica to its end: every event goes to the
// log and, once acknowledged, to the run's watchers.
func (s *service) own(ctx context.Context, r *run, tr *runtime.TurnRequest) {
	defer s.unadmit()
	defer close(r.ended)
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
	appendEvent := func(ctx context.Context, out *turnstilev1.AgentEvent) error {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(out)
		if err != nil {
			return err
		}
		if out.GetError() != nil || out.GetTurnCompleted() != nil {
			terminal = out
		}
		return s.store.Append(ctx, k.turnID, k.attempt, b, func(err error) {
			if err == nil {
				r.publish(out)
			}
		})
	}
	sink := runtime.SinkFunc(func(ctx context.Context, ev runtime.Event) error {
		if r.handedOff.Load() {
			// As if this replica had died here: the next owner goes on
			// from what is stored, and stores nothing this one would
			// (a cancelled tool's result, the cancellation).
			return errHandedOff
		}
		out, err := fromEvent(ev)
		if err != nil {
			return err
		}
		out.Attempt = k.attempt
		if u, ok := ev.Payload.(*runtime.UsageUpdated); ok {
			r.charge.total(u.Total)
		}
		if err := fitEvent(&turnstilev1.RunTurnResponse{Event: out}, s.opts.MaxEventBytes); err != nil {
			// The turn fails with err as its cause (INTERNAL, the message
			// names the limit); its error event takes this one's seq.
			tooLarge = ev.Seq
			r.cancel(err)
			return err
		}
		return appendEvent(ctx, out)
	})
	_, runErr := s.runner.Run(ctx, tr, sink)
	fctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r.handedOff.Load() && terminal == nil {
		s.handOver(fctx, r)
		return
	}
	var te *runtime.TurnError
	if errors.As(runErr, &te) && tooLarge != 0 && terminal == nil {
		// The runtime could not emit its terminal error (the sink had
		// failed): store it in the place of the event that did not fit, so
		// live clients and replays end alike.
		if out, err := fromEvent(runtime.Event{Seq: tooLarge, Time: time.Now(), TurnID: k.turnID, Payload: te}); err == nil {
			out.Attempt = k.attempt
			if err := appendEvent(fctx, out); err != nil {
				s.logger.Error("turn store: cannot append the turn's last event", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
			}
		}
	}
	err := s.store.Finish(fctx, k.turnID, k.attempt)
	switch {
	case err != nil:
		s.logger.Error("turn store: append failed; the turn ends without its last event", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
		r.finish(storeUnavailable())
	case terminal == nil:
		// The runtime could not emit its last event (its sink failed).
		s.logger.Error("turn ended without a terminal event", "turn_id", k.turnID, "attempt", k.attempt, "error", runErr)
		r.finish(storeUnavailable())
	default:
		r.finish(eventStatus(terminal))
	}
	if te != nil && te.Cause != nil {
		// The root cause, for operators only: it never reaches the client.
		s.logger.Info("turn failed", "turn_id", k.turnID, "attempt", k.attempt, "error_code", te.Kind.String(), "cause", te.Cause.Error())
	}
	s.mu.Lock()
	delete(s.runs, k)
	s.mu.Unlock()
}

// errHandedOff stops the runs a replica shutting down hands to others.
var errHandedOff = &llm.Error{Kind: llm.KindUnavailable, Message: "the server is shutting down: another server takes the turn over"}

// handOff gives every run this replica owns to the other replicas: each
// stops at once, storing nothing more, and is released once its stored
// events are acknowledged (handOver). It returns how many there were.
func (s *service) handOff() int {
	if s.store == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.runs {
		r.handedOff.Store(true)
		r.cancel(errHandedOff)
	}
	return len(s.runs)
}

// handOver ends a run handed off by this replica: its lease is released
// for another replica to take it over now, and the clients watching it
// here are told to watch it again (elsewhere).
func (s *service) handOver(ctx context.Context, r *run) {
	k := r.key
	if err := s.store.Release(ctx, k.turnID, k.attempt); err != nil {
		s.logger.Warn("turn store: run not released; another server takes it over when its lease expires", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
	} else {
		s.logger.Info("turn handed over to another server", "turn_id", k.turnID, "attempt", k.attempt, "last_seq", r.lastSeq())
	}
	r.finish(handedOffStatus())
	s.mu.Lock()
	delete(s.runs, k)
	s.mu.Unlock()
}

// handedOffStatus ends the streams of a run this replica handed off:
// retryable, by watching the turn again, which another replica serves.
func handedOffStatus() *status.Status {
	yes := true
	return turnStatus(&runtime.TurnError{
		Kind: llm.KindUnavailable, Retryable: &yes, RetryAfter: 100 * time.Millisecond,
		Message: "the server is shutting down and another server takes the turn over; watch the turn again from the last seq received",
	})
}

// onSignal answers a signal sent to a run this replica owns.
func (s *service) onSignal(r *run, sig string) []byte {
	switch sig {
	case signalCancel:
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		b, _ := json.Marshal(r.stop(ctx))
		return b
	case signalWatch:
		r.touched(s.grace)
	case signalLost:
		s.logger.Warn("another server took the turn over: stopping it here", "turn_id", r.key.turnID, "attempt", r.key.attempt)
		r.cancel(&llm.Error{Kind: llm.KindUnavailable, Message: "another server took the turn over"})
	}
	return nil
}

// follow streams the run k after afterSeq to send, from this replica's
// fan-out when it owns the run, else from the log, and returns the status
// the stream ends with.
func (s *service) follow(ctx context.Context, k runKey, afterSeq uint64, send func(*turnstilev1.AgentEvent) error) *status.Status {
	s.mu.Lock()
	r := s.runs[k]
	s.mu.Unlock()
	if r != nil {
		return r.watch(ctx, afterSeq, send, s.grace)
	}
	// Tell the owner, wherever it is, that a client watches.
	s.store.Notify(k.turnID, k.attempt, signalWatch)
	tick := time.NewTicker(max(s.grace/3, 10*time.Millisecond))
	defer tick.Stop()
	seq := afterSeq
	// The event at afterSeq is read again, unsent, to learn whether the
	// client already holds the last one.
	from := max(afterSeq, 1) - 1
	for b, err := range s.store.Events(ctx, k.turnID, k.attempt, from) {
		if err != nil {
			if ctx.Err() != nil {
				return status.FromContextError(ctx.Err())
			}
			s.logger.Warn("turn store: watch ended", "turn_id", k.turnID, "attempt", k.attempt, "after_seq", seq, "error", err)
			return storeUnavailable()
		}
		ev := &turnstilev1.AgentEvent{}
		if err := proto.Unmarshal(b, ev); err != nil {
			s.logger.Error("turn store: undecodable event", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
			return status.New(codes.Internal, "internal error")
		}
		if ev.GetSeq() > afterSeq {
			if err := send(ev); err != nil {
				return status.Convert(err)
			}
		}
		seq = ev.GetSeq()
		if ev.GetError() != nil || ev.GetTurnCompleted() != nil {
			return eventStatus(ev)
		}
		select {
		case <-tick.C:
			s.store.Notify(k.turnID, k.attempt, signalWatch)
		default:
		}
	}
	return status.FromContextError(ctx.Err())
}

// WatchTurn implements [turnstilev1.AgentServiceServer].
func (s *service) WatchTurn(req *turnstilev1.WatchTurnRequest, stream grpc.ServerStreamingServer[turnstilev1.WatchTurnResponse]) error {
	ctx := stream.Context()
	k, st := s.resolve(ctx, req.GetTurnId(), req.GetAttempt())
	if st != nil {
		return st.Err()
	}
	logging.AddFields(ctx, logging.Fields{"turn_id", k.turnID, "attempt", k.attempt, "after_seq", req.GetAfterSeq()})
	return s.follow(ctx, k, req.GetAfterSeq(), func(ev *turnstilev1.AgentEvent) error {
		return stream.Send(&turnstilev1.WatchTurnResponse{Event: ev})
	}).Err()
}

// CancelTurn implements [turnstilev1.AgentServiceServer].
func (s *service) CancelTurn(ctx context.Context, req *turnstilev1.CancelTurnRequest) (*turnstilev1.CancelTurnResponse, error) {
	k, st := s.resolve(ctx, req.GetTurnId(), req.GetAttempt())
	if st != nil {
		return nil, st.Err()
	}
	logging.AddFields(ctx, logging.Fields{"turn_id", k.turnID, "attempt", k.attempt})
	resp := &turnstilev1.CancelTurnResponse{Attempt: k.attempt}
	s.mu.Lock()
	r := s.runs[k]
	s.mu.Unlock()
	var reply cancelReply
	if r != nil {
		reply = r.stop(ctx)
	} else {
		b, err := s.store.Signal(ctx, k.turnID, k.attempt, signalCancel)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// No replica runs it: it ended (or its owner went away).
			reply.LastSeq, err = s.lastSeq(ctx, k)
			if err != nil {
				return nil, err
			}
		case err != nil:
			s.logger.Warn("turn store: cancel signal", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
			return nil, storeUnavailable().Err()
		default:
			if err := json.Unmarshal(b, &reply); err != nil {
				return nil, status.Error(codes.Internal, "internal error")
			}
		}
	}
	resp.Cancelled, resp.LastSeq = reply.Cancelled, reply.LastSeq
	return resp, nil
}

// lastSeq returns the seq of the run's last stored event.
func (s *service) lastSeq(ctx context.Context, k runKey) (uint64, error) {
	b, err := s.store.LastEvent(ctx, k.turnID, k.attempt)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, storeUnavailable().Err()
	}
	ev := &turnstilev1.AgentEvent{}
	if err := proto.Unmarshal(b, ev); err != nil {
		return 0, status.Error(codes.Internal, "internal error")
	}
	return ev.GetSeq(), nil
}

// resolve checks a turn id and attempt named by WatchTurn or CancelTurn,
// resolves attempt 0 to the latest one, and makes sure the store holds the
// run.
func (s *service) resolve(ctx context.Context, turnID string, attempt uint32) (runKey, *status.Status) {
	if s.store == nil {
		return runKey{}, status.New(codes.FailedPrecondition, "this server keeps no turn log (store.mode: off): turns cannot be watched or cancelled")
	}
	if turnID == "" {
		return runKey{}, invalidArgument([]*runtime.FieldError{{Field: "turn_id", Description: "required"}})
	}
	if len(turnID) > maxTurnIDLen {
		return runKey{}, invalidArgument([]*runtime.FieldError{{Field: "turn_id", Description: fmt.Sprintf("must be valid UTF-8 of at most %d bytes", maxTurnIDLen)}})
	}
	k := runKey{turnID: turnID, attempt: attempt}
	var err error
	if k.attempt == 0 {
		k.attempt, err = s.store.LatestAttempt(ctx, turnID)
	}
	var rec []byte
	if err == nil {
		rec, err = s.store.Record(ctx, turnID, k.attempt)
	}
	notFound := status.New(codes.NotFound, "no such turn in the log: never run, or older than its retention")
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return k, notFound
	case err != nil:
		s.logger.Warn("turn store: look up run", "turn_id", turnID, "error", err)
		return k, storeUnavailable()
	}
	var first runRecord
	if err := json.Unmarshal(rec, &first); err != nil || first.Client != keyFrom(ctx).name() {
		// Another client key's turn is not this caller's to see.
		return k, notFound
	}
	return k, nil
}

// eventStatus returns the status a stream ends with after its terminal
// event ev.
func eventStatus(ev *turnstilev1.AgentEvent) *status.Status {
	e := ev.GetError()
	if e == nil {
		return status.New(codes.OK, "")
	}
	te := &runtime.TurnError{Kind: kindOf(e.GetCode()), Message: e.GetMessage(), Retryable: e.Retryable, Model: e.GetModel()}
	if ra := e.GetRetryAfter(); ra != nil {
		te.RetryAfter = ra.AsDuration()
	}
	return turnStatus(te)
}

// kinds maps the wire's error codes back to the runtime's kinds.
var kinds = func() map[turnstilev1.ErrorCode]llm.Kind {
	m := map[turnstilev1.ErrorCode]llm.Kind{}
	for _, k := range llm.Kinds() {
		m[errorCode(k)] = k
	}
	return m
}()

func kindOf(c turnstilev1.ErrorCode) llm.Kind {
	if k, ok := kinds[c]; ok {
		return k
	}
	return llm.KindInternal
}

// storeUnavailable is the status of a stream the turn log cannot serve:
// retryable, by watching again from the last seq received.
func storeUnavailable() *status.Status {
	yes := true
	return turnStatus(&runtime.TurnError{
		Kind: llm.KindUnavailable, Retryable: &yes, RetryAfter: 100 * time.Millisecond,
		Message: "the turn log is unavailable or the replica running the turn went away; watch the turn again from the last seq received",
	})
}

// turnIDReused is the status of a RunTurn that reuses a turn id and
// attempt for a different request.
func turnIDReused(k runKey) *status.Status {
	st := status.New(codes.AlreadyExists, fmt.Sprintf("turn %q attempt %d already ran with a different request; use a new turn id, or the next attempt to resume it", k.turnID, k.attempt))
	return withDetails(st, &errdetails.ErrorInfo{Reason: ReasonTurnIDReused, Domain: ErrorDomain, Metadata: map[string]string{"attempt": strconv.FormatUint(uint64(k.attempt), 10)}})
}
