package server

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"go.opentelemetry.io/otel/metric"
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
	"github.com/turnstile-dev/turnstile/server/durable"
	"github.com/turnstile-dev/turnstile/server/guard"
	"github.com/turnstile-dev/turnstile/server/wire"
)

// AttemptHeader is the request metadata key in which a client numbers its
// attempts at one turn id, so logs tie them together.
const AttemptHeader = "turnstile-attempt"

// turnRunner is what the service needs from the runtime.
type turnRunner interface {
	Validate(req *runtime.TurnRequest) error
	FirstCall(req *runtime.TurnRequest) runtime.CallBound
	Run(ctx context.Context, req *runtime.TurnRequest, sink runtime.Sink) (*runtime.TurnCompleted, error)
	Models() []string
	DefaultModel() string
	ContinuesCut(req *runtime.TurnRequest) bool
}

// service implements turnstile.v1.AgentService over a runner: it checks
// and converts requests (package wire), and hands each call to the part
// that serves it: a turn without a store runs here, on the handler's
// goroutine, into its delivery.Outbox; with a store, durable.Runs creates,
// attaches, streams and signals runs. It maps what they return to statuses
// (status.go, durable_status.go), and nothing else.
type service struct {
	turnstilev1.UnimplementedAgentServiceServer
	runner turnRunner
	logger *slog.Logger
	opts   *Options

	// runs are the durable runs; nil without a store, when turns live in
	// the stream that runs them, tracked in local.
	runs  *durable.Runs
	local *localTurns
	// senders run the streams' Sends.
	senders *delivery.Workers
	// gate bounds the turns running at once (max_concurrent_turns); keys
	// holds the client keys and their limiters, nil without keys. A turn
	// that outlives its call, or that this replica takes over, holds its
	// slots in both until it ends.
	gate *admission.Gate
	keys *admission.Keys
	// memory bounds the turns the server starts by its memory
	// (server.memory_limit), per key and in all.
	memory *admission.Memory
	// refusals counts the turns admission refused, by limit and key.
	refusals metric.Int64Counter
}

var _ turnstilev1.AgentServiceServer = (*service)(nil)

// The server's meter, and its instrument of refused turns.
const (
	meterName          = "github.com/turnstile-dev/turnstile/server"
	metricTurnsRefused = "turnstile.turns.refused"
)

func newService(r turnRunner, opts *Options) *service {
	s := &service{
		runner: r, logger: opts.Logger, opts: opts, local: newLocalTurns(),
		senders: delivery.NewWorkers(streamWorkers),
		gate:    admission.NewGate(opts.MaxConcurrentTurns),
		memory:  admission.NewMemory(opts.MemoryLimit, opts.TurnMemory, opts.MemoryInUse),
	}
	// An instrument error (a bad name) is a broken build: the no-op
	// instrument returned keeps the server serving.
	s.refusals, _ = opts.MeterProvider.Meter(meterName).Int64Counter(metricTurnsRefused, metric.WithUnit("{turn}"),
		metric.WithDescription("Turns refused before they started, by the limit that refused them (turnstile.limit: max_concurrent_turns, memory_limit, or the client key's) and client key."))
	if len(opts.Keys) > 0 {
		s.keys = admission.NewKeys(opts.Keys, opts.Clock)
	}
	if opts.Store != nil {
		s.runs = durable.New(durable.Config{
			Store: opts.Store, Runner: r, Logger: opts.Logger, Keys: s.keys, Gate: s.gate, Memory: s.memory,
			Streams: s.streams(), DetachGrace: opts.DetachGrace, Pace: opts.StorePace, MaxRunning: opts.MaxRunningTurns,
			MaxEventBytes: opts.MaxEventBytes, Checks: s.checks(), Now: opts.Clock,
		})
	}
	return s
}

// streams is what every stream of the server shares.
func (s *service) streams() delivery.Config {
	return delivery.Config{SendTimeout: s.opts.SendTimeout, Start: s.senders.Run}
}

// maxCauseBytes bounds the root cause of a failure on a log line.
const maxCauseBytes = 4096

