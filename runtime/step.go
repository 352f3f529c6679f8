package runtime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/turnstile-dev/turnstile/policy"

	"github.com/turnstile-dev/turnstile/llm"
)

// step gets one committed-ready assistant message from the model chain,
// retrying, falling back and compacting as the policy decides.
func (t *turn) step(ctx context.Context, maxCalls int) (llm.Message, llm.StopReason, error) {
	r := t.r
	number := 0 // attempts on the current model in this step
	compacted := false
	for {
		if err := t.ctxErr(ctx); err != nil {
			return llm.Message{}, 0, err
		}
		m := t.chain[t.pos]
		number++
		t.counters.ModelCalls++
		if err := t.emit(ctx, Event{LLMCallStarted: &LLMCallStarted{
			Model: m.Alias, Provider: m.ProviderName, ProviderModel: m.ID,
			Attempt: number, Call: t.counters.ModelCalls,
		}}); err != nil {
			return llm.Message{}, 0, t.sinkFailure(ctx)
		}
		res := t.call(ctx, m)
		t.usage = t.usage.Add(res.usage)
		fin := &LLMCallFinished{
			Model: m.Alias, Attempt: number, Usage: res.usage, Stop: res.stop,
			Duration: res.duration, TimeToFirstChunk: res.ttfc,
		}
		if res.err != nil {
			fin.Err = &TurnError{Kind: res.err.Kind, Message: res.err.Message, RetryAfter: res.err.RetryAfter, Model: m.Alias}
		}
		if ctx.Err() != nil {
			// Nothing but the terminal event follows a cancellation.
			t.countAttempt(m.Alias, llm.AsError(t.ctxErr(ctx)))
			return llm.Message{}, 0, t.ctxErr(ctx)
		}
		if err := t.emit(ctx, Event{LLMCallFinished: fin}); err != nil {
			return llm.Message{}, 0, t.sinkFailure(ctx)
		}
		if !res.usage.IsZero() {
			u := t.usage
			if err := t.emit(ctx, Event{Usage: &u}); err != nil {
				return llm.Message{}, 0, t.sinkFailure(ctx)
			}
		}
		t.countAttempt(m.Alias, res.err)
		if res.err == nil {
			r.health.Success(m.Alias)
			if t.probe == m.Alias {
				t.probe = ""
			}
			return res.msg, res.stop, nil
		}

		e := res.err
		e.Model = m.Alias
		exhausted := r.health.Failure(m.Alias, e.Kind)
		remaining := time.Duration(-1)
		if dl, ok := ctx.Deadline(); ok {
			remaining = dl.Sub(r.opts.now())
		}
		next := t.nextModel(false)
		d := policy.Policy{Retry: m.Retry}.Decide(policy.Attempt{
			Kind: e.Kind, Hint: e.Hint, RetryAfter: e.RetryAfter,
			Number:            number,
			HasFallback:       next >= 0,
			HasLargerFallback: next >= 0 && t.hasLargerFallback(next),
			Compacted:         compacted,
			BudgetExhausted:   exhausted,
			Remaining:         remaining,
			OutOfCalls:        t.counters.ModelCalls >= maxCalls,
			Jitter:            r.opts.jitter(),
		})
		if d.Cooldown > 0 {
			r.health.Cooldown(m.Alias, e.Kind, r.opts.now(), d.Cooldown)
		}
		if t.probe == m.Alias {
			r.health.Release(m.Alias)
			t.probe = ""
		}
		r.opts.logger.Debug("model call failed", "turn_id", t.id, "model", m.Alias, "attempt", number,
			"kind", e.Kind.String(), "action", d.Action.String(), "delay", d.Delay, "request_id", e.RequestID)

		switch d.Action {
		case policy.ActionRetry:
			t.counters.Retries++
			ev := &Retry{
				Attempt: number + 1, MaxAttempts: m.Retry.MaxRetries + 1, Model: m.Alias,
				Delay: d.Delay, Kind: e.Kind, Message: e.Message,
				DiscardPartial: res.streamed, DiscardFromSeq: res.firstSeq,
			}
			if !res.streamed {
				ev.DiscardFromSeq = 0
			}
			if err := t.emit(ctx, Event{Retry: ev}); err != nil {
				return llm.Message{}, 0, t.sinkFailure(ctx)
			}
			if err := sleep(ctx, d.Delay); err != nil {
				return llm.Message{}, 0, t.ctxErr(ctx)
			}
		case policy.ActionFallback:
			next = t.nextModel(true)
			if next < 0 {
				return llm.Message{}, 0, t.toTurnError(e, d)
			}
			t.counters.Fallbacks++
			ev := &Fallback{
				From: m.Alias, To: t.chain[next].Alias, Kind: e.Kind, Message: e.Message,
				DiscardPartial: res.streamed,
			}
			if res.streamed {
				ev.DiscardFromSeq = res.firstSeq
			}
			if err := t.emit(ctx, Event{Fallback: ev}); err != nil {
				return llm.Message{}, 0, t.sinkFailure(ctx)
			}
			t.pos, number, compacted = next, 0, false
		case policy.ActionCompact:
			if res.streamed {
				// Tell consumers to drop the failed attempt's output.
				if err := t.emit(ctx, Event{Retry: &Retry{
					Attempt: number + 1, MaxAttempts: m.Retry.MaxRetries + 1, Model: m.Alias,
					Kind: e.Kind, Message: e.Message, DiscardPartial: true, DiscardFromSeq: res.firstSeq,
				}}); err != nil {
					return llm.Message{}, 0, t.sinkFailure(ctx)
				}
			}
			ok, err := t.compact(ctx)
			if err != nil {
				return llm.Message{}, 0, err
			}
			if !ok {
				return llm.Message{}, 0, t.toTurnError(e, policy.Decision{})
			}
			compacted = true
		default:
			return llm.Message{}, 0, t.toTurnError(e, d)
		}
	}
}

