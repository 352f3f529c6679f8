package runtime

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync/atomic"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
)

// modelCalls makes a turn's model calls: it builds each call's request
// (the conversation, the tools, the options the model takes, the prompt
// cache's marks, what continues a cut reply), streams the provider's
// chunks into events under a watchdog, races a hedged call against a slow
// one, and charges each call's usage. It holds what only the calls touch:
// the prompt size the provider last reported and the prompt cache key.
type modelCalls struct {
	t *turn
	// seen is the prompt size the provider last reported, for the
	// estimate that decides a compaction before a call.
	seen promptSeen
	// cacheKey is the prompt cache key of calls to cacheKeyOf.
	cacheKey   string
	cacheKeyOf *Model
}

// attemptResult is the outcome of one attempt at a model call.
type attemptResult struct {
	// model and number are the model whose call the result is and its
	// attempt number in the step: the attempt's own, or those of the hedged
	// call that answered first.
	model  *Model
	number int
	msg    llm.Message
	stop   llm.StopReason
	usage  llm.Usage
	// estimated is what a call cut after it was sent, of which the
	// provider reported no usage, is charged instead: see [modelCalls.estimate].
	estimated llm.Usage
	// err is the classified failure, nil on success.
	err *llm.Error
	// streamed reports that output events reached the sink; firstSeq is
	// the first of them. partial is that output, when the call failed;
	// when the turn stopped, without the tool calls left incomplete.
	streamed bool
	firstSeq uint64
	partial  []llm.Part
	duration time.Duration
	ttfc     time.Duration
	// served is the model the provider said served the reply; responseID
	// the reply's id, as the provider said.
	served     string
	responseID string
}

// call is one model call in flight: what was sent, the observer's view of
// it, its watchdog and its outcome so far.
type call struct {
	m      *Model
	req    *llm.Request
	info   AttemptInfo
	actx   context.Context // the observer's context for the call
	cancel context.CancelCauseFunc
	wd     *watchdog
	start  time.Time
	// ticket is the call's claim on the model's retry budget: set for
	// retries and hedged calls.
	ticket *policy.Ticket
	// seam is whitespace the reply already ends with, which the call's
	// first text must not repeat (see [continuation]).
	seam string
	// lost is set when the call was cancelled because the other call of
	// its hedged pair answered first.
	lost bool
	// answeredAt is when the call's first output (or its end) came, from
	// its start; zero until then. Hedge delays are drawn from it.
	answeredAt time.Duration
	res        attemptResult
}

// attempt makes attempt number on m: one model call, its output streamed
// as events between LLMCallStarted and LLMCallFinished, its usage counted,
// and ticket (nil for a first attempt) settled by its outcome. A model
// with a hedge may race a second call against it (see [modelCalls.race]); the
// result is then the call that answered first. When the turn stops
// meanwhile, nothing follows the call's output.
func (mc *modelCalls) attempt(ctx context.Context, m *Model, number int, ticket *policy.Ticket) attemptResult {
	c := mc.open(ctx, m, number, ticket, AttemptInfo{})
	if m.Hedge != nil {
		if delay, ok := mc.hedgeDelay(m); ok {
			return mc.race(ctx, c, delay)
		}
	}
	actx, cancel := context.WithCancelCause(c.actx)
	c.cancel = cancel
	c.wd = newWatchdog(m.FirstTokenTimeout, m.IdleTimeout, cancel)
	mc.stream(ctx, c, m.Provider.Stream(actx, c.req), true)
	mc.close(ctx, c)
	return c.res
}

// open counts a call of m, builds its request and emits LLMCallStarted.
// info carries what the caller knows beyond the call itself (a hedge's
// origin).
func (mc *modelCalls) open(ctx context.Context, m *Model, number int, ticket *policy.Ticket, info AttemptInfo) *call {
	mc.t.counters.ModelCalls++
	req, seam := mc.request(m)
	info.TurnID, info.Model, info.Provider, info.ProviderModel = mc.t.info.TurnID, m.Alias, m.ProviderName, m.ID
	info.Deployment = m.Deployment
	info.Attempt, info.Call, info.Step, info.Request = number, mc.t.counters.ModelCalls, mc.t.steps, req
	info.Continues = len(mc.t.reply)+len(mc.t.cut) > 0
	mc.t.out.emit(ctx, &LLMCallStarted{
		Model: m.Alias, Provider: m.ProviderName, ProviderModel: m.ID, Deployment: m.Deployment,
		Attempt: number, Call: mc.t.counters.ModelCalls,
	})
	m.started()
	c := &call{m: m, req: req, info: info, ticket: ticket, seam: seam, start: time.Now()}
	c.res.model, c.res.number = m, number
	c.actx = mc.t.obs.AttemptStart(ctx, info)
	return c
}

