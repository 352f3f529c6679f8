package server

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// steerSignal is a SteerTurn routed to the replica that owns the run: the
// message's text parts and the client's request id.
type steerSignal struct {
	Texts     []string `json:"texts"`
	RequestID string   `json:"request_id,omitempty"`
}

// maxSteerRequestIDLen bounds a SteerTurn's request_id.
const maxSteerRequestIDLen = 128

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

// maxSteerBytes bounds the text of a steering message: it travels in a
// signal to the turn's owner (a core NATS message, 1 MiB by default) and
// is stored twice (steered, message_completed), each within the events'
// bound.
const maxSteerBytes = 256 << 10

// toSteering validates a SteerTurn's message: a user message (the role
// may be left unset) of text parts, of at most limit bytes of text.
func toSteering(bad *violations, m *turnstilev1.Message, limit int) steerSignal {
	var sig steerSignal
	if m == nil {
		bad.add("message", "required")
		return sig
	}
	if r := m.GetRole(); r != turnstilev1.Role_ROLE_USER && r != turnstilev1.Role_ROLE_UNSPECIFIED {
		bad.add("message.role", "must be ROLE_USER (or unset)")
	}
	switch n := len(m.GetParts()); {
	case n == 0:
		bad.add("message.parts", "at least one part is required")
	case n > maxPartsPerMessage:
		bad.add("message.parts", "at most %d parts are allowed, got %d", maxPartsPerMessage, n)
		return sig
	}
	for i, p := range m.GetParts() {
		t, ok := p.GetKind().(*turnstilev1.Part_Text)
		switch {
		case !ok:
			bad.add(fmt.Sprintf("message.parts[%d]", i), "a steering message holds text parts only")
			continue
		case strings.TrimSpace(t.Text) == "":
			// It would reach the model as an empty text block, which
			// providers refuse.
			bad.add(fmt.Sprintf("message.parts[%d].text", i), "must hold text other than white space")
		}
		sig.Texts = append(sig.Texts, t.Text)
	}
	size := 0
	for _, t := range sig.Texts {
		size += len(t)
	}
	if size > limit {
		bad.add("message.parts", "a steering message holds at most %d bytes of text, got %d", limit, size)
	}
	return sig
}

// SteerTurn implements [turnstilev1.AgentServiceServer].
func (s *service) SteerTurn(ctx context.Context, req *turnstilev1.SteerTurnRequest) (*turnstilev1.SteerTurnResponse, error) {
	var bad violations
	checkTurnID(&bad, req.GetTurnId())
	sig := toSteering(&bad, req.GetMessage(), min(maxSteerBytes, s.opts.MaxEventBytes/2))
	if id := req.GetRequestId(); len(id) > maxSteerRequestIDLen || !utf8.ValidString(id) {
		bad.add("request_id", "must be valid UTF-8 of at most %d bytes", maxSteerRequestIDLen)
	}
	if len(bad) > 0 {
		return nil, invalidArgument(bad).Err()
	}
	sig.RequestID = req.GetRequestId()
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