// compact shortens the conversation with the runner's compactor and emits
// a Compaction event. It reports false when nothing could be removed.
func (t *turn) compact(ctx context.Context) (bool, error) {
	c := t.r.opts.compactor
	before := t.conv
	after, err := c.Compact(ctx, t.req.System, before)
	if err != nil {
		if ctx.Err() != nil {
			return false, t.ctxErr(ctx)
		}
		return false, &llm.Error{Kind: llm.KindContextOverflow, Message: "the conversation is too long and could not be compacted", Err: err}
	}
	bb, ba := ConversationSize(before), ConversationSize(after)
	if ba >= bb {
		return false, nil
	}
	t.conv = after
	t.counters.Compactions++
	if err := t.emit(ctx, Event{Compaction: &Compaction{
		Strategy: c.Name(), MessagesBefore: len(before), MessagesAfter: len(after),
		BytesBefore: bb, BytesAfter: ba,
	}}); err != nil {
		return false, t.sinkFailure(ctx)
	}
	return true, nil
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// callResult is the outcome of one attempt at a model call.
type callResult struct {
	msg   llm.Message
	stop  llm.StopReason
	usage llm.Usage
	err   *llm.Error
	// streamed reports that output events reached the sink; firstSeq is the
	// first of them.
	streamed bool
	firstSeq uint64
	duration time.Duration
	ttfc     time.Duration
}

// errTimeout is the cause of an attempt cancelled by its own watchdog.
var errTimeout = errors.New("runtime: attempt timed out")

// call makes one attempt at a model call, streaming its output as events.
func (t *turn) call(ctx context.Context, m *Model) (res callResult) {
	start := time.Now()
	defer func() { res.duration = time.Since(start) }()

	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// One watchdog timer per attempt: armed for the first chunk, then
	// re-armed after each chunk for the idle gap.
	var gotFirst atomic.Bool
	var timedOut atomic.Value // string: which limit passed
	fire := func() {
		if gotFirst.Load() {
			timedOut.Store(fmt.Sprintf("the model's stream stalled longer than the idle timeout (%s)", m.IdleTimeout))
		} else {
			timedOut.Store(fmt.Sprintf("no output from the model within the first-token timeout (%s)", m.FirstTokenTimeout))
		}
		cancel(errTimeout)
	}
	var timer *time.Timer
	if m.FirstTokenTimeout > 0 {
		timer = time.AfterFunc(m.FirstTokenTimeout, fire)
	}
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()

	req := &llm.Request{
		Model:           m.ID,
		System:          t.req.System,
		Messages:        t.conv,
		Tools:           t.toolSpecs(m),
		MaxOutputTokens: m.MaxOutputTokens,
		Temperature:     t.req.Temperature,
		StopSequences:   t.req.StopSequences,
	}
	if t.req.MaxOutputTokens > 0 {
		req.MaxOutputTokens = t.req.MaxOutputTokens
	}

	var b assembler
	stopped := false
	for c, err := range m.Provider.Stream(actx, req) {
		if err != nil {
			res.err = t.classify(ctx, m, err, b.streamed, &timedOut)
			break
		}
		if !gotFirst.Load() {
			gotFirst.Store(true)
			res.ttfc = time.Since(start)
		}
		switch {
		case m.IdleTimeout <= 0:
			if timer != nil {
				timer.Stop()
			}
		case timer == nil:
			timer = time.AfterFunc(m.IdleTimeout, fire)
		default:
			timer.Reset(m.IdleTimeout)
		}
		if c.Kind == llm.ChunkUsage {
			res.usage = c.Usage
			continue
		}
		if c.Kind == llm.ChunkStop {
			res.stop, stopped = c.Stop, true
			continue
		}
		ev, ok := b.add(c, t.r.opts.newID)
		if !ok {
			continue
		}
		seq := t.nextSeq()
		if err := t.emit(ctx, ev); err != nil {
			res.err = llm.AsError(t.sinkFailure(ctx))
			return res
		}
		if !b.streamed {
			b.streamed, res.firstSeq = true, seq
		}
	}
	res.streamed = b.streamed
	if res.err == nil && !stopped {
		res.err = t.classify(ctx, m, nil, b.streamed, &timedOut)
	}
	if res.err == nil {
		res.msg = b.message(res.stop)
	}
	return res
}

// classify turns a failed or unfinished stream into a classified error.
// The caller's context is judged first: whatever the provider said, a
// cancelled turn is cancelled.
func (t *turn) classify(ctx context.Context, m *Model, err error, streamed bool, timedOut *atomic.Value) *llm.Error {
	if cerr := t.ctxErr(ctx); cerr != nil {
		return llm.AsError(cerr)
	}
	if what, ok := timedOut.Load().(string); ok {
		return &llm.Error{Kind: llm.KindTimeout, Provider: m.ProviderName, Message: what, Err: err}
	}
	if err == nil {
		if streamed {
			return &llm.Error{Kind: llm.KindStreamInterrupted, Provider: m.ProviderName, Message: "the model's stream ended before the reply was complete"}
		}
		return &llm.Error{Kind: llm.KindServerError, Provider: m.ProviderName, Message: "the model's stream ended without a reply"}
	}
	var e *llm.Error
	if !errors.As(err, &e) {
		// An unclassified provider failure: never retried blindly.
		return &llm.Error{Kind: llm.KindInternal, Provider: m.ProviderName, Message: "the provider failed in an unexpected way", Err: err}
	}
	c := *e
	if c.Provider == "" {
		c.Provider = m.ProviderName
	}
	c.Kind = policy.Classify(c.Kind, streamed)
	return &c
}

// toolSpecs lists the tools offered to model m: its allowed server tools,
// then the client's.
func (t *turn) toolSpecs(m *Model) []llm.ToolSpec {
	var specs []llm.ToolSpec
	for _, s := range t.r.toolSpecs {
		if t.allowed(m, s.Name) {
			specs = append(specs, s)
		}
	}
	return append(specs, t.req.ClientTools...)
}

func (t *turn) allowed(m *Model, name string) bool {
	if m.Tools == nil {
		return true
	}
	for _, n := range m.Tools {
		if n == name {
			return true
		}
	}
	return false
}

// assembler builds an assistant message from chunks and turns chunks into
// delta events.
type assembler struct {
	parts    []llm.Part
	text     *strings.Builder
	textAt   int
	thinking map[int]int // chunk index -> part index
	calls    map[int]int // chunk index -> part index
	args     map[int]*strings.Builder
	ended    map[int]bool
	streamed bool
}

// add records c and returns the event to emit for it.
func (b *assembler) add(c llm.Chunk, newID func() string) (Event, bool) {
	switch c.Kind {
	case llm.ChunkText:
		if c.Text == "" {
			return Event{}, false
		}
		if b.text == nil || b.textAt != len(b.parts)-1 {
			b.text = &strings.Builder{}
			b.parts = append(b.parts, llm.Part{Kind: llm.PartText})
			b.textAt = len(b.parts) - 1
		}
		b.text.WriteString(c.Text)
		b.parts[b.textAt].Text = b.text.String()
		return Event{TextDelta: &TextDelta{Text: c.Text}}, true
	case llm.ChunkThinking:
		if b.thinking == nil {
			b.thinking = map[int]int{}
		}
		i, ok := b.thinking[c.Index]
		if !ok {
			b.parts = append(b.parts, llm.Part{Kind: llm.PartThinking})
			i = len(b.parts) - 1
			b.thinking[c.Index] = i
			b.text = nil
		}
		b.parts[i].Text += c.Text
		if c.Signature != "" {
			b.parts[i].Signature = c.Signature
		}
		return Event{ThinkingDelta: &ThinkingDelta{Text: c.Text, Signature: c.Signature}}, true
	case llm.ChunkToolCallStart:
		if b.calls == nil {
			b.calls, b.args, b.ended = map[int]int{}, map[int]*strings.Builder{}, map[int]bool{}
		}
		id := c.CallID
		if id == "" {
			id = "call_" + newID()
		}
		b.parts = append(b.parts, llm.Part{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: id, Name: c.Name}})
		b.calls[c.Index] = len(b.parts) - 1
		b.args[c.Index] = &strings.Builder{}
		b.text = nil
		return Event{ToolCallDelta: &ToolCallDelta{Index: c.Index, CallID: id, Name: c.Name}}, true
	case llm.ChunkToolCallArgs:
		i, ok := b.calls[c.Index]
		if !ok || c.Text == "" {
			return Event{}, false
		}
		b.args[c.Index].WriteString(c.Text)
		b.parts[i].ToolCall.Arguments = b.args[c.Index].String()
		return Event{ToolCallDelta: &ToolCallDelta{Index: c.Index, ArgumentsDelta: c.Text}}, true
	case llm.ChunkToolCallEnd:
		if _, ok := b.calls[c.Index]; ok {
			b.ended[c.Index] = true
		}
	}
	return Event{}, false
}

// message returns the assembled message. A reply cut by the output limit
// loses the tool calls whose arguments were not complete.
func (b *assembler) message(stop llm.StopReason) llm.Message {
	m := llm.Message{Role: llm.RoleAssistant}
	for idx, p := range b.parts {
		if p.Kind == llm.PartToolCall {
			complete := false
			for ci, pi := range b.calls {
				if pi == idx {
					complete = b.ended[ci]
				}
			}
			if !complete && stop == llm.StopMaxTokens {
				continue
			}
			if p.ToolCall.Arguments == "" {
				p.ToolCall.Arguments = "{}"
			}
			tc := *p.ToolCall
			p.ToolCall = &tc
		}
		m.Parts = append(m.Parts, p)
	}
	return m
}