// close ends a call: its usage is counted, its budget ticket settled, the
// observer told, and LLMCallFinished emitted unless the turn has stopped.
func (mc *modelCalls) close(ctx context.Context, c *call) {
	c.cancel(nil)
	c.wd.stop()
	c.m.ended()
	res := &c.res
	res.duration = time.Since(c.start)
	mc.estimate(c)
	res.usage.Cost = llm.CostOf(c.m.Price, res.usage)
	mc.t.usage = mc.t.usage.Add(res.usage)
	mc.recordLatency(c)
	mc.noteInput(c)
	end := AttemptEnd{
		Usage: res.usage, Stop: res.stop, ResponseModel: res.served, ResponseID: res.responseID, Err: res.err, Streamed: res.streamed, Lost: c.lost,
		Duration: res.duration, TimeToFirstChunk: res.ttfc, Estimated: res.estimated,
	}
	if res.err == nil {
		end.Message = res.msg
	}
	mc.t.obs.AttemptEnd(c.actx, c.info, end)

	switch {
	case c.lost, mc.t.stopped(ctx) != nil, res.err != nil && callersKind(res.err.Kind):
		// Says nothing of the model.
		c.ticket.Cancel()
	case c.ticket != nil:
		c.ticket.Settle(res.err == nil)
	case res.err != nil:
		mc.t.r.health.Failure(c.m.healthKey(), res.err.Kind)
	}
	if err := mc.t.stopped(ctx); err != nil {
		// Nothing more of the call is emitted once the turn stopped: only
		// what ends the turn (see [turn.fail]).
		mc.t.countAttempt(c.m, llm.AsError(err))
		return
	}
	fin := &LLMCallFinished{
		Model: c.m.Alias, Attempt: c.info.Attempt, Usage: res.usage, Stop: res.stop,
		Duration: res.duration, TimeToFirstChunk: res.ttfc, Estimated: res.estimated,
	}
	if e := res.err; e != nil {
		fin.Err = &TurnError{Kind: e.Kind, Message: e.Message, RetryAfter: e.RetryAfter, Model: c.m.Alias}
	}
	mc.t.out.emit(ctx, fin)
	if !res.usage.IsZero() {
		mc.t.out.emit(ctx, &UsageUpdated{Total: mc.t.usage})
	}
	mc.t.countAttempt(c.m, res.err)
}

// estimate sets what c is charged when its provider reported no usage of
// it although it read its prompt, or may have: the call completed (an
// OpenAI-compatible server that ignores include_usage), failed after its
// reply began (a chunk came), or was cut by a cancel, the caller's
// deadline or the watchdog (a first-token or idle timeout) while its
// request may have been sent. It is an estimate of the prompt's input
// tokens, made as for compaction (see [modelCalls.estimateTokens]) from the
// request as sent, and of the reply's output tokens (a quarter of the
// bytes of the reply, or, for a call cut short, of what it streamed
// before), priced at c's model's prices; the turn's running estimates
// (mc.t.estimated) add it. A call the provider
// refused before answering (an HTTP error, a connection refused) is not
// charged: its provider read nothing. The estimate is for whoever pays (a
// client key's limits and budgets), never added to the usage the turn
// reports.
func (mc *modelCalls) estimate(c *call) {
	res := &c.res
	if !res.usage.IsZero() {
		return
	}
	if res.err != nil {
		cut := res.ttfc > 0 || res.streamed || c.wd.fired() != ""
		switch res.err.Kind {
		case llm.KindCancelled, llm.KindDeadlineExceeded:
			cut = true
		}
		if !cut {
			return
		}
	}
	u := llm.Usage{InputTokens: int64(mc.seen.estimate(c.req.System, c.req.Messages, c.req.Tools))}
	if res.err == nil {
		u.OutputTokens = int64(ConversationSize([]llm.Message{res.msg}) / bytesPerToken)
	} else {
		// What the reply streamed before it was cut: the provider
		// generated it, and bills it.
		u.OutputTokens = int64(ConversationSize([]llm.Message{{Role: llm.RoleAssistant, Parts: res.partial}}) / bytesPerToken)
	}
	if u.InputTokens <= 0 && u.OutputTokens <= 0 {
		return
	}
	u.Cost = llm.CostOf(c.m.Price, u)
	res.estimated = u
	mc.t.estimated = mc.t.estimated.Add(u)
}

