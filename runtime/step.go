package runtime

import (
	"cmp"
	"context"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
)

// step gets one assistant message, ready to commit, from the model chain:
// it makes attempts and acts on the policy's decision after each failed
// one — retry, fall back, compact, or fail. Text a cut stream had shown is
// kept and continued when the model says so (see [StreamCutContinue]); the
// message returned then holds it, followed by the rest of the reply.
func (t *turn) step(ctx context.Context) (llm.Message, llm.StopReason, error) {
	t.steps++
	number := 0 // attempts on the current model in this step
	// moves counts the attempts of this step that moved to another
	// deployment of the model: they take none of the model's retries.
	// tried holds the deployments a per-key failure moved away from.
	moves := 0
	var tried map[*Model]bool
	compacted := false
	// ticket is the retry budget's token for the retry about to be made.
	var ticket *policy.Ticket
	// keptFrom is the first event of the output this step kept from cut
	// streams (t.cut), 0 when none was kept.
	keptFrom := t.cutFrom
	t.cutFrom = 0
	t.correction, t.corrections = nil, 0
	defer func() {
		if t.interrupted == nil && t.stopped(ctx) != nil {
			t.interrupted = t.cut
		}
		t.cut = nil
		t.correction = nil
	}()
	for {
		if err := t.stopped(ctx); err != nil {
			ticket.Cancel()
			return llm.Message{}, 0, err
		}
		m := t.chain.current()
		if err := t.budget(ctx, m); err != nil {
			ticket.Cancel()
			return llm.Message{}, 0, err
		}
		if err := t.compactBefore(ctx, m); err != nil {
			ticket.Cancel()
			return llm.Message{}, 0, err
		}
		number++
		res := t.calls.attempt(ctx, m, number, ticket)
		ticket = nil
		if err := t.stopped(ctx); err != nil {
			out := res.partial
			if res.err == nil {
				out = res.msg.Parts // complete, but the turn stopped before committing it
			}
			t.interrupted = mergeParts(t.cut, out)
			return llm.Message{}, 0, err
		}
		if res.model != m {
			// The hedged call to the next model answered: the turn is on it.
			t.chain.moveTo(res.model)
			m = res.model
		}
		number = res.number
		var issues []string
		if res.err == nil {
			msg := llm.Message{Role: llm.RoleAssistant, Parts: mergeParts(t.cut, res.msg.Parts)}
			if res.err, issues = t.checkOutput(msg, res.stop); res.err == nil {
				t.chain.succeeded(m)
				t.servedBy = m.Alias
				t.stepFrom = keptFrom
				if t.stepFrom == 0 {
					t.stepFrom = res.firstSeq
				}
				return msg, res.stop, nil
			}
			// An invalid reply: its output is discarded, as a failed call's,
			// with the start of a reply it continued.
			res.partial = mergeParts(t.reply, msg.Parts)
			if t.replyFrom != 0 {
				keptFrom = t.replyFrom
			}
			t.reply, t.replyFrom = nil, 0
			if !res.streamed && keptFrom != 0 {
				res.streamed = true
			}
		}

		e := res.err
		var d policy.Decision
		// A failure of one key moves the call to another deployment of the
		// model, at once, before any fallback; other failures are the
		// policy's to decide.
		if tried == nil {
			tried = map[*Model]bool{}
		}
		tried[m] = true
		to, cooldown, moved := t.moveDeployment(m, e, tried)
		if to != nil {
			d, ticket = policy.Decision{Action: policy.ActionRetry, Cooldown: cooldown}, moved
			moves++
		} else {
			d, ticket = t.decide(ctx, m, number-moves, compacted, e)
		}
		info := DecisionInfo{
			TurnID: t.info.TurnID, Model: m.Alias, Deployment: m.Deployment, Attempt: number, Kind: e.Kind,
			Action: d.Action, Delay: d.Delay, Cooldown: d.Cooldown,
		}
		if to != nil {
			info.ToDeployment = to.Deployment
		}
		// What becomes of the output shown so far in this step: kept to be
		// continued, or dropped (from discardFrom on) to be asked for anew.
		moving := d.Action == policy.ActionRetry || d.Action == policy.ActionFallback
		var discardFrom uint64
		switch {
		case !res.streamed:
			// Nothing new was shown; what was kept stays kept.
		case moving && m.OnStreamCut == StreamCutContinue && continuable(res.partial) && e.Kind != llm.KindOutputInvalid:
			t.cut = mergeParts(t.cut, res.partial)
			if keptFrom == 0 {
				keptFrom = res.firstSeq
			}
		default:
			discardFrom = res.firstSeq
			if keptFrom != 0 {
				discardFrom = keptFrom
			}
			t.cut, keptFrom = nil, 0
		}
		switch d.Action {
		case policy.ActionRetry:
			t.obs.Decision(ctx, info)
			t.counters.Retries++
			maxAttempts := m.Retry.MaxRetries + 1
			if e.Kind == llm.KindOutputInvalid {
				t.correct(llm.Message{Parts: res.partial}, issues)
				maxAttempts = number + m.Retry.OutputRetries - t.corrections + 1
			}
			maxAttempts += moves
			ev := &Retry{
				Attempt: number + 1, MaxAttempts: maxAttempts, Model: m.Alias,
				Delay: d.Delay, Kind: e.Kind, Message: e.Message,
				DiscardPartial: discardFrom != 0, DiscardFromSeq: discardFrom,
			}
			if to != nil {
				ev.ToDeployment = to.Deployment
			}
			t.out.emit(ctx, ev)
			if err := t.wait(ctx, d.Delay); err != nil {
				ticket.Cancel()
				return llm.Message{}, 0, err
			}
		case policy.ActionFallback:
			next := t.chain.advance()
			if next == nil {
				info.Action = policy.ActionFail
				t.obs.Decision(ctx, info)
				return llm.Message{}, 0, t.toTurnError(e, d.RetryAfter)
			}
			info.To = next.Alias
			t.obs.Decision(ctx, info)
			t.counters.Fallbacks++
			t.out.emit(ctx, &Fallback{
				From: m.Alias, To: next.Alias, Kind: e.Kind, Message: e.Message,
				DiscardPartial: discardFrom != 0, DiscardFromSeq: discardFrom,
			})
			number, compacted = 0, false
		case policy.ActionCompact:
			t.obs.Decision(ctx, info)
			if discardFrom != 0 {
				// Tell consumers to drop the failed attempt's output.
				t.out.emit(ctx, &Retry{
					Attempt: number + 1, MaxAttempts: m.Retry.MaxRetries + 1, Model: m.Alias,
					Kind: e.Kind, Message: e.Message, DiscardPartial: true, DiscardFromSeq: discardFrom,
				})
			}
			ok, err := t.compact(ctx, m, number)
			if err != nil {
				return llm.Message{}, 0, err
			}
			if !ok {
				return llm.Message{}, 0, t.toTurnError(e, 0)
			}
			compacted = true
		default:
			t.obs.Decision(ctx, info)
			return llm.Message{}, 0, t.toTurnError(e, d.RetryAfter)
		}
	}
}

