package wire

import (
	"fmt"
	"math"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/runtime"
)

// fromCompaction converts a Compaction event for the wire: what replaces
// what in the conversation, for the client to apply. A replacement too
// large for one event is left out when the event is sent (fitEvent).
func fromCompaction(e *runtime.Compaction) *turnstilev1.Compaction {
	c := &turnstilev1.Compaction{
		Strategy: e.Strategy, MessagesBefore: uint32(e.MessagesBefore), MessagesAfter: uint32(e.MessagesAfter),
		BytesBefore: uint64(e.BytesBefore), BytesAfter: uint64(e.BytesAfter),
		ReplacedFrom: uint32(e.ReplacedFrom), ReplacedCount: uint32(e.ReplacedCount),
		Trigger:      turnstilev1.CompactionTrigger_COMPACTION_TRIGGER_OVERFLOW,
		SummaryError: e.SummaryError, EstimatedTokens: uint64(e.EstimatedTokens),
		ReplacementOmitted: e.ReplacementOmitted,
	}
	if e.BeforeCall {
		c.Trigger = turnstilev1.CompactionTrigger_COMPACTION_TRIGGER_NEAR_WINDOW
	}
	if len(e.Replacement) > 0 {
		c.Replacement = make([]*turnstilev1.Message, len(e.Replacement))
		for i, m := range e.Replacement {
			c.Replacement[i] = fromMessage(m)
		}
	}
	return c
}

// toCompaction is fromCompaction's inverse, for a compaction read back
// from a turn's log. The log's replacement was checked when it was made;
// its media are bounded by the request's.
func toCompaction(c *turnstilev1.Compaction) (*runtime.Compaction, error) {
	e := &runtime.Compaction{
		Strategy: c.GetStrategy(), MessagesBefore: int(c.GetMessagesBefore()), MessagesAfter: int(c.GetMessagesAfter()),
		BytesBefore: int(c.GetBytesBefore()), BytesAfter: int(c.GetBytesAfter()),
		BeforeCall:   c.GetTrigger() == turnstilev1.CompactionTrigger_COMPACTION_TRIGGER_NEAR_WINDOW,
		ReplacedFrom: int(c.GetReplacedFrom()), ReplacedCount: int(c.GetReplacedCount()),
		SummaryError: c.GetSummaryError(), EstimatedTokens: int(c.GetEstimatedTokens()),
		ReplacementOmitted: c.GetReplacementOmitted(),
	}
	var bad violations
	unbounded := mediaLimits{perPart: math.MaxInt, perRequest: math.MaxInt}
	for i, m := range c.GetReplacement() {
		e.Replacement = append(e.Replacement, toMessage(&bad, &unbounded, fmt.Sprintf("compaction.replacement[%d]", i), m))
	}
	if len(bad) > 0 {
		return nil, bad[0]
	}
	return e, nil
}
