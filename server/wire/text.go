package wire

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Limits on text the server repeats: client input quoted in a status or a
// log line, and messages of errors it puts on the wire.
const (
	// maxEchoBytes bounds a piece of client input quoted back.
	maxEchoBytes = 64
	// maxMessageBytes bounds an error message on the wire or in a status.
	maxMessageBytes = 2048
)

// clip returns s cut to at most n bytes on a rune boundary, with a note of
// how much was cut, and with invalid UTF-8 replaced: for client input and
// upstream messages the server repeats in statuses, events and logs.
func clip(s string, n int) string {
	if len(s) <= n {
		return strings.ToValidUTF8(s, "\uFFFD")
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d more bytes)", strings.ToValidUTF8(s[:cut], "\uFFFD"), len(s)-cut)
}

// quote returns client input clipped to maxEchoBytes and quoted, for
// messages.
func quote(s string) string { return fmt.Sprintf("%q", clip(s, maxEchoBytes)) }
