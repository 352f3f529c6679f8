package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/admission"
	"github.com/turnstile-dev/turnstile/server/wire"
)

// Signals that carry a payload: the signal's name, then a JSON body.
const (
	signalApprove = "approve:"
	signalSteer   = "steer:"
)

// approveSignal is an ApproveToolCall routed to the replica that owns the
// run.
type approveSignal struct {
	CallID    string `json:"call_id"`
	Approved  bool   `json:"approved"`
	Reason    string `json:"reason,omitempty"`
	DecidedBy string `json:"decided_by,omitempty"`
}

// controlReply is an owner's reply to an approve or steer signal: its
// outcome, or the status code and message to answer with.
type controlReply struct {
	Code     codes.Code `json:"code,omitempty"`
	Message  string     `json:"message,omitempty"`
	Applied  bool       `json:"applied,omitempty"`
	Approved bool       `json:"approved,omitempty"`
	Seq      uint64     `json:"seq,omitempty"`
	// Duplicate says a steering message's request id was taken already.
	Duplicate bool `json:"duplicate,omitempty"`
}

// err returns the status the reply stands for; nil when it succeeded.
func (c controlReply) err() error {
	if c.Code == codes.OK {
		return nil
	}
	return status.Error(c.Code, c.Message)
}

// controlFailure maps a failure of the controls of a turn to the reply
// that says it; r, when not nil, is the turn's run.
func (r *run) controlFailure(err error, callID string) controlReply {
	if r != nil && r.handedOff.Load() {
		// This replica is shutting down: the turn goes on elsewhere.
		return controlReply{Code: codes.Unavailable, Message: "the server running the turn is shutting down and another takes it over; retry"}
	}
	return controlError(err, callID)
}

// controlError maps a failure of the runtime's controls to the reply
// that says it.
func controlError(err error, callID string) controlReply {
	switch {
	case errors.Is(err, runtime.ErrNotAwaiting):
		return controlReply{Code: codes.NotFound, Message: fmt.Sprintf("the turn asked for no approval of call %q", wire.Clip(callID, wire.MaxEchoBytes))}
	case errors.Is(err, runtime.ErrTurnEnded):
		return controlReply{Code: codes.FailedPrecondition, Message: "the turn has ended"}
	case errors.Is(err, runtime.ErrSteerQueueFull):
		return controlReply{Code: codes.ResourceExhausted, Message: "the turn holds the most queued steering messages the server allows (turn.max_steer_messages); wait until it takes them"}
	case errors.Is(err, runtime.ErrTurnNotStarted):
		return controlReply{Code: codes.Unavailable, Message: "the turn is starting; retry"}
	}
	return controlReply{Code: codes.Internal, Message: "internal error"}
}

// acked waits until the run's event seq is acknowledged by the store (and
// in its window), and reports whether it was before the run ended or ctx
// was done.
func (r *run) acked(ctx context.Context, seq uint64) bool {
	for {
		r.mu.Lock()
		if r.last >= seq {
			r.mu.Unlock()
			return true
		}
		if r.done {
			r.mu.Unlock()
			return false
		}
		wake := r.wakeChan()
		r.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return false
		}
	}
}

// decide applies a decision to a turn through its controls; r, when not
// nil, is its run, whose log must hold the decision before the reply.
func decide(ctx context.Context, ctl *runtime.Controls, r *run, sig approveSignal) controlReply {
	d, applied, err := ctl.Decide(sig.CallID, runtime.Decision{Approved: sig.Approved, Reason: sig.Reason, DecidedBy: sig.DecidedBy})
	if err != nil {
		return r.controlFailure(err, sig.CallID)
	}
	if r != nil && !r.acked(ctx, d.Seq) {
		return controlReply{Code: codes.Unavailable, Message: "the decision was not stored: the turn ended or moved; retry"}
	}
	return controlReply{Applied: applied, Approved: d.Approved, Seq: d.Seq}
}

// onPayloadSignal answers an approve or steer signal sent to run r, which
// this replica owns; ok is false for another signal.
func (s *service) onPayloadSignal(r *run, sig string) (reply []byte, ok bool) {
	var out controlReply
	switch {
	case strings.HasPrefix(sig, signalApprove):
		var a approveSignal
		if err := json.Unmarshal([]byte(sig[len(signalApprove):]), &a); err != nil {
			out = controlReply{Code: codes.Internal, Message: "internal error"}
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), signalTimeout)
		defer cancel()
		out = decide(ctx, r.ctl, r, a)
	case strings.HasPrefix(sig, signalSteer):
		var m steerSignal
		if err := json.Unmarshal([]byte(sig[len(signalSteer):]), &m); err != nil {
			out = controlReply{Code: codes.Internal, Message: "internal error"}
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), signalTimeout)
		defer cancel()
		out = steer(ctx, r.ctl, r, m)
	default:
		return nil, false
	}
	b, _ := json.Marshal(out)
	return b, true
}

// signalTimeout bounds how long an owner waits for the store to hold what
// a signal did.
const signalTimeout = 30 * time.Second

