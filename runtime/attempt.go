package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
)

// attemptResult is the outcome of one attempt at a model call.
type attemptResult struct {
	msg   llm.Message
	stop  llm.StopReason
	usage llm.Usage
	// err is the classified failure, nil on success.
	err *llm.Error
	// streamed reports that output events reached the sink; firstSeq is
	// the first of them.
	streamed bool
	firstSeq uint64
	duration time.Duration
	ttfc     time.Duration
	// model is the model the provider said served the reply.
	model string
}

// attempt makes attempt number on m: one model call, its output streamed
// as events between LLMCallStarted and LLMCallFinished, its usage counted.
// When the turn stops meanwhile, nothing follows the call's output.
func (t *turn) attempt(ctx context.Context, m *Model, number int) attemptResult {
	t.counters.ModelCalls++
	req := t.request(m)
	info := AttemptInfo{
		TurnID: t.info.TurnID, Model: m.Alias, Provider: m.ProviderName, ProviderModel: m.ID,
		Attempt: number, Call: t.counters.ModelCalls, Step: t.steps, Request: req,
	}
	t.out.emit(ctx, &LLMCallStarted{
		Model: m.Alias, Provider: m.ProviderName, ProviderModel: m.ID,
		Attempt: number, Call: t.counters.ModelCalls,
	})
	actx := t.obs.AttemptStart(ctx, info)
	res := t.call(actx, ctx, m, req, info)
	t.usage = t.usage.Add(res.usage)
	end := AttemptEnd{
		Usage: res.usage, Stop: res.stop, ResponseModel: res.model, Err: res.err, Streamed: res.streamed,
		Duration: res.duration, TimeToFirstChunk: res.ttfc,
	}
	if res.err == nil {
		end.Message = res.msg
	}
	t.obs.AttemptEnd(actx, info, end)

	if err := t.stopped(ctx); err != nil {
		// Nothing but the terminal event follows a cancellation.
		t.countAttempt(m.Alias, llm.AsError(err))
		return res
	}
	fin := &LLMCallFinished{
		Model: m.Alias, Attempt: number, Usage: res.usage, Stop: res.stop,
		Duration: res.duration, TimeToFirstChunk: res.ttfc,
	}
	if e := res.err; e != nil {
		fin.Err = &TurnError{Kind: e.Kind, Message: e.Message, RetryAfter: e.RetryAfter, Model: m.Alias}
	}
	t.out.emit(ctx, fin)
	if !res.usage.IsZero() {
		t.out.emit(ctx, &UsageUpdated{Total: t.usage})
	}
	t.countAttempt(m.Alias, res.err)
	return res
}

// request builds the provider request of a call to m.
func (t *turn) request(m *Model) *llm.Request {
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
	return req
}

// call streams one model call on actx (the observer's context for it),
// emitting its output. The turn's own context, ctx, decides whether a
// failure is the caller's.
func (t *turn) call(actx, ctx context.Context, m *Model, req *llm.Request, info AttemptInfo) (res attemptResult) {
	start := time.Now()
	defer func() { res.duration = time.Since(start) }()
	actx, cancel := context.WithCancelCause(actx)
	defer cancel(nil)
	wd := newWatchdog(m.FirstTokenTimeout, m.IdleTimeout, cancel)
	defer wd.stop()

	var b assembler
	stopped := false
	for c, err := range m.Provider.Stream(actx, req) {
		if err != nil {
			res.err = t.classify(ctx, m, err, b.streamed, wd)
			break
		}
		if res.ttfc == 0 {
			res.ttfc = max(time.Since(start), 1)
			t.obs.AttemptFirstChunk(actx, info, res.ttfc)
		}
		wd.chunk()
		switch c.Kind {
		case llm.ChunkUsage:
			res.usage = c.Usage
			continue
		case llm.ChunkStop:
			res.stop, res.model, stopped = c.Stop, c.Model, true
			continue
		}
		p := b.add(c, t.r.opts.newID)
		if p == nil {
			continue
		}
		seq := t.out.emit(ctx, p)
		if seq == 0 {
			break // the sink failed: the turn is ending
		}
		if !b.streamed {
			b.streamed, res.firstSeq = true, seq
			if t.firstOutput == 0 {
				t.firstOutput = max(time.Since(t.info.Start), 1)
			}
		}
	}
	res.streamed = b.streamed
	if res.err == nil && !stopped {
		res.err = t.classify(ctx, m, nil, b.streamed, wd)
	}
	if res.err == nil {
		res.msg = b.message(res.stop)
	}
	return res
}

// classify turns a failed or unfinished stream into a classified error.
// The turn's context is judged first: whatever the provider said, a
// stopped turn is stopped.
func (t *turn) classify(ctx context.Context, m *Model, err error, streamed bool, wd *watchdog) *llm.Error {
	var e *llm.Error
	switch {
	case t.stopped(ctx) != nil:
		e = llm.AsError(t.stopped(ctx))
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
// then re-armed after each chunk for the idle gap.
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
