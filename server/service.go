package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/admission"
	"github.com/turnstile-dev/turnstile/server/delivery"
	"github.com/turnstile-dev/turnstile/server/guard"
	"github.com/turnstile-dev/turnstile/server/wire"
)

// AttemptHeader is the request metadata key in which a client numbers its
// attempts at one turn id, so logs tie them together.
const AttemptHeader = "turnstile-attempt"

// turnRunner is what the service needs from the runtime.
type turnRunner interface {
	Validate(req *runtime.TurnRequest) error
	Run(ctx context.Context, req *runtime.TurnRequest, sink runtime.Sink) (*runtime.TurnCompleted, error)
	Models() []string
	DefaultModel() string
}

// service implements turnstile.v1.AgentService over a runner. It maps
// requests and events between the wire and the runtime, and nothing else.
type service struct {
	turnstilev1.UnimplementedAgentServiceServer
	runner turnRunner
	logger *slog.Logger
	opts   *Options

	store TurnStore // nil: no log, turns live in the stream that runs them
	grace time.Duration
	// stopTakeovers ends the watch for runs to take over.
	stopTakeovers context.CancelFunc

	mu       sync.Mutex
	draining bool
	active   map[*activeTurn]struct{}
	runs     map[runKey]*run // the runs this replica owns
	owned    int             // runs admitted and not ended
	maxRuns  int
	turns    sync.WaitGroup // the runs this replica owns, until they end

	// senders run the outboxes' senders; owners the runs owned here.
	senders, owners *delivery.Workers
	// gate bounds the turns running at once (max_concurrent_turns); auth
	// holds the client keys and their limiters, nil without keys. A turn
	// that outlives its call, or that this replica takes over, holds its
	// slots in both until it ends.
	gate *admission.Gate
	keys *admission.Keys
}

type activeTurn struct {
	cancel context.CancelCauseFunc
	// key and ctl reach a turn that runs without a store (approve.go,
	// cancel.go); ctl is nil for a durable run's.
	key runKey
	ctl *runtime.Controls
	// ended is closed once a turn without a store has sent its last
	// event, whose seq lastSeq then is; stopped is set, under the
	// service's mu, by the CancelTurn that stopped it.
	ended   chan struct{}
	lastSeq uint64
	stopped bool
}

var _ turnstilev1.AgentServiceServer = (*service)(nil)

func newService(r turnRunner, opts *Options) *service {
	s := &service{
		runner: r, logger: opts.Logger, opts: opts, active: map[*activeTurn]struct{}{},
		store: opts.Store, grace: opts.DetachGrace, maxRuns: opts.MaxRunningTurns, runs: map[runKey]*run{},
		senders: delivery.NewWorkers(streamWorkers), owners: delivery.NewWorkers(streamWorkers),
		gate: admission.NewGate(opts.MaxConcurrentTurns),
	}
	if len(opts.Keys) > 0 {
		s.keys = admission.NewKeys(opts.Keys, time.Now)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.stopTakeovers = cancel
	if s.store != nil {
		s.turns.Add(1)
		go func() {
			defer s.turns.Done()
			s.takeOvers(ctx)
		}()
	}
	return s
}

// maxCauseBytes bounds the root cause of a failure on a log line.
const maxCauseBytes = 4096

// RunTurn implements [turnstilev1.AgentServiceServer].
func (s *service) RunTurn(req *turnstilev1.RunTurnRequest, stream grpc.ServerStreamingServer[turnstilev1.RunTurnResponse]) error {
	k := admission.FromContext(stream.Context())
	tr, st := s.request(req, k)
	if st != nil {
		logging.AddFields(stream.Context(), logging.Fields{"error_code", codeReasonOf(st)})
		return st.Err()
	}
	if s.store != nil {
		return s.runDurable(req, tr, stream)
	}
	if tr.TurnID == "" {
		tr.TurnID = uuid.NewString()
	}
	fields := logging.Fields{"turn_id", tr.TurnID}
	if md, ok := metadata.FromIncomingContext(stream.Context()); ok {
		if a := md.Get(AttemptHeader); len(a) > 0 {
			fields = append(fields, "client_attempt", wire.Clip(a[0], wire.MaxEchoBytes))
		}
	}
	logging.AddFields(stream.Context(), fields)

	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	tr.Controls = runtime.NewControls()
	t := &activeTurn{cancel: cancel, key: runKey{client: tr.Client, turnID: tr.TurnID, attempt: attemptOf(stream.Context(), req)}, ctl: tr.Controls,
		ended: make(chan struct{})}
	if !s.track(t) {
		return turnStatus(drainError()).Err()
	}
	defer s.untrack(t)

	usage := k.Charger()
	out := delivery.NewOutbox(stream.Send, cancel, delivery.Config{SendTimeout: s.opts.SendTimeout, Start: s.senders.Run},
		s.opts.MaxEventBytes, usage, attemptOf(stream.Context(), req))
	// The turn's outcome and root cause are in its own log line.
	_, err := s.runner.Run(ctx, tr, out)
	var te *runtime.TurnError
	if errors.As(err, &te) {
		// The turn's use, counted too when its last events never reached
		// the outbox (the client left, and the runtime stopped emitting).
		usage.Ended(te)
	}
	stall := out.Finish(te)
	t.lastSeq = out.Sent()
	close(t.ended)
	if stall != nil {
		// The outcome was never delivered: the client stopped reading. The
		// turn's line says what the runner saw; this RPC's line, kept
		// above DEBUG, says what the client got.
		err, te = stall, &runtime.TurnError{Kind: llm.KindDeadlineExceeded, Message: llm.AsError(stall).Message}
	} else {
		logging.AddFields(stream.Context(), logging.Fields{guard.RanField, true})
	}
	switch {
	case err == nil:
		return nil
	case te != nil:
		fields := logging.Fields{"error_code", te.Kind.String()}
		if te.Cause != nil {
			// The root cause, for operators only: it never reaches the client.
			fields = append(fields, "cause", wire.Clip(te.Cause.Error(), maxCauseBytes))
		}
		logging.AddFields(stream.Context(), fields)
		return turnStatus(te).Err()
	}
	s.logger.ErrorContext(stream.Context(), "turn failed without a turn error", "turn_id", tr.TurnID, "error", err)
	return status.Error(codes.Internal, "internal error")
}

// request validates req for key k (nil without auth) and converts it, or
// returns the status that refuses it.
func (s *service) request(req *turnstilev1.RunTurnRequest, k *admission.Client) (*runtime.TurnRequest, *status.Status) {
	tr, bad := wire.TurnRequest(req, s.checks())
	if len(bad) > 0 {
		return nil, invalidArgument(bad)
	}
	alias, err := admission.ModelFor(k, tr.Model, s.runner.DefaultModel(), s.runner.Models())
	var me *admission.ModelError
	if errors.As(err, &me) {
		return nil, modelStatus(me)
	}
	tr.Model, tr.Client, tr.Budget = alias, k.KeyName(), k.BudgetHook()
	if err := s.runner.Validate(tr); err != nil {
		if fes := fieldErrors(err); len(fes) > 0 {
			return nil, invalidArgument(fes)
		}
		return nil, status.New(codes.Internal, "internal error")
	}
	return tr, nil
}

// fieldErrors returns the validation failures err holds, one or several
// joined.
func fieldErrors(err error) []*runtime.FieldError {
	var fe *runtime.FieldError
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		var out []*runtime.FieldError
		for _, e := range joined.Unwrap() {
			out = append(out, fieldErrors(e)...)
		}
		return out
	}
	if errors.As(err, &fe) {
		return []*runtime.FieldError{fe}
	}
	return nil
}

