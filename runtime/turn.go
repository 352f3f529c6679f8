package runtime

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
)

// turn is the state of one running turn, and its loop: steps, the
// policy's decisions, the outcome, what a cancel commits and what a
// resumed turn finishes first. Its pieces are types of their own, each
// holding what it alone touches: the model calls (calls, a [modelCalls]:
// attempt.go, hedge.go, and what a request is made of), the server-side
// tool calls (tools, a [toolCalls]: tools.go and their approval), the
// model chain (chain, chain.go) and the events (out, emit.go). Its own
// methods are in turn.go (the loop and the outcome), step.go (one
// assistant message: attempts and the policy's decisions), resume.go,
// interrupt.go, output.go, precompact.go and control.go's steering.
type turn struct {
	r     *Runner
	req   *TurnRequest
	info  TurnInfo
	obs   Observer
	out   emitter
	chain chain
	// parent is the caller's context: its end is told apart from a sink
	// failure, which cancels only the turn's own context.
	parent   context.Context
	maxCalls int

	conv  []llm.Message // the conversation as the model sees it
	added []llm.Message // the messages the turn committed
	// callIDs holds the ids of the tool calls of conv and of the messages
	// the turn committed, made on first use (see [turn.callIDTaken]).
	callIDs map[string]bool
	// reply holds the parts of a reply cut by the output token limit,
	// being continued: committed, merged with the rest, once it ends. cut
	// holds the text the current step kept from cut streams. While either
	// is set, each call continues them (see [continuation]).
	reply []llm.Part
	cut   []llm.Part
	// interrupted holds the reply the turn was writing when it stopped:
	// what a cancel commits of it (see [turn.closeCancelled]).
	interrupted []llm.Part
	// cutFrom is the first event of cut when a resumed turn kept it from
	// the previous runner's interrupted call; the first step takes it.
	cutFrom uint64
	usage   llm.Usage
	// estimated is what the turn's calls cut with no usage reported are
	// charged besides usage (see [modelCalls.estimate]).
	estimated llm.Usage
	counters  Counters
	attempts  []ModelAttempts
	steps     int
	// servedBy is the alias whose reply was last committed.
	servedBy string
	// ctl is how the turn's owner reaches it (approvals, steering);
	// firstSeq is the seq of the first event this runner emits, and
	// requested the calls whose approval a previous runner requested.
	ctl       *Controls
	firstSeq  uint64
	requested map[string]bool
	// firstOutput is when the turn's first output event was emitted,
	// measured from its start; waited sums its backoff waits.
	firstOutput time.Duration
	waited      time.Duration
	// outputCheck validates a final reply against the request's output
	// schema, compiled at the first reply it checks. correction is what
	// the step's next call is shown after an invalid reply (see
	// [turn.correct]); corrections counts them in the step.
	outputCheck func(string) []string
	correction  []llm.Message
	corrections int
	// stepFrom is the first output event of the reply the last step
	// returned (0: none streamed); replyFrom that of the reply being
	// continued (t.reply), which an invalid continuation discards too.
	stepFrom  uint64
	replyFrom uint64

	// calls makes the turn's model calls; tools runs its server-side
	// tool calls.
	calls modelCalls
	tools toolCalls
}

// newTurn prepares a turn of req and returns it with the turn's context,
// which the sink's failure or the caller's cancellation ends, and its
// cancel function.
func newTurn(ctx context.Context, r *Runner, req *TurnRequest, sink Sink) (*turn, context.Context, context.CancelCauseFunc) {
	id := req.TurnID
	if id == "" {
		id = r.opts.newID()
	}
	alias := req.Model
	if alias == "" {
		alias = r.defaultModel
	}
	stopTimer := func() {}
	if d := r.opts.limits.MaxDuration; d > 0 {
		// The turn's own parent: its end is reported like the caller's.
		var cancelTimer context.CancelFunc
		ctx, cancelTimer = context.WithTimeoutCause(ctx, d, &llm.Error{
			Kind: llm.KindDeadlineExceeded, Message: fmt.Sprintf("the turn reached its time limit (%s)", d),
		})
		stopTimer = cancelTimer
	}
	tctx, cancelTurn := context.WithCancelCause(ctx)
	cancel := func(cause error) {
		cancelTurn(cause)
		stopTimer()
	}
	t := &turn{
		r:        r,
		req:      req,
		info:     TurnInfo{TurnID: id, Model: alias, Request: req, Start: time.Now()},
		obs:      r.opts.observer,
		out:      emitter{sink: sink, turnID: id, now: r.opts.now, cancel: cancel},
		chain:    newChain(r, alias, req),
		parent:   ctx,
		maxCalls: r.opts.limits.MaxModelCalls,
		conv:     slices.Clone(req.Messages),
	}
	t.calls.t, t.tools.t = t, t
	if req.MaxModelCalls > 0 {
		t.maxCalls = req.MaxModelCalls
	}
	t.out.listen()
	t.ctl = req.Controls
	if t.ctl == nil {
		t.ctl = NewControls()
	}
	t.firstSeq = 1
	if rs := req.Resume; rs != nil {
		t.conv = rs.conversation(t.conv)
		t.added = slices.Clone(rs.Committed)
		t.usage, t.counters = rs.Usage, rs.Counters
		t.out.seq = max(rs.NextSeq, 1) - 1
		t.tools.resumed = rs
		if len(rs.ToolResults) > 0 {
			// A cancel before the tools run keeps the stored results.
			t.tools.answered = maps.Clone(rs.ToolResults)
		}
		t.firstSeq, t.requested = max(rs.NextSeq, 1), rs.Requested
	}
	t.ctl.attach(tctx, &t.out, r.opts.limits, req.Resume)
	return t, tctx, cancel
}

