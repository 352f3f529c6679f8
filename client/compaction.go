package client

import (
	"slices"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// ApplyCompaction applies a compaction event to conv, the conversation it
// indexes (the request's messages followed by the messages the turn
// committed before the event, as earlier compactions left it): the
// replaced_count messages from replaced_from are replaced by replacement.
// It returns conv unchanged and false when c cannot be applied (its
// replacement was omitted for its size, or its range is outside conv);
// the turn's later compactions cannot be applied then either. The
// client's turns apply them already ([Result.Conversation]); this is for
// callers that follow a turn's events themselves (WatchTurn).
func ApplyCompaction(conv []*turnstilev1.Message, c *turnstilev1.Compaction) ([]*turnstilev1.Message, bool) {
	from, count := int(c.GetReplacedFrom()), int(c.GetReplacedCount())
	if c.GetReplacementOmitted() || from+count > len(conv) {
		return conv, false
	}
	return slices.Concat(conv[:from], c.GetReplacement(), conv[from+count:]), true
}
