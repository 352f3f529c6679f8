package wire

import (
	"context"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// Checks are the server's bounds and checks of a request that its
// configuration sets.
type Checks struct {
	// Schemas, when not nil, checks the JSON Schemas of the tools a
	// request declares, all at once, under the request's context: one
	// error per schema, nil for each that passes; an error is a violation
	// of the tool's input_schema.
	Schemas func(ctx context.Context, schemas [][]byte) []error
	// MaxMediaBytes bounds one media part (0: [DefaultMaxMediaBytes]).
	MaxMediaBytes int
	// MaxRequestMediaBytes bounds the media of one request, all parts
	// together (0: [DefaultMaxRequestMediaBytes]).
	MaxRequestMediaBytes int
}

// TurnRequest validates req and converts it for the runtime. It reports
// every problem it finds, each naming its field (e.g.
// "messages[0].parts[1].media.uri"); the request is converted only when
// there is none. ctx is the request's: the schema checks stop once it is
// done.
func TurnRequest(ctx context.Context, req *turnstilev1.RunTurnRequest, c Checks) (*runtime.TurnRequest, []*runtime.FieldError) {
	tr, bad := toTurnRequest(ctx, req, c.Schemas, mediaLimits{perPart: c.MaxMediaBytes, perRequest: c.MaxRequestMediaBytes})
	return tr, bad
}

// AgentEvent converts a runtime event for the wire. A payload it does not
// know is an error wrapping [ErrUnmapped], never an event without a
// payload.
func AgentEvent(ev runtime.Event) (*turnstilev1.AgentEvent, error) { return fromEvent(ev) }

// Response converts a runtime event into the response that carries it, as
// [AgentEvent] does, in one allocation for the common text delta.
func Response(ev runtime.Event) (*turnstilev1.RunTurnResponse, error) { return toResponse(ev) }

// ErrorCode maps a runtime kind to the wire's error code of the same name.
func ErrorCode(k llm.Kind) turnstilev1.ErrorCode { return errorCode(k) }

// Kind maps a wire error code back to the runtime's kind; a code that
// names no kind is [llm.KindInternal].
func Kind(c turnstilev1.ErrorCode) llm.Kind { return kindOf(c) }

// Limits on text the server repeats (see [Clip]).
const (
	// MaxEchoBytes bounds a piece of client input quoted back.
	MaxEchoBytes = maxEchoBytes
	// MaxMessageBytes bounds an error message on the wire or in a status.
	MaxMessageBytes = maxMessageBytes
	// MaxTurnIDLen bounds a turn id.
	MaxTurnIDLen = maxTurnIDLen
)

// Clip returns s cut to at most n bytes on a rune boundary, with a note of
// how much was cut, and with invalid UTF-8 replaced: for client input and
// upstream messages the server repeats in statuses, events and logs.
func Clip(s string, n int) string { return clip(s, n) }

// Quote returns client input clipped to [MaxEchoBytes] and quoted, for
// messages.
func Quote(s string) string { return quote(s) }

// CountItems returns the violation, named as validation names it, when b,
// a RunTurnRequest on the wire, holds more messages, parts (in all) or
// tools than validation lets through; nil otherwise. It reads the wire
// form without decoding it: decoding costs memory in proportion to the
// items, not only to the bytes. Malformed input is left to the decoder.
func CountItems(b []byte) *runtime.FieldError { return countItems(b) }
