package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"reflect"

	"github.com/turnstile-dev/turnstile/llm"
)

// bytesPerToken is the estimate of a conversation's tokens from its bytes
// when no provider has reported its size yet.
const bytesPerToken = 4

// promptSeen is the prompt size a provider reported for a call whose
// conversation was the first msgs messages of the turn's conversation.
type promptSeen struct {
	tokens int
	msgs   int
	// read and write are the cache read and cache write tokens among
	// tokens.
	read, write int
}

// noteInput keeps the prompt size a successful call reported: input,
// cache read and cache write tokens together, which every adapter
// reports apart.
func (mc *modelCalls) noteInput(c *call) {
	u := c.res.usage
	if c.res.err != nil || c.lost || u.InputTokens+u.CacheReadTokens+u.CacheWriteTokens <= 0 {
		return
	}
	mc.seen = promptSeen{tokens: int(u.InputTokens + u.CacheReadTokens + u.CacheWriteTokens), msgs: min(len(c.req.Messages), len(mc.t.conv)),
		read: int(u.CacheReadTokens), write: int(u.CacheWriteTokens)}
}

// estimateTokens estimates the prompt of a call to m now: the size the
// provider last reported plus a quarter of the bytes of the messages
// committed since, or, before any report (or after a compaction), a
// quarter of the bytes of the system prompt, the tool definitions and the
// conversation.
func (mc *modelCalls) estimateTokens(m *Model) int {
	return mc.seen.estimate(mc.t.req.System, mc.t.conv, mc.t.tools.toolSpecs(m))
}

// estimate estimates a prompt of system, msgs and tools from the size a
// provider last reported, seen (zero when none): see [modelCalls.estimateTokens].
func (seen promptSeen) estimate(system string, msgs []llm.Message, tools []llm.ToolSpec) int {
	if seen.tokens > 0 && seen.msgs <= len(msgs) {
		return seen.tokens + ConversationSize(msgs[seen.msgs:])/bytesPerToken
	}
	n := len(system) + ConversationSize(msgs)
	for _, s := range tools {
		n += len(s.Name) + len(s.Description) + len(s.Schema)
	}
	return n / bytesPerToken
}

// compactBefore compacts the conversation before a call to m when m has a
// compaction block and the conversation's estimated size reached its share
// of m's context window. A conversation the compactor cannot shorten goes
// to the call as it is (an overflow is then handled as before).
func (t *turn) compactBefore(ctx context.Context, m *Model) error {
	cc := m.Compaction
	if cc == nil || m.ContextWindow <= 0 {
		return nil
	}
	est := t.calls.estimateTokens(m)
	if float64(est) < cc.at()*float64(m.ContextWindow) {
		return nil
	}
	var c Compactor = t.r.opts.compactor
	if cc.Strategy == CompactSummarize {
		sm := t.r.models[cc.Model]
		if rt := t.r.routers[cc.Model]; rt != nil && len(rt.deps) > 0 {
			// The deployment the summary calls (a model's first), with
			// its provider's name and its price.
			sm = rt.deps[0]
		}
		c = &Summarize{Model: sm, Alias: cc.Model, KeepEnds: keepEndsOf(c)}
	}
	_, err := t.compactWith(ctx, c, m, est, 0)
	return err
}

// keepEndsOf returns c when it is a [KeepEnds], else the default one.
func keepEndsOf(c Compactor) KeepEnds {
	if k, ok := c.(KeepEnds); ok {
		return k
	}
	return KeepEnds{}
}

