package durable

import (
	"context"
	"encoding/json"

	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// Steering is a user message for a running turn (a SteerTurn), routed to
// the replica that owns the run as a signal's JSON body: the message's
// text parts and the client's request id.
type Steering struct {
	Texts     []string `json:"texts"`
	RequestID string   `json:"request_id,omitempty"`
}

// Steered is what a Steering did: the seq of the turn's steered event,
// and whether the message's request id was taken already (the first
// message's seq then).
type Steered struct {
	Seq       uint64
	Duplicate bool
}

// message returns the user message the signal carries.
func (m Steering) message() llm.Message {
	msg := llm.Message{Role: llm.RoleUser}
	for _, t := range m.Texts {
		msg.Parts = append(msg.Parts, llm.TextPart(t))
	}
	return msg
}

// steer gives a turn a steering message through its controls, once per
// request id; r, when not nil, is its run, whose log must hold the
// message (the first one's, for a duplicate) before the reply.
func steer(ctx context.Context, ctl *runtime.Controls, r *run, sig Steering) controlReply {
	if r != nil {
		r.heardFrom()
	}
	seq, dup, err := ctl.SteerOnce(sig.RequestID, sig.message())
	if err != nil {
		return r.controlFailure(err, "")
	}
	if r != nil && !r.acked(ctx, seq) {
		return controlReply{Code: ControlRetry, Message: "the message was not stored: the turn ended or moved; retry"}
	}
	return controlReply{Seq: seq, Duplicate: dup}
}

// SteerHere gives a turn that runs here without a turn log a steering
// message through its controls, once per request id. It fails with a
// *ControlError.
func SteerHere(ctx context.Context, ctl *runtime.Controls, m Steering) (Steered, error) {
	reply := steer(ctx, ctl, nil, m)
	return Steered{Seq: reply.Seq, Duplicate: reply.Duplicate}, reply.err()
}

// Steer gives run k a steering message, wherever it runs, once per
// request id, and returns once the log holds it: here when this replica
// owns the run, else by a signal to its owner. A run that ended answers
// with the message it took under the request id, if any. It fails with a
// *ControlError, ErrStoreUnreachable or ErrCorrupt.
func (rs *Runs) Steer(ctx context.Context, k Key, m Steering) (Steered, error) {
	body, _ := json.Marshal(m)
	reply, err := rs.signals.control(ctx, k, signalSteer+string(body), func(r *run) controlReply { return steer(ctx, r.ctl, r, m) })
	if err != nil {
		return Steered{}, err
	}
	if reply.Code == ControlEnded && m.RequestID != "" {
		// The run ended: a message it took with this id was taken once.
		if seq := rs.signals.storedSteer(ctx, k, m.RequestID); seq != 0 {
			reply = controlReply{Seq: seq, Duplicate: true}
		}
	}
	return Steered{Seq: reply.Seq, Duplicate: reply.Duplicate}, reply.err()
}

// storedSteer returns the seq of the steered event of request id that
// run k's log holds; 0 when there is none or the log cannot be read.
func (sg signals) storedSteer(ctx context.Context, k Key, id string) uint64 {
	last, err := sg.rs.lastEvent(ctx, k)
	if err != nil || last == nil {
		return 0
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for b, err := range sg.rs.store.Events(ctx, k.id(), k.Attempt, 0) {
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
