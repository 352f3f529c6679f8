package wire

import (
	"fmt"
	"strings"
	"unicode/utf8"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/runtime"
)

// Bounds of the requests that reach a running turn.
const (
	// maxReasonBytes bounds an ApproveToolCall's reason.
	maxReasonBytes = 4096
	// maxSteerRequestIDLen bounds a SteerTurn's request_id.
	maxSteerRequestIDLen = 128
	// maxSteerBytes bounds the text of a steering message: it travels in a
	// signal to the turn's owner (a core NATS message, 1 MiB by default)
	// and is stored twice (steered, message_completed), each within the
	// events' bound.
	maxSteerBytes = 256 << 10
)

// checkTurnID adds what is wrong with a turn id that names a running
// turn.
func checkTurnID(bad *violations, id string) {
	switch {
	case id == "":
		bad.add("turn_id", "required")
	case len(id) > maxTurnIDLen || !utf8.ValidString(id):
		bad.add("turn_id", "must be valid UTF-8 of at most %d bytes", maxTurnIDLen)
	}
}

// TurnID returns what is wrong with a turn id that names a running turn
// (CancelTurn without a store); none when it is valid.
func TurnID(id string) []*runtime.FieldError {
	var bad violations
	checkTurnID(&bad, id)
	return bad
}

// Approval returns what is wrong with an ApproveToolCall; none when it is
// valid.
func Approval(req *turnstilev1.ApproveToolCallRequest) []*runtime.FieldError {
	var bad violations
	checkTurnID(&bad, req.GetTurnId())
	switch {
	case req.GetCallId() == "":
		bad.add("call_id", "required")
	case len(req.GetCallId()) > maxCallIDLen:
		bad.add("call_id", "must be at most %d bytes", maxCallIDLen)
	}
	if len(req.GetReason()) > maxReasonBytes || !utf8.ValidString(req.GetReason()) {
		bad.add("reason", "must be valid UTF-8 of at most %d bytes", maxReasonBytes)
	}
	return bad
}

// Steering validates a SteerTurn and returns the text parts of its
// message, or what is wrong with it. The message holds at most
// maxEventBytes/2 bytes of text (and at most 256 KiB): it is stored twice.
func Steering(req *turnstilev1.SteerTurnRequest, maxEventBytes int) ([]string, []*runtime.FieldError) {
	var bad violations
	checkTurnID(&bad, req.GetTurnId())
	texts := toSteering(&bad, req.GetMessage(), min(maxSteerBytes, maxEventBytes/2))
	if id := req.GetRequestId(); len(id) > maxSteerRequestIDLen || !utf8.ValidString(id) {
		bad.add("request_id", "must be valid UTF-8 of at most %d bytes", maxSteerRequestIDLen)
	}
	if len(bad) > 0 {
		return nil, bad
	}
	return texts, nil
}

// toSteering validates a SteerTurn's message: a user message (the role
// may be left unset) of text parts, of at most limit bytes of text.
func toSteering(bad *violations, m *turnstilev1.Message, limit int) []string {
	var texts []string
	if m == nil {
		bad.add("message", "required")
		return texts
	}
	if r := m.GetRole(); r != turnstilev1.Role_ROLE_USER && r != turnstilev1.Role_ROLE_UNSPECIFIED {
		bad.add("message.role", "must be ROLE_USER (or unset)")
	}
	switch n := len(m.GetParts()); {
	case n == 0:
		bad.add("message.parts", "at least one part is required")
	case n > maxPartsPerMessage:
		bad.add("message.parts", "at most %d parts are allowed, got %d", maxPartsPerMessage, n)
		return texts
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
		texts = append(texts, t.Text)
	}
	size := 0
	for _, t := range texts {
		size += len(t)
	}
	if size > limit {
		bad.add("message.parts", "a steering message holds at most %d bytes of text, got %d", limit, size)
	}
	return texts
}