// compactWith shortens the conversation with c for model m, emits a
// Compaction event saying what replaced what and tells the observer; est
// is the estimate that triggered a compaction before a call, zero after
// attempt number on m overflowed. It reports false when nothing could be
// removed.
func (t *turn) compactWith(ctx context.Context, c Compactor, m *Model, est, number int) (bool, error) {
	before := t.conv
	after, err := c.Compact(ctx, t.req.System, before)
	s, summarized := c.(*Summarize)
	if summarized {
		// The summary call's tokens were spent, whatever comes of them.
		if s.Model != nil {
			s.usage.Cost = llm.CostOf(s.Model.Price, s.usage)
		}
		t.usage = t.usage.Add(s.usage)
		if !s.usage.IsZero() {
			// The running totals, as after a model call: the client and
			// the key's budget count the summary's tokens even when the
			// turn ends before its next call.
			t.out.emit(ctx, &UsageUpdated{Total: t.usage})
		}
	}
	if err := t.stopped(ctx); err != nil {
		// Stopped during a summary call (which then fell back to
		// keep_ends): the turn ends here, its conversation as it was.
		return false, err
	}
	if err != nil {
		return false, &llm.Error{Kind: llm.KindContextOverflow, Message: "the conversation is too long and could not be compacted", Err: err}
	}
	bb, ba := ConversationSize(before), ConversationSize(after)
	if ba >= bb {
		return false, nil
	}
	t.conv = after
	t.calls.seen = promptSeen{}
	t.counters.Compactions++
	ev := &Compaction{
		Strategy: c.Name(), MessagesBefore: len(before), MessagesAfter: len(after),
		BytesBefore: bb, BytesAfter: ba, BeforeCall: est > 0, EstimatedTokens: est,
	}
	ev.ReplacedFrom, ev.ReplacedCount, ev.Replacement = replacement(before, after)
	info := CompactionInfo{
		TurnID: t.info.TurnID, Model: m.Alias, BeforeCall: est > 0, Attempt: number,
		MessagesBefore: len(before), MessagesAfter: len(after),
	}
	if summarized {
		ev.Strategy, ev.SummaryError = s.outcome()
		info.SummaryModel, info.SummaryUsage = s.Alias, s.usage
		if s.Model != nil {
			info.SummaryProvider = s.Model.ProviderName
		}
	}
	info.Strategy, info.SummaryError = ev.Strategy, ev.SummaryError
	t.out.emit(ctx, ev)
	t.obs.Compaction(ctx, info)
	return true, nil
}

// replacement describes after as an edit of before: the messages from,
// from+count of before are replaced by repl; the messages around them are
// the same in both.
func replacement(before, after []llm.Message) (from, count int, repl []llm.Message) {
	for from < len(before) && from < len(after) && reflect.DeepEqual(before[from], after[from]) {
		from++
	}
	tail := 0
	for tail < len(before)-from && tail < len(after)-from &&
		reflect.DeepEqual(before[len(before)-1-tail], after[len(after)-1-tail]) {
		tail++
	}
	return from, len(before) - from - tail, after[from : len(after)-tail]
}

// cacheRequest sets what asks m's provider for its prompt cache: the
// stable prefix's marks and a key of the conversation, a digest of the
// model, the system prompt and the first message, so that one
// conversation's calls (and turns) share a cache, and no text is sent.
func (mc *modelCalls) cacheRequest(m *Model, req *llm.Request) {
	if m.PromptCache == PromptCacheOff {
		return
	}
	req.CachePrompt = true
	if mc.cacheKeyOf == m {
		req.PromptCacheKey = mc.cacheKey
		return
	}
	h := sha256.New()
	for _, s := range []string{m.ProviderName, m.ID, mc.t.req.System} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	if len(mc.t.conv) > 0 {
		for _, p := range mc.t.conv[0].Parts {
			h.Write([]byte(p.Text))
			h.Write([]byte{0})
		}
	}
	mc.cacheKey, mc.cacheKeyOf = "ts-"+hex.EncodeToString(h.Sum(nil)[:12]), m
	req.PromptCacheKey = mc.cacheKey
}

// ConversationEdit is a compaction a turn made, for a turn resumed from
// its events: once Committed of the turn's messages had been committed,
// messages From to From+Count of the conversation were replaced by
// Replacement (see [Compaction]).
type ConversationEdit struct {
	Committed   int
	From, Count int
	Replacement []llm.Message
}

// conversation returns the conversation of a resumed turn whose request
// held msgs: msgs and the messages committed, with the edits made in
// between. An edit that does not fit the conversation ends the replay:
// the rest is appended as committed.
func (rs *Resume) conversation(msgs []llm.Message) []llm.Message {
	conv := msgs
	next := 0 // the first committed message not yet in conv
	for _, e := range rs.Edits {
		if e.Committed < next || e.Committed > len(rs.Committed) {
			break
		}
		conv = append(conv, rs.Committed[next:e.Committed]...)
		next = e.Committed
		if e.From < 0 || e.Count < 0 || e.From+e.Count > len(conv) {
			break
		}
		out := make([]llm.Message, 0, len(conv)-e.Count+len(e.Replacement))
		out = append(out, conv[:e.From]...)
		out = append(out, e.Replacement...)
		conv = append(out, conv[e.From+e.Count:]...)
	}
	return append(conv, rs.Committed[next:]...)
}