// decide asks the policy what to do after the failed attempt number on m,
// and applies what the decision means for the model's shared state: a
// retry takes a token of its retry budget (returned as a ticket the retry
// settles), or, with none left, the policy decides without retrying; and
// the cooldown it sets.
func (t *turn) decide(ctx context.Context, m *Model, number int, compacted bool, e *llm.Error) (policy.Decision, *policy.Ticket) {
	r := t.r
	remaining := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		remaining = dl.Sub(r.opts.now())
	}
	next := t.chain.next()
	p := policy.Policy{Retry: m.Retry}
	a := policy.Attempt{
		Kind: e.Kind, Hint: e.Hint, RetryAfter: e.RetryAfter,
		Number:            number,
		HasFallback:       next >= 0,
		HasLargerFallback: t.chain.largerAfter(next),
		Compacted:         compacted,
		Remaining:         remaining,
		OutOfCalls:        t.counters.ModelCalls >= t.maxCalls,
		Jitter:            r.opts.jitter(),
		Corrections:       t.corrections,
	}
	d := p.Decide(a)
	var ticket *policy.Ticket
	if d.Action == policy.ActionRetry && policy.RuleFor(e.Kind).Transient {
		var ok bool
		if ticket, ok = r.health.Reserve(m.healthKey()); !ok {
			a.BudgetExhausted = true
			d = p.Decide(a)
		}
	}
	t.chain.decided(m, e.Kind, d.Cooldown)
	r.opts.logger.Debug("model call failed", "turn_id", t.info.TurnID, "model", m.Alias, "deployment", m.Deployment, "attempt", number,
		"kind", e.Kind.String(), "action", d.Action.String(), "delay", d.Delay, "request_id", e.RequestID, "cause", e.Err)
	return d, ticket
}

