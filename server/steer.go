package server

import (
	"context"
	"encoding/json"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/wire"
)

// steerSignal is a SteerTurn routed to the replica that owns the run: the
// message's text parts and the client's request id.
type steerSignal struct {
	Texts     []string `json:"texts"`
	RequestID string   `json:"request_id,omitempty"`
}

// message returns the user message the signal carries.
func (m steerSignal) message() llm.Message {
	msg := llm.Message{Role: llm.RoleUser}
	for _, t := range m.Texts {
		msg.Parts = append(msg.Parts, llm.TextPart(t))
	}
	return msg
}

// steer gives a turn a steering message through its controls, once per
// request id; r, when not nil, is its run, whose log must hold the
// message (the first one's, for a duplicate) before the reply.
func steer(ctx context.Context, ctl *runtime.Controls, r *run, sig steerSignal) controlReply {
	seq, dup, err := ctl.SteerOnce(sig.RequestID, sig.message())
	if err != nil {
		return r.controlFailure(err, "")
	}
	if r != nil && !r.acked(ctx, seq) {
		return controlReply{Code: codes.Unavailable, Message: "the message was not stored: the turn ended or moved; retry"}
	}
	return controlReply{Seq: seq, Duplicate: dup}
}

// SteerTurn implements [turnstilev1.AgentServiceServer].
func (s *service) SteerTurn(ctx context.Context, req *turnstilev1.SteerTurnRequest) (*turnstilev1.SteerTurnResponse, error) {
	texts, bad := wire.Steering(req, s.opts.MaxEventBytes)
	if len(bad) > 0 {
		return nil, invalidArgument(bad).Err()
	}
	sig := steerSignal{Texts: texts, RequestID: req.GetRequestId()}
	if sig.RequestID != "" {
		logging.AddFields(ctx, logging.Fields{"request_id", sig.RequestID})
	}
	if s.store == nil {
		ctl, attempt := s.localControls(ctx, req.GetTurnId(), req.GetAttempt())
		if ctl == nil {
			return nil, notHere().Err()
		}
		reply := steer(ctx, ctl, nil, sig)
		if err := reply.err(); err != nil {
			return nil, err
		}
		return &turnstilev1.SteerTurnResponse{Attempt: attempt, Seq: reply.Seq, Duplicate: reply.Duplicate}, nil
	}
	k, st := s.resolve(ctx, req.GetTurnId(), req.GetAttempt())
	if st != nil {
		return nil, st.Err()
	}
	logging.AddFields(ctx, logging.Fields{"turn_id", k.turnID, "attempt", k.attempt})
	body, _ := json.Marshal(sig)
	reply, err := s.control(ctx, k, signalSteer+string(body), func(r *run) controlReply { return steer(ctx, r.ctl, r, sig) })
	if err != nil {
		return nil, err
	}
	if reply.Code == codes.FailedPrecondition && sig.RequestID != "" {
		// The run ended: a message it took with this id was taken once.
		if seq := s.storedSteer(ctx, k, sig.RequestID); seq != 0 {
			reply = controlReply{Seq: seq, Duplicate: true}
		}
	}
	if err := reply.err(); err != nil {
		return nil, err
	}
	return &turnstilev1.SteerTurnResponse{Attempt: k.attempt, Seq: reply.Seq, Duplicate: reply.Duplicate}, nil
}

// storedSteer returns the seq of the steered event of request id that
// run k's log holds; 0 when there is none or the log cannot be read.
func (s *service) storedSteer(ctx context.Context, k runKey, id string) uint64 {
	last, err := s.lastEvent(ctx, k)
	if err != nil || last == nil {
		return 0
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for b, err := range s.store.Events(ctx, k.id(), k.attempt, 0) {
		ev := &turnstilev1.AgentEvent{}
		if err != nil || proto.Unmarshal(b, ev) != nil {
			return 0
		}
		if ev.GetSteered().GetRequestId() == id {
			return ev.GetSeq()
		}
		if ev.GetSeq() >= last.GetSeq() {
			break
		}
	}
	return 0
}