// run runs the turn to its end: steps until the model is done, with the
// tools its replies call in between. A resumed turn first finishes what
// its previous runner left: the step or the tools it was in.
func (t *turn) run(ctx context.Context) (*TurnCompleted, error) {
	if rs := t.req.Resume; rs != nil {
		t.chain.resumeAt(rs.Model)
		if res, done, err := t.resume(ctx, rs); done {
			return res, err
		}
	} else {
		t.out.emit(ctx, &TurnStarted{Model: t.info.Model})
		t.chain.start()
	}
	continuations := 0
	for {
		if err := t.stopped(ctx); err != nil {
			return nil, t.fail(ctx, err)
		}
		if t.counters.ModelCalls >= t.maxCalls {
			t.commitReply(ctx)
			// The messages a person sent are the conversation's, even
			// when no model call is left to answer them.
			t.commitSteering(ctx, t.ctl.drain())
			return t.complete(ctx, EndMaxModelCalls)
		}
		if len(t.reply) == 0 {
			// A step boundary: the steering messages come in here.
			t.injectSteering(ctx)
		}
		msg, stop, err := t.step(ctx)
		if err != nil {
			if t.stopped(ctx) == nil {
				t.commitReply(ctx)
			}
			return nil, t.fail(ctx, err)
		}
		msg.Parts = mergeParts(t.reply, msg.Parts)
		t.reply = nil
		replyFrom := t.replyFrom
		t.replyFrom = 0
		calls := msg.ToolCalls()
		if stop == llm.StopMaxTokens && len(calls) == 0 && continuations < t.r.opts.limits.MaxContinuations {
			// Cut by the output limit: the next call continues the reply,
			// which is committed once it ends.
			continuations++
			t.replyFrom = replyFrom
			if t.replyFrom == 0 {
				t.replyFrom = t.stepFrom
			}
			t.reply = msg.Parts
			continue
		}
		t.commit(ctx, msg)
		if res, done, err := t.afterReply(ctx, msg, stop); done {
			return res, err
		}
	}
}

// afterReply acts on a committed assistant reply: it runs the reply's
// tool calls or ends the turn. done reports that the turn ended, with res
// or err. (A reply cut by the output limit is continued before it is
// committed; one committed cut ends the turn.)
func (t *turn) afterReply(ctx context.Context, msg llm.Message, stop llm.StopReason) (res *TurnCompleted, done bool, err error) {
	if calls := msg.ToolCalls(); len(calls) > 0 {
		all, ended, err := t.tools.runTools(ctx, calls)
		if err != nil {
			return nil, true, t.fail(ctx, err)
		}
		if !all {
			res, err := t.complete(ctx, EndToolCallsRequired)
			return res, true, err
		}
		if ended && t.ctl.finish() {
			res, err := t.complete(ctx, EndToolEndedTurn)
			return res, true, err
		}
		return nil, false, nil
	}
	end := EndReason(0)
	switch stop {
	case llm.StopMaxTokens:
		end = EndMaxTokens
	case llm.StopPauseTurn:
		// The provider paused a long turn: sending the conversation
		// again continues it.
	case llm.StopRefusal:
		end = EndRefusal
	case llm.StopSequence:
		end = EndStopSequence
	default:
		end = EndTurn
	}
	if end == 0 || !t.ctl.finish() {
		// Paused, or a steering message came: one more model call
		// answers it.
		return nil, false, nil
	}
	res, err = t.complete(ctx, end)
	return res, true, err
}

// commitReply commits the reply cut by the output limit that the turn was
// continuing, as far as it got, when the turn ends before it is complete,
// so a client resuming the turn keeps it.
func (t *turn) commitReply(ctx context.Context) {
	if len(t.reply) > 0 {
		t.commit(ctx, llm.Message{Role: llm.RoleAssistant, Parts: t.reply})
		t.reply = nil
	}
}

