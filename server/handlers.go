package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/google/uuid"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/admission"
	"github.com/turnstile-dev/turnstile/server/durable"
	"github.com/turnstile-dev/turnstile/server/guard"
	"github.com/turnstile-dev/turnstile/server/wire"
)

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

// runDurable serves RunTurn with a turn store (durable.Runs.Run): it
// creates the run or attaches to the one the store holds, and streams it.
// ctx is the call's, carrying the turn's charger.
func (s *service) runDurable(ctx context.Context, req *turnstilev1.RunTurnRequest, tr *runtime.TurnRequest, stream grpc.ServerStreamingServer[turnstilev1.RunTurnResponse]) error {
	k := durable.Key{Client: tr.Client, TurnID: req.GetTurnId(), Attempt: attemptOf(ctx, req)}
	if k.TurnID == "" {
		k.TurnID = uuid.NewString()
	}
	logging.AddFields(ctx, logging.Fields{"turn_id", k.TurnID, "attempt", k.Attempt})
	out, err := s.runs.Run(ctx, durable.Request{Key: k, Wire: req, Turn: tr}, runItems(stream))
	if out.Attached {
		logging.AddFields(ctx, logging.Fields{"attached", true})
	}
	if out.Delivered {
		// The turn ran here and its outcome reached the client: the turn's
		// own line says it all, and this RPC's goes to DEBUG, as without a
		// store. A stream that ended otherwise keeps its line.
		logging.AddFields(ctx, logging.Fields{guard.RanField, true})
	}
	if ref := (*admission.Refusal)(nil); errors.As(err, &ref) {
		// The key's stored_bytes: refused before it started.
		return s.refuse(ref, admission.FromContext(ctx).KeyName()).Err()
	}
	return s.durableStatus(ctx, err).Err()
}

// WatchTurn implements [turnstilev1.AgentServiceServer].
func (s *service) WatchTurn(req *turnstilev1.WatchTurnRequest, stream grpc.ServerStreamingServer[turnstilev1.WatchTurnResponse]) error {
	ctx := stream.Context()
	k, st := s.resolve(ctx, req.GetTurnId(), req.GetAttempt())
	if st != nil {
		return st.Err()
	}
	logging.AddFields(ctx, logging.Fields{"turn_id", k.TurnID, "attempt", k.Attempt, "after_seq", req.GetAfterSeq()})
	return s.durableStatus(ctx, s.runs.Watch(ctx, k, req.GetAfterSeq(), watchItems(stream))).Err()
}

// resolve checks a turn id and attempt named by WatchTurn, CancelTurn,
// ApproveToolCall or SteerTurn, resolves attempt 0 to the latest one, and
// makes sure the store holds the run of the caller's key.
func (s *service) resolve(ctx context.Context, turnID string, attempt uint32) (durable.Key, *status.Status) {
	if s.runs == nil {
		return durable.Key{}, status.New(codes.FailedPrecondition, "this server keeps no turn log (store.mode: off): turns cannot be watched or cancelled")
	}
	if turnID == "" {
		return durable.Key{}, invalidArgument([]*runtime.FieldError{{Field: "turn_id", Description: "required"}})
	}
	if len(turnID) > wire.MaxTurnIDLen {
		return durable.Key{}, invalidArgument([]*runtime.FieldError{{Field: "turn_id", Description: fmt.Sprintf("must be valid UTF-8 of at most %d bytes", wire.MaxTurnIDLen)}})
	}
	// The caller's turn ids are its key's: another key's do not exist
	// for it.
	k, err := s.runs.Resolve(ctx, admission.FromContext(ctx).KeyName(), turnID, attempt)
	if err != nil {
		return k, s.durableStatus(ctx, err)
	}
	return k, nil
}

// CancelTurn implements [turnstilev1.AgentServiceServer].
func (s *service) CancelTurn(ctx context.Context, req *turnstilev1.CancelTurnRequest) (*turnstilev1.CancelTurnResponse, error) {
	if s.runs == nil {
		return s.cancelHere(ctx, req)
	}
	k, st := s.resolve(ctx, req.GetTurnId(), req.GetAttempt())
	if st != nil {
		return nil, st.Err()
	}
	logging.AddFields(ctx, logging.Fields{"turn_id", k.TurnID, "attempt", k.Attempt})
	c, err := s.runs.Cancel(ctx, k)
	if err != nil {
		return nil, s.durableStatus(ctx, err).Err()
	}
	return &turnstilev1.CancelTurnResponse{Attempt: k.Attempt, Cancelled: c.Cancelled, LastSeq: c.LastSeq}, nil
}