// moveDeployment moves a call of m that failed with e to another
// deployment of the same model, when e's class belongs to one key (see
// [policy.Rule].PerKey), the turn has a model call left, and the model has
// a deployment not in tried that is not cooling down and whose retry
// budget has a token. m cools down as the class's rule says (the
// provider's Retry-After, else the model's retry.cooldown), as a model a
// turn leaves does. It returns the deployment the turn is now on, m's
// cooldown, and the move's ticket; nil when the call stays on m, which
// then changes nothing.
func (t *turn) moveDeployment(m *Model, e *llm.Error, tried map[*Model]bool) (*Model, time.Duration, *policy.Ticket) {
	rule := policy.RuleFor(e.Kind)
	if !rule.PerKey || t.counters.ModelCalls >= t.maxCalls {
		return nil, 0, nil
	}
	to, admitted := t.chain.another(func(d *Model) bool { return tried[d] })
	if to == nil {
		return nil, 0, nil
	}
	moved, ok := t.r.health.Reserve(to.healthKey())
	if !ok {
		// The target has no retry left: the call stays on m.
		t.chain.giveBack(to, admitted)
		return nil, 0, nil
	}
	var cooldown time.Duration
	if rule.CoolsDown {
		cooldown = cmp.Or(max(e.RetryAfter, 0), m.Retry.Cooldown)
	}
	t.chain.decided(m, e.Kind, cooldown)
	t.chain.moveWithin(to, admitted)
	t.r.opts.logger.Debug("model call failed", "turn_id", t.info.TurnID, "model", m.Alias, "deployment", m.Deployment,
		"kind", e.Kind.String(), "action", "retry", "to_deployment", to.Deployment, "request_id", e.RequestID, "cause", e.Err)
	return to, cooldown, moved
}

// wait waits d before a retry, or until ctx is done.
func (t *turn) wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return t.stopped(ctx)
	}
	start := time.Now()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
	t.waited += time.Since(start)
	return t.stopped(ctx)
}

// compact shortens the conversation after attempt number on m overflowed,
// with the runner's compactor, and emits a Compaction event. It reports
// false when nothing could be removed.
func (t *turn) compact(ctx context.Context, m *Model, number int) (bool, error) {
	return t.compactWith(ctx, t.r.opts.compactor, m, 0, number)
}

// budget returns why the turn may not make its next model call, to m
// (its client key spent its budget, or what is left of it does not cover
// the call's bound), nil while it may.
func (t *turn) budget(ctx context.Context, m *Model) error {
	if t.req.Budget == nil {
		return nil
	}
	if err := t.req.Budget(ctx, t.bound(m)); err != nil {
		if stop := t.stopped(ctx); stop != nil {
			return stop // stopped while it waited
		}
		return err
	}
	return nil
}