// stopped returns why the turn must stop now, nil while it may go on: the
// caller's cancellation or deadline, a shutdown's cause, or the failure of
// the sink.
func (t *turn) stopped(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	if t.parent.Err() != nil {
		return context.Cause(t.parent)
	}
	if err := t.out.sinkErr(); err != nil {
		return &llm.Error{Kind: llm.KindInternal, Message: "the event stream failed", Err: err}
	}
	return context.Cause(ctx)
}

// commit adds m to the conversation and to the turn's result.
func (t *turn) commit(ctx context.Context, m llm.Message) {
	t.conv = append(t.conv, m)
	t.added = append(t.added, m)
	if t.callIDs != nil {
		for _, c := range m.ToolCalls() {
			t.callIDs[c.ID] = true
		}
	}
	t.out.emit(ctx, &MessageCompleted{Message: m})
}

// callIDTaken reports whether the conversation holds a tool call of id:
// a call the model makes gets another ([assembler.add]), as clients
// refuse a conversation whose ids repeat. Compaction may drop calls from
// conv; their ids stay taken.
func (t *turn) callIDTaken(id string) bool {
	if t.callIDs == nil {
		t.callIDs = map[string]bool{}
		for _, m := range t.conv {
			for _, c := range m.ToolCalls() {
				t.callIDs[c.ID] = true
			}
		}
	}
	return t.callIDs[id]
}

// complete ends the turn with its outcome; when the outcome cannot be
// emitted (the turn stopped, or its sink failed), the turn fails instead.
func (t *turn) complete(ctx context.Context, reason EndReason) (*TurnCompleted, error) {
	t.ctl.end()
	tc := &TurnCompleted{Reason: reason, Messages: t.added, Usage: t.usage, Counters: t.counters}
	if t.out.emit(ctx, tc) == 0 {
		err := t.stopped(ctx)
		if err == nil {
			err = &llm.Error{Kind: llm.KindInternal, Message: "internal error: the turn's outcome was not emitted"}
		}
		return nil, t.fail(ctx, err)
	}
	return tc, nil
}

// fail emits the terminal error for err, unless the sink has failed, and
// returns it. A turn its caller cancelled first commits what closes its
// conversation (see [turn.closeCancelled]).
func (t *turn) fail(ctx context.Context, err error) *TurnError {
	t.ctl.end()
	var te *TurnError
	if !errors.As(err, &te) {
		te = t.toTurnError(llm.AsError(err), 0)
	}
	te.Usage, te.Estimated = t.usage, t.estimated
	if t.cancelled() {
		t.closeCancelled(ctx)
	}
	t.out.emit(context.WithoutCancel(ctx), te)
	return te
}

// toTurnError builds the terminal error for e, with the advice the policy
// gives the client, and retryAfter as the least delay it advises.
func (t *turn) toTurnError(e *llm.Error, retryAfter time.Duration) *TurnError {
	advice := policy.Advise(e.Kind, t.tools.unsafe())
	te := &TurnError{Kind: advice.Kind, Message: e.Message, Model: e.Model, Attempts: slices.Clone(t.attempts), Retryable: &advice.Retryable}
	if te.Message == "" {
		te.Message = e.Kind.String()
	}
	if advice.Kind != e.Kind {
		te.Message += "; a tool with side effects was interrupted, check its effects before retrying"
	}
	if advice.Retryable {
		te.RetryAfter = max(retryAfter, e.RetryAfter)
	}
	if e.Err != nil {
		te.Cause = e
	}
	return te
}

// countAttempt records an attempt on alias; err is nil when it succeeded.
func (t *turn) countAttempt(m *Model, err *llm.Error) {
	n := len(t.attempts)
	if n == 0 || t.attempts[n-1].Model != m.Alias {
		t.attempts = append(t.attempts, ModelAttempts{Model: m.Alias})
		n++
	}
	a := &t.attempts[n-1]
	a.Attempts++
	if m.routed() {
		a.Deployments = append(a.Deployments, m.Deployment)
	}
	a.Succeeded = err == nil
	if err != nil {
		a.LastKind = err.Kind
	}
}

// end tells the observer how the turn ended and releases what the turn
// held.
func (t *turn) end(ctx context.Context, res *TurnCompleted, err error) {
	t.chain.close()
	t.ctl.end()
	end := TurnEnd{
		Completed: res, Usage: t.usage, Counters: t.counters, Attempts: t.attempts,
		ServedBy: t.servedBy, TimeToFirstOutput: t.firstOutput, Waited: t.waited,
		Duration: time.Since(t.info.Start),
	}
	errors.As(err, &end.Err)
	t.obs.TurnEnd(ctx, t.info, end)
}
