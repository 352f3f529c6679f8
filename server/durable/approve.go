package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/wire"
)

// Signals that carry a payload: the signal's name, then a JSON body.
const (
	signalApprove = "approve:"
	signalSteer   = "steer:"
)

// Approval is a decision on a tool call that waits for one: an
// ApproveToolCall, routed to the replica that owns the run as a signal's
// JSON body.
type Approval struct {
	CallID   string `json:"call_id"`
	Approved bool   `json:"approved"`
	Reason   string `json:"reason,omitempty"`
	// DecidedBy names the caller's client key; empty without keys.
	DecidedBy string `json:"decided_by,omitempty"`
}

// Decided is what an Approval did: whether it applied (false: the call
// was decided before, and that decision stands), the decision that
// stands, and the seq of its tool_approval_decided event.
type Decided struct {
	Applied, Approved bool
	Seq               uint64
}

// controlReply is an owner's reply to an approve or steer signal: its
// outcome, or the code and message of its refusal (ControlCode). Its JSON
// is what replicas of this version and the one before exchange.
type controlReply struct {
	Code     ControlCode `json:"code,omitempty"`
	Message  string      `json:"message,omitempty"`
	Applied  bool        `json:"applied,omitempty"`
	Approved bool        `json:"approved,omitempty"`
	Seq      uint64      `json:"seq,omitempty"`
	// Duplicate says a steering message's request id was taken already.
	Duplicate bool `json:"duplicate,omitempty"`
}

// err returns the *ControlError the reply stands for; nil when it
// succeeded.
func (c controlReply) err() error {
	if c.Code == 0 {
		return nil
	}
	return &ControlError{Code: c.Code, Message: c.Message}
}

// refused returns the reply of a refusal.
func refused(e *ControlError) controlReply { return controlReply{Code: e.Code, Message: e.Message} }

// controlFailure maps a failure of the controls of a turn to the reply
// that says it; r, when not nil, is the turn's run.
func (r *run) controlFailure(err error, callID string) controlReply {
	if r != nil && r.handedOff.Load() {
		// This replica is shutting down: the turn goes on elsewhere.
		return controlReply{Code: ControlRetry, Message: "the server running the turn is shutting down and another takes it over; retry"}
	}
	return refused(ControlRefusal(err, callID))
}