// request builds the provider request of a call to m: the conversation,
// then, while a reply cut short is being continued, what continues it on
// m's provider. It returns the whitespace the call's text must not repeat.
func (mc *modelCalls) request(m *Model) (*llm.Request, string) {
	caps := m.capabilities()
	req := &llm.Request{
		TurnID:          mc.t.info.TurnID,
		Model:           m.ID,
		System:          mc.t.req.System,
		Messages:        signaturesFor(caps.Signer, mediaFor(m, mc.t.conv)),
		Tools:           mc.t.tools.toolSpecs(m),
		MaxOutputTokens: m.MaxOutputTokens,
		StopSequences:   mc.t.req.StopSequences,
		OutputSchema:    mc.t.req.OutputSchema,
		Reasoning:       mc.reasoning(m),
		EndUser:         mc.t.req.Metadata[MetadataEndUser],
		Capabilities:    &caps,
	}
	req.Temperature, req.TopP = mc.sampling(m, caps)
	mc.cacheRequest(m, req)
	req.ToolChoice = mc.toolChoice(m, req.Tools)
	if mc.t.req.MaxOutputTokens > 0 {
		req.MaxOutputTokens = mc.t.req.MaxOutputTokens
	}
	if len(mc.t.correction) > 0 {
		req.Messages = append(req.Messages[:len(req.Messages):len(req.Messages)], mc.t.correction...)
	}
	var seam string
	if reply := mergeParts(mc.t.reply, mc.t.cut); len(reply) > 0 {
		var tail []llm.Message
		tail, seam = continuation(caps, reply)
		req.Messages = append(req.Messages[:len(req.Messages):len(req.Messages)], tail...)
	}
	return req, seam
}

// callersKind reports whether a failure of class k is the caller's doing
// (its cancellation or deadline), not the model's.
func callersKind(k llm.Kind) bool {
	return k == llm.KindCancelled || k == llm.KindDeadlineExceeded
}

// firstChunk records that c's first chunk arrived at ttfc into the call.
func (mc *modelCalls) firstChunk(c *call, ttfc time.Duration) {
	c.res.ttfc = max(ttfc, 1)
	c.ticket.Answered()
	mc.t.obs.AttemptFirstChunk(c.actx, c.info, c.res.ttfc)
}

// stream reads c's chunks from src and emits its output. With inline, src
// is the provider's own stream, read here: this loop times the first chunk
// and feeds the watchdog. The turn's own context, ctx, decides whether a
// failure is the caller's.
func (mc *modelCalls) stream(ctx context.Context, c *call, src iter.Seq2[llm.Chunk, error], inline bool) {
	res := &c.res
	b := assembler{seam: c.seam, signer: c.req.Capabilities.Signer, newID: mc.t.r.opts.newID, taken: mc.t.callIDTaken}
	stopped := false
	for ch, err := range src {
		if err != nil {
			res.err = mc.classify(ctx, c.m, err, b.streamed, c.wd)
			break
		}
		if inline {
			if res.ttfc == 0 {
				mc.firstChunk(c, time.Since(c.start))
			}
			if c.answeredAt == 0 && answers(ch) {
				c.answeredAt = max(time.Since(c.start), 1)
			}
			c.wd.chunk()
		}
		switch ch.Kind {
		case llm.ChunkUsage:
			res.usage = ch.Usage
			continue
		case llm.ChunkStop:
			res.stop, res.served, res.responseID, stopped = ch.Stop, ch.Model, ch.ResponseID, true
			continue
		}
		p := b.add(ch)
		if p == nil {
			continue
		}
		seq := mc.t.out.emit(ctx, p)
		if seq == 0 {
			break // the sink failed: the turn is ending
		}
		if !b.streamed {
			b.streamed, res.firstSeq = true, seq
			if mc.t.firstOutput == 0 {
				mc.t.firstOutput = max(time.Since(mc.t.info.Start), 1)
			}
		}
	}
	res.streamed = b.streamed
	if res.err == nil && !stopped {
		res.err = mc.classify(ctx, c.m, nil, b.streamed, c.wd)
	}
	switch {
	case res.err == nil:
		res.msg = b.message(res.stop)
	case mc.t.stopped(ctx) != nil:
		// What a stopped turn keeps of its reply (see [turn.closeCancelled]).
		res.partial = b.interrupted()
	case b.streamed:
		res.partial = b.message(llm.StopUnspecified).Parts
	}
}