// ApproveToolCall implements [turnstilev1.AgentServiceServer].
func (s *service) ApproveToolCall(ctx context.Context, req *turnstilev1.ApproveToolCallRequest) (*turnstilev1.ApproveToolCallResponse, error) {
	if bad := wire.Approval(req); len(bad) > 0 {
		return nil, invalidArgument(bad).Err()
	}
	sig := approveSignal{CallID: req.GetCallId(), Approved: req.GetApproved(), Reason: req.GetReason(), DecidedBy: admission.FromContext(ctx).KeyName()}
	logging.AddFields(ctx, logging.Fields{"call_id", wire.Clip(sig.CallID, wire.MaxEchoBytes), "approved", sig.Approved})
	if s.store == nil {
		ctl, attempt := s.localControls(ctx, req.GetTurnId(), req.GetAttempt())
		if ctl == nil {
			return nil, notHere().Err()
		}
		reply := decide(ctx, ctl, nil, sig)
		if err := reply.err(); err != nil {
			return nil, err
		}
		return &turnstilev1.ApproveToolCallResponse{Attempt: attempt, Applied: reply.Applied, Approved: reply.Approved, Seq: reply.Seq}, nil
	}
	k, st := s.resolve(ctx, req.GetTurnId(), req.GetAttempt())
	if st != nil {
		return nil, st.Err()
	}
	logging.AddFields(ctx, logging.Fields{"turn_id", k.turnID, "attempt", k.attempt})
	body, _ := json.Marshal(sig)
	reply, err := s.control(ctx, k, signalApprove+string(body), func(r *run) controlReply { return decide(ctx, r.ctl, r, sig) })
	if err != nil {
		return nil, err
	}
	if reply.Code == codes.FailedPrecondition {
		// The run ended: a decision it stored stands; a call it never
		// asked about is not found.
		switch d, asked := s.storedDecision(ctx, k, sig.CallID); {
		case d != nil:
			reply = controlReply{Approved: d.GetToolApprovalDecided().GetApproved(), Seq: d.GetSeq()}
		case !asked:
			reply = controlError(runtime.ErrNotAwaiting, sig.CallID)
		}
	}
	if err := reply.err(); err != nil {
		return nil, err
	}
	return &turnstilev1.ApproveToolCallResponse{Attempt: k.attempt, Applied: reply.Applied, Approved: reply.Approved, Seq: reply.Seq}, nil
}

// control applies a signal to run k: here when this replica owns it
// (here), else by the store's signal to its owner. A run no replica owns
// is read from the log: FAILED_PRECONDITION when it ended, UNAVAILABLE
// while it waits to be taken over.
func (s *service) control(ctx context.Context, k runKey, sig string, here func(*run) controlReply) (controlReply, error) {
	s.mu.Lock()
	r := s.runs[k]
	s.mu.Unlock()
	if r != nil {
		return here(r), nil
	}
	b, err := s.store.Signal(ctx, k.id(), k.attempt, sig)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		last, err := s.lastEvent(ctx, k)
		if err != nil {
			s.logger.Warn("turn store unreachable: run not read", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
			return controlReply{}, storeUnreachable().Err()
		}
		if last != nil && terminal(last) {
			return controlReply{Code: codes.FailedPrecondition, Message: "the turn has ended"}, nil
		}
		return controlReply{Code: codes.Unavailable, Message: "the server running the turn went away and another takes it over; retry"}, nil
	case err != nil:
		s.logger.Warn("turn store unreachable: signal not sent", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
		return controlReply{}, storeUnreachable().Err()
	}
	var reply controlReply
	if err := json.Unmarshal(b, &reply); err != nil {
		return controlReply{}, status.Error(codes.Internal, "internal error")
	}
	return reply, nil
}

// storedDecision returns the tool_approval_decided event of call callID
// that run k's log holds, nil when there is none, and whether the run
// asked for approval of the call (true when the log cannot be read).
func (s *service) storedDecision(ctx context.Context, k runKey, callID string) (decided *turnstilev1.AgentEvent, asked bool) {
	last, err := s.lastEvent(ctx, k)
	if err != nil || last == nil {
		return nil, true
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for b, err := range s.store.Events(ctx, k.id(), k.attempt, 0) {
		ev := &turnstilev1.AgentEvent{}
		if err != nil || proto.Unmarshal(b, ev) != nil {
			return nil, true
		}
		if ev.GetToolApprovalRequested().GetCallId() == callID {
			asked = true
		}
		if d := ev.GetToolApprovalDecided(); d != nil && d.GetCallId() == callID {
			return ev, true
		}
		if ev.GetSeq() >= last.GetSeq() {
			break
		}
	}
	return nil, asked
}

// notHere is the status of ApproveToolCall and SteerTurn on a server that
// keeps no turn log, for a turn that does not run on it.
func notHere() *status.Status {
	return status.New(codes.FailedPrecondition, "this server keeps no turn log (store.mode: off) and the turn does not run on it: send the call to the server running the turn")
}

// localControls returns the controls of the turn turnID of the caller's
// key running on this replica without a store, and its attempt; nil when
// it runs elsewhere or has ended.
func (s *service) localControls(ctx context.Context, turnID string, attempt uint32) (*runtime.Controls, uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.localTurn(ctx, turnID, attempt); t != nil {
		return t.ctl, t.key.attempt
	}
	return nil, 0
}

// localTurn returns the turn turnID of the caller's key running on this
// replica without a store, its latest attempt when attempt is 0; nil when
// it runs elsewhere or has ended. The caller holds s.mu.
func (s *service) localTurn(ctx context.Context, turnID string, attempt uint32) *activeTurn {
	client := admission.FromContext(ctx).KeyName()
	var best *activeTurn
	for t := range s.active {
		if t.ctl == nil || t.key.client != client || t.key.turnID != turnID {
			continue
		}
		if attempt != 0 && t.key.attempt != attempt {
			continue
		}
		if best == nil || t.key.attempt > best.key.attempt {
			best = t
		}
	}
	return best
}