// ControlRefusal maps a failure of a turn's runtime.Controls (deciding a
// call callID, steering) to the refusal that says it.
func ControlRefusal(err error, callID string) *ControlError {
	switch {
	case errors.Is(err, runtime.ErrNotAwaiting):
		return &ControlError{Code: ControlNotFound, Message: fmt.Sprintf("the turn asked for no approval of call %q", wire.Clip(callID, wire.MaxEchoBytes))}
	case errors.Is(err, runtime.ErrTurnEnded):
		return &ControlError{Code: ControlEnded, Message: "the turn has ended"}
	case errors.Is(err, runtime.ErrSteerQueueFull):
		return &ControlError{Code: ControlFull, Message: "the turn holds the most queued steering messages the server allows (turn.max_steer_messages); wait until it takes them"}
	case errors.Is(err, runtime.ErrSteerBudget):
		// The runtime's error gives the bound, the message's size and
		// what is left, no text of the message.
		return &ControlError{Code: ControlFull, Message: strings.TrimPrefix(err.Error(), "runtime: ") + "; start a new turn to say more"}
	case errors.Is(err, runtime.ErrTurnNotStarted):
		return &ControlError{Code: ControlRetry, Message: "the turn is starting; retry"}
	}
	return &ControlError{Code: ControlInternal, Message: "internal error"}
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
func decide(ctx context.Context, ctl *runtime.Controls, r *run, sig Approval) controlReply {
	if r != nil {
		r.heardFrom()
	}
	d, applied, err := ctl.Decide(sig.CallID, runtime.Decision{Approved: sig.Approved, Reason: sig.Reason, DecidedBy: sig.DecidedBy})
	if err != nil {
		return r.controlFailure(err, sig.CallID)
	}
	if r != nil && !r.acked(ctx, d.Seq) {
		return controlReply{Code: ControlRetry, Message: "the decision was not stored: the turn ended or moved; retry"}
	}
	return controlReply{Applied: applied, Approved: d.Approved, Seq: d.Seq}
}

// DecideHere applies a decision to a turn that runs here without a turn
// log, through its controls. It fails with a *ControlError.
func DecideHere(ctx context.Context, ctl *runtime.Controls, a Approval) (Decided, error) {
	reply := decide(ctx, ctl, nil, a)
	return Decided{Applied: reply.Applied, Approved: reply.Approved, Seq: reply.Seq}, reply.err()
}

// answerPayload answers an approve or steer signal sent to run r, which
// this replica owns; ok is false for another signal.
func (sg signals) answerPayload(r *run, sig string) (reply []byte, ok bool) {
	var out controlReply
	switch {
	case strings.HasPrefix(sig, signalApprove):
		var a Approval
		if err := json.Unmarshal([]byte(sig[len(signalApprove):]), &a); err != nil {
			out = controlReply{Code: ControlInternal, Message: "internal error"}
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), signalTimeout)
		defer cancel()
		out = decide(ctx, r.ctl, r, a)
	case strings.HasPrefix(sig, signalSteer):
		var m Steering
		if err := json.Unmarshal([]byte(sig[len(signalSteer):]), &m); err != nil {
			out = controlReply{Code: ControlInternal, Message: "internal error"}
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

// Approve applies a decision to run k, wherever it runs, and returns once
// the log holds it: here when this replica owns the run, else by a signal
// to its owner. A run that ended answers with the decision it stored for
// the call, if any. It fails with a *ControlError, ErrStoreUnreachable or
// ErrCorrupt.
func (rs *Runs) Approve(ctx context.Context, k Key, a Approval) (Decided, error) {
	body, _ := json.Marshal(a)
	reply, err := rs.signals.control(ctx, k, signalApprove+string(body), func(r *run) controlReply { return decide(ctx, r.ctl, r, a) })
	if err != nil {
		return Decided{}, err
	}
	if reply.Code == ControlEnded {
		// The run ended: a decision it stored stands; a call it never
		// asked about is not found.
		switch d, asked := rs.signals.storedDecision(ctx, k, a.CallID); {
		case d != nil:
			reply = controlReply{Approved: d.GetToolApprovalDecided().GetApproved(), Seq: d.GetSeq()}
		case !asked:
			reply = refused(ControlRefusal(runtime.ErrNotAwaiting, a.CallID))
		}
	}
	return Decided{Applied: reply.Applied, Approved: reply.Approved, Seq: reply.Seq}, reply.err()
}

// control applies a signal to run k: here when this replica owns it
// (here), else by the store's signal to its owner. A run no replica owns
// is read from the log: FAILED_PRECONDITION when it ended, UNAVAILABLE
// while it waits to be taken over.
func (sg signals) control(ctx context.Context, k Key, sig string, here func(*run) controlReply) (controlReply, error) {
	r := sg.rs.owned.get(k)
	if r != nil {
		return here(r), nil
	}
	b, err := sg.rs.store.Signal(ctx, k.id(), k.Attempt, sig)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		last, err := sg.rs.lastEvent(ctx, k)
		if err != nil {
			sg.rs.logger.Warn("turn store unreachable: run not read", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
			return controlReply{}, ErrStoreUnreachable
		}
		if last != nil && terminal(last) {
			return controlReply{Code: ControlEnded, Message: "the turn has ended"}, nil
		}
		return controlReply{Code: ControlRetry, Message: "the server running the turn went away and another takes it over; retry"}, nil
	case err != nil:
		sg.rs.logger.Warn("turn store unreachable: signal not sent", "turn_id", k.TurnID, "attempt", k.Attempt, "error", err)
		return controlReply{}, ErrStoreUnreachable
	}
	var reply controlReply
	if err := json.Unmarshal(b, &reply); err != nil {
		return controlReply{}, ErrCorrupt
	}
	return reply, nil
}

// storedDecision returns the tool_approval_decided event of call callID
// that run k's log holds, nil when there is none, and whether the run
// asked for approval of the call (true when the log cannot be read).
func (sg signals) storedDecision(ctx context.Context, k Key, callID string) (decided *turnstilev1.AgentEvent, asked bool) {
	last, err := sg.rs.lastEvent(ctx, k)
	if err != nil || last == nil {
		return nil, true
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for b, err := range sg.rs.store.Events(ctx, k.id(), k.Attempt, 0) {
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
