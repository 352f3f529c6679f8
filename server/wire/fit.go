package wire

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
)

// ErrEventTooLarge is the failure of a turn one of whose events could not
// be made to fit the event size limit.
var ErrEventTooLarge = errors.New("server: event larger than max_event_bytes")

// Fit makes resp fit maxBytes (server.max_event_bytes), or fails. A
// turn_completed that is too large drops its messages, which the client
// has from the message_completed events, and says so (messages_omitted);
// a compaction drops its replacement the same way; any other event that
// is too large fails with an *llm.Error of [llm.KindInternal] whose
// message names the limit, wrapping [ErrEventTooLarge]: the turn ends.
func Fit(resp *turnstilev1.RunTurnResponse, maxBytes int) error {
	size := proto.Size(resp)
	if size <= maxBytes {
		return nil
	}
	if tc := resp.GetEvent().GetTurnCompleted(); tc != nil {
		tc.Messages, tc.MessagesOmitted = nil, true
		if size = proto.Size(resp); size <= maxBytes {
			return nil
		}
	}
	if c := resp.GetEvent().GetCompaction(); c != nil {
		c.Replacement, c.ReplacementOmitted = nil, true
		if size = proto.Size(resp); size <= maxBytes {
			return nil
		}
	}
	what := fmt.Sprintf("%T", resp.GetEvent().GetPayload())
	return &llm.Error{
		Kind:    llm.KindInternal,
		Message: fmt.Sprintf("an event of the turn was larger than the server sends (%d bytes, at most %d: server.max_event_bytes); the turn was ended", size, maxBytes),
		Err:     fmt.Errorf("%w: %s of %d bytes", ErrEventTooLarge, what, size),
	}
}

// ResponseSize is the wire size of a RunTurnResponse (or a
// WatchTurnResponse) holding an event of n bytes on the wire: its field's
// tag, length and bytes.
func ResponseSize(n int) int {
	return protowire.SizeTag(1) + protowire.SizeBytes(n)
}