// cancelHere serves CancelTurn on a server that keeps no turn log: a turn
// of the caller's key running here is stopped as a durable run is, and the
// call returns once its RunTurn stream has sent the last event. A turn
// running elsewhere cannot be reached: FAILED_PRECONDITION, as before
// (closing its stream cancels it).
func (s *service) cancelHere(ctx context.Context, req *turnstilev1.CancelTurnRequest) (*turnstilev1.CancelTurnResponse, error) {
	if bad := wire.TurnID(req.GetTurnId()); len(bad) > 0 {
		return nil, invalidArgument(bad).Err()
	}
	t, cancelled, err := s.local.stop(ctx, admission.FromContext(ctx).KeyName(), req.GetTurnId(), req.GetAttempt())
	if t == nil {
		return nil, status.Error(codes.FailedPrecondition, "this server keeps no turn log (store.mode: off) and the turn does not run on it: closing its RunTurn stream cancels it")
	}
	logging.AddFields(ctx, logging.Fields{"turn_id", t.turnID, "attempt", t.attempt})
	if err != nil {
		return nil, status.FromContextError(err).Err()
	}
	return &turnstilev1.CancelTurnResponse{Cancelled: cancelled, Attempt: t.attempt, LastSeq: t.lastSeq}, nil
}

// ApproveToolCall implements [turnstilev1.AgentServiceServer].
func (s *service) ApproveToolCall(ctx context.Context, req *turnstilev1.ApproveToolCallRequest) (*turnstilev1.ApproveToolCallResponse, error) {
	if bad := wire.Approval(req); len(bad) > 0 {
		return nil, invalidArgument(bad).Err()
	}
	client := admission.FromContext(ctx).KeyName()
	a := durable.Approval{CallID: req.GetCallId(), Approved: req.GetApproved(), Reason: req.GetReason(), DecidedBy: client}
	logging.AddFields(ctx, logging.Fields{"call_id", wire.Clip(a.CallID, wire.MaxEchoBytes), "approved", a.Approved})
	if s.runs == nil {
		ctl, attempt := s.local.controls(client, req.GetTurnId(), req.GetAttempt())
		if ctl == nil {
			return nil, notHere().Err()
		}
		d, err := durable.DecideHere(ctx, ctl, a)
		if err != nil {
			return nil, s.durableStatus(ctx, err).Err()
		}
		return &turnstilev1.ApproveToolCallResponse{Attempt: attempt, Applied: d.Applied, Approved: d.Approved, Seq: d.Seq}, nil
	}
	k, st := s.resolve(ctx, req.GetTurnId(), req.GetAttempt())
	if st != nil {
		return nil, st.Err()
	}
	logging.AddFields(ctx, logging.Fields{"turn_id", k.TurnID, "attempt", k.Attempt})
	d, err := s.runs.Approve(ctx, k, a)
	if err != nil {
		return nil, s.durableStatus(ctx, err).Err()
	}
	return &turnstilev1.ApproveToolCallResponse{Attempt: k.Attempt, Applied: d.Applied, Approved: d.Approved, Seq: d.Seq}, nil
}

// SteerTurn implements [turnstilev1.AgentServiceServer].
func (s *service) SteerTurn(ctx context.Context, req *turnstilev1.SteerTurnRequest) (*turnstilev1.SteerTurnResponse, error) {
	texts, bad := wire.Steering(req, s.opts.MaxEventBytes)
	if len(bad) > 0 {
		return nil, invalidArgument(bad).Err()
	}
	m := durable.Steering{Texts: texts, RequestID: req.GetRequestId()}
	if m.RequestID != "" {
		logging.AddFields(ctx, logging.Fields{"request_id", m.RequestID})
	}
	if s.runs == nil {
		ctl, attempt := s.local.controls(admission.FromContext(ctx).KeyName(), req.GetTurnId(), req.GetAttempt())
		if ctl == nil {
			return nil, notHere().Err()
		}
		r, err := durable.SteerHere(ctx, ctl, m)
		if err != nil {
			return nil, s.durableStatus(ctx, err).Err()
		}
		return &turnstilev1.SteerTurnResponse{Attempt: attempt, Seq: r.Seq, Duplicate: r.Duplicate}, nil
	}
	k, st := s.resolve(ctx, req.GetTurnId(), req.GetAttempt())
	if st != nil {
		return nil, st.Err()
	}
	logging.AddFields(ctx, logging.Fields{"turn_id", k.TurnID, "attempt", k.Attempt})
	r, err := s.runs.Steer(ctx, k, m)
	if err != nil {
		return nil, s.durableStatus(ctx, err).Err()
	}
	return &turnstilev1.SteerTurnResponse{Attempt: k.Attempt, Seq: r.Seq, Duplicate: r.Duplicate}, nil
}

// runItems returns the function that sends a run's events on a RunTurn
// stream: each as its wire form as stored, without a second encoding and
// without decoding it (codec.go's encodedResponse).
func runItems(stream grpc.ServerStreamingServer[turnstilev1.RunTurnResponse]) func(durable.Item) error {
	return func(it durable.Item) error {
		return stream.SendMsg(&encodedResponse{typ: runTurnResponseType, event: it.Wire})
	}
}

// watchItems is runItems for a WatchTurn stream.
func watchItems(stream grpc.ServerStreamingServer[turnstilev1.WatchTurnResponse]) func(durable.Item) error {
	return func(it durable.Item) error {
		return stream.SendMsg(&encodedResponse{typ: watchTurnResponseType, event: it.Wire})
	}
}
