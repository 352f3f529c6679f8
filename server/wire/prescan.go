package wire

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/turnstile-dev/turnstile/runtime"
)

// Decoding a request costs memory in proportion to the number of its
// messages and parts, not only to its bytes: 3 MB of one-word messages
// become some 60 MB of Go values. countItems reads a RunTurnRequest's wire
// form, without decoding it, and refuses one with more messages, parts or
// tools than validation would let through, before it is decoded.

// Field numbers of RunTurnRequest and Message (proto/turnstile/v1).
const (
	fieldRequestMessages = 4
	fieldRequestTools    = 5
	fieldMessageParts    = 2
)

// countItems returns the violation, named as validation names it, when b,
// a RunTurnRequest on the wire, holds more than the allowed messages,
// parts (in all) or tools; nil otherwise. Malformed input is left to the
// decoder.
func countItems(b []byte) *runtime.FieldError {
	messages, parts, tools := 0, 0, 0
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return nil
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		switch num {
		case fieldRequestMessages:
			messages++
			parts += countField(v, fieldMessageParts)
		case fieldRequestTools:
			tools++
		}
	}
	bad := func(field, format string, args ...any) *runtime.FieldError {
		return &runtime.FieldError{Field: field, Description: fmt.Sprintf(format, args...)}
	}
	switch {
	case messages > maxMessages:
		return bad("messages", "at most %d messages are allowed, got %d", maxMessages, messages)
	case parts > maxParts:
		return bad("messages", "at most %d parts are allowed in all messages, got %d", maxParts, parts)
	case tools > maxTools:
		return bad("tools", "at most %d tools are allowed, got %d", maxTools, tools)
	}
	return nil
}

// countField counts the occurrences of field num at the top of message b.
func countField(b []byte, num protowire.Number) int {
	count := 0
	for len(b) > 0 {
		n, typ, m := protowire.ConsumeTag(b)
		if m < 0 {
			return count
		}
		b = b[m:]
		if m = protowire.ConsumeFieldValue(n, typ, b); m < 0 {
			return count
		}
		b = b[m:]
		if n == num {
			count++
		}
	}
	return count
}