// codeReasonOf returns the ErrorInfo reason of st, for its log line.
func codeReasonOf(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return st.Code().String()
}

// drainError is the error that ends turns cut short by a shutdown.
func drainError() *runtime.TurnError {
	yes := true
	return &runtime.TurnError{
		Kind: llm.KindUnavailable, Message: "the server is shutting down; retry the turn", Retryable: &yes,
	}
}

func (s *service) track(t *activeTurn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return false
	}
	s.active[t] = struct{}{}
	return true
}

// admit counts a run this replica is about to own, unless the server is
// draining.
// admit counts a run this replica is about to own. It refuses with the
// status to answer while the server drains or owns as many runs as it
// may: a run outlives its stream, so streams alone do not bound them.
func (s *service) admit() *status.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.draining:
		return turnStatus(drainError())
	case s.owned >= s.maxRuns:
		yes := true
		return turnStatus(&runtime.TurnError{
			Kind: llm.KindUnavailable, Retryable: &yes, RetryAfter: time.Second,
			Message: fmt.Sprintf("this server runs as many turns as it may (%d, server.max_running_turns); retry, another replica may take it", s.maxRuns),
		})
	}
	s.owned++
	s.turns.Add(1)
	return nil
}

// unadmit counts out a run admit counted, once it ended or was not
// created.
func (s *service) unadmit() {
	s.mu.Lock()
	s.owned--
	s.mu.Unlock()
	s.turns.Done()
}

// wait waits until every run this replica owns has ended, or ctx is done.
func (s *service) wait(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		s.turns.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

func (s *service) untrack(t *activeTurn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.active, t)
}

// drain makes new turns fail with UNAVAILABLE, and stops taking over
// the runs of replicas that died.
func (s *service) drain() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.draining = true
	s.stopTakeovers()
}

// cancelAll ends every running turn with a retryable UNAVAILABLE error,
// and returns how many there were.
func (s *service) cancelAll() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	cause := &llm.Error{Kind: llm.KindUnavailable, Message: "the server is shutting down; retry the turn"}
	for t := range s.active {
		t.cancel(cause)
	}
	return len(s.active)
}

// checks returns the server's checks of a request's content.
func (s *service) checks() wire.Checks {
	return wire.Checks{Schema: s.opts.CheckToolSchema, MaxMediaBytes: s.opts.MaxMediaBytes, MaxRequestMediaBytes: s.opts.MaxRequestMediaBytes}
}