// classify turns a failed or unfinished stream into a classified error.
// The turn's context is judged first: whatever the provider said, a
// stopped turn is stopped.
func (mc *modelCalls) classify(ctx context.Context, m *Model, err error, streamed bool, wd *watchdog) *llm.Error {
	var e *llm.Error
	switch {
	case mc.t.stopped(ctx) != nil:
		// A copy: the cause may be one error that stops many turns at
		// once (a server's shutdown), and the model is set on it below.
		c := *llm.AsError(mc.t.stopped(ctx))
		e = &c
	case wd.fired() != "":
		e = &llm.Error{Kind: llm.KindTimeout, Message: wd.fired(), Err: err}
	case err == nil && streamed:
		e = &llm.Error{Kind: llm.KindStreamInterrupted, Message: "the model's stream ended before the reply was complete"}
	case err == nil:
		e = &llm.Error{Kind: llm.KindServerError, Message: "the model's stream ended without a reply"}
	case errors.As(err, &e):
		c := *e
		c.Kind = policy.Classify(c.Kind, streamed)
		e = &c
	default:
		// An unclassified provider failure: never retried blindly.
		e = &llm.Error{Kind: llm.KindInternal, Message: "the provider failed in an unexpected way", Err: err}
	}
	if e.Provider == "" {
		e.Provider = m.ProviderName
	}
	e.Model = m.Alias
	return e
}

// watchdog cancels an attempt whose first chunk, or whose next chunk,
// is late. One timer serves the whole attempt: armed for the first chunk,
// then re-armed after each chunk for the idle gap. chunk and stop must be
// called from one goroutine at a time.
type watchdog struct {
	first, idle time.Duration
	cancel      context.CancelCauseFunc
	timer       *time.Timer
	gotFirst    atomic.Bool
	what        atomic.Pointer[string] // which limit passed
}

// errTimeout is the cause of an attempt cancelled by its own watchdog.
var errTimeout = errors.New("runtime: attempt timed out")

func newWatchdog(first, idle time.Duration, cancel context.CancelCauseFunc) *watchdog {
	w := &watchdog{first: first, idle: idle, cancel: cancel}
	if first > 0 {
		w.timer = time.AfterFunc(first, w.fire)
	}
	return w
}

func (w *watchdog) fire() {
	what := fmt.Sprintf("no output from the model within the first-token timeout (%s)", w.first)
	if w.gotFirst.Load() {
		what = fmt.Sprintf("the model's stream stalled longer than the idle timeout (%s)", w.idle)
	}
	w.what.Store(&what)
	w.cancel(errTimeout)
}

// chunk re-arms the watchdog after a chunk arrived.
func (w *watchdog) chunk() {
	w.gotFirst.Store(true)
	switch {
	case w.idle <= 0:
		if w.timer != nil {
			w.timer.Stop()
		}
	case w.timer == nil:
		w.timer = time.AfterFunc(w.idle, w.fire)
	default:
		w.timer.Reset(w.idle)
	}
}

// fired returns which limit passed, empty when none did.
func (w *watchdog) fired() string {
	if p := w.what.Load(); p != nil {
		return *p
	}
	return ""
}

func (w *watchdog) stop() {
	if w.timer != nil {
		w.timer.Stop()
	}
}
