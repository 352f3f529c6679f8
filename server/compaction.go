package server

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

// toEdit reads a stored Compaction event for a resumed turn, made once
// committed messages had been committed. One whose replacement was left
// out cannot be replayed: its edit (From -1) ends the replay, as a client
// stops applying the turn's compactions there.
func toEdit(c *turnstilev1.Compaction, committed int) (runtime.ConversationEdit, error) {
	e := runtime.ConversationEdit{Committed: committed, From: int(c.GetReplacedFrom()), Count: int(c.GetReplacedCount())}
	if c.GetReplacementOmitted() {
		e.From = -1
		return e, nil
	}
	var bad violations
	// The log's replacement was checked when it was made; its media are
	// bounded by the request's.
	unbounded := mediaLimits{perPart: math.MaxInt, perRequest: math.MaxInt}
	for i, m := range c.GetReplacement() {
		e.Replacement = append(e.Replacement, toMessage(&bad, &unbounded, fmt.Sprintf("compaction.replacement[%d]", i), m))
	}
	if len(bad) > 0 {
		return e, bad[0]
	}
	return e, nil
}