// RunTurn implements [turnstilev1.AgentServiceServer].
func (s *service) RunTurn(req *turnstilev1.RunTurnRequest, stream grpc.ServerStreamingServer[turnstilev1.RunTurnResponse]) error {
	k := admission.FromContext(stream.Context())
	tr, st := s.request(stream.Context(), req, k)
	if err := stream.Context().Err(); err != nil {
		// The client left, or its deadline passed, while the request was
		// checked: no turn starts for it.
		return status.FromContextError(err).Err()
	}
	if st != nil {
		logging.AddFields(stream.Context(), logging.Fields{"error_code", codeReasonOf(st)})
		return st.Err()
	}
	// What its first model call may use, held against its key's token
	// limits and budgets until the call reports its use: the turn does not
	// start when they do not cover it. The call's slots drop the hold when
	// it ends, or the turn's when a durable turn keeps them.
	// Without keys a turn holds nothing: nothing to estimate, drop or
	// carry.
	usage, ctx := k.Charger(), stream.Context()
	if usage != nil {
		if err := usage.Reserve(s.runner.FirstCall(tr)); err != nil {
			st := s.refuse(err, k.KeyName())
			logging.AddFields(ctx, logging.Fields{"error_code", codeReasonOf(st)})
			return st.Err()
		}
		admission.SlotsFrom(ctx).Add(usage.Unreserve)
		ctx = admission.WithCharger(ctx, usage)
	}
	tr.Budget = usage.BudgetHook()
	if s.runs != nil {
		return s.runDurable(ctx, req, tr, stream)
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
	attempt := attemptOf(stream.Context(), req)
	t := &localTurn{cancel: cancel, client: tr.Client, turnID: tr.TurnID, attempt: attempt, ctl: tr.Controls, ended: make(chan struct{})}
	if !s.local.track(t) {
		return turnStatus(drainError()).Err()
	}
	defer s.local.untrack(t)

	out := delivery.NewOutbox(stream.Send, cancel, s.streams(), s.opts.MaxEventBytes, usage, attempt)
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
// returns the status that refuses it; ctx is the call's.
func (s *service) request(ctx context.Context, req *turnstilev1.RunTurnRequest, k *admission.Client) (*runtime.TurnRequest, *status.Status) {
	tr, bad := wire.TurnRequest(ctx, req, s.checks())
	if len(bad) > 0 {
		return nil, invalidArgument(bad)
	}
	alias, err := admission.ModelFor(k, tr.Model, s.runner.DefaultModel(), s.runner.Models())
	var me *admission.ModelError
	if errors.As(err, &me) {
		return nil, modelStatus(me)
	}
	tr.Model, tr.Client = alias, k.KeyName()
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

// drain makes new turns fail with UNAVAILABLE, and stops taking over
// the runs of replicas that died.
func (s *service) drain() {
	s.local.drain()
	if s.runs != nil {
		s.runs.Drain()
	}
}

// errShuttingDown ends the turns still running when the server stops.
var errShuttingDown = &llm.Error{Kind: llm.KindUnavailable, Message: "the server is shutting down; retry the turn"}

// cancelAll ends every running turn with a retryable UNAVAILABLE error,
// and returns how many there were.
func (s *service) cancelAll() int {
	n := s.local.cancelAll(errShuttingDown)
	if s.runs != nil {
		n += s.runs.CancelAll(errShuttingDown)
	}
	return n
}

// errShed ends a durable turn that nobody read while the server's memory
// was near its limit: its client may read on, watch it to read this, or
// run its next attempt.
var errShed = &llm.Error{Kind: llm.KindUnavailable, RetryAfter: time.Second,
	Message: "the server's memory neared its limit (server.memory_limit) while no client read the turn, and it was ended to make room; run the turn's next attempt"}

// shedUnread ends the durable turns of client key client that run here
// and that nobody reads (see durable.Runs.ShedUnread), and returns how
// many; 0 without a store, where a turn whose client does not read holds
// no more than its stream's queue and waits on its Send until
// send_timeout cancels it.
func (s *service) shedUnread(client string) int {
	if s.runs == nil {
		return 0
	}
	n := s.runs.ShedUnread(client, errShed)
	if n > 0 {
		s.logger.Warn("memory near its limit: ended the turns nobody reads of the client key that runs the most", "client", client, "turns", n, "memory_limit", s.memory.Limit())
	}
	return n
}

// handOff gives the durable runs this replica owns to the others (see
// durable.Runs.HandOff), and returns how many there were; 0 without a
// store.
func (s *service) handOff() int {
	if s.runs == nil {
		return 0
	}
	return s.runs.HandOff()
}

// wait waits until every run this replica owns has ended, or ctx is done.
func (s *service) wait(ctx context.Context) {
	if s.runs != nil {
		s.runs.Wait(ctx)
	}
}

// close ends the waiting workers.
func (s *service) close() {
	s.senders.Close()
	if s.runs != nil {
		s.runs.Close()
	}
}

// checks returns the server's checks of a request's content.
func (s *service) checks() wire.Checks {
	return wire.Checks{Schemas: s.opts.CheckToolSchemas, MaxMediaBytes: s.opts.MaxMediaBytes, MaxRequestMediaBytes: s.opts.MaxRequestMediaBytes}
}
