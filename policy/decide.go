package policy

import (
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// Action is what the turn does after a failed attempt.
type Action uint8

// The actions a [Decision] may take.
const (
	// ActionFail ends the turn with the failure.
	ActionFail Action = iota
	// ActionRetry calls the same model again after Decision.Delay.
	ActionRetry
	// ActionFallback moves to the next model of the chain.
	ActionFallback
	// ActionCompact shortens the conversation and calls the same model again.
	ActionCompact
)

// String returns the action's lower-case name.
func (a Action) String() string {
	switch a {
	case ActionRetry:
		return "retry"
	case ActionFallback:
		return "fallback"
	case ActionCompact:
		return "compact"
	}
	return "fail"
}

// Attempt describes a failed model call and the state of its step: all
// [Policy.Decide] needs to decide what comes next.
type Attempt struct {
	// Kind, Hint and RetryAfter come from the failure; Kind is already
	// the class after [Classify].
	Kind       llm.Kind
	Hint       llm.Hint
	RetryAfter time.Duration
	// Number counts attempts on this model in this step, from 1.
	Number int
	// HasFallback reports that a later model of the chain is available.
	HasFallback bool
	// HasLargerFallback reports that a later available model has a larger
	// context window than this one.
	HasLargerFallback bool
	// Compacted reports that this step already compacted the conversation.
	Compacted bool
	// BudgetExhausted reports that the model's shared retry budget
	// ([Health.Reserve]) has no token left for a retry now.
	BudgetExhausted bool
	// Remaining is the time left before the turn's deadline; negative
	// means no deadline.
	Remaining time.Duration
	// OutOfCalls reports that the turn has made as many model calls as it
	// may (retries count): nothing but failing is left.
	OutOfCalls bool
	// Jitter is a uniform draw from [0, 1), taken by the caller.
	Jitter float64
	// Corrections counts the calls of this step already made again after
	// a failure of a rule that corrects (see [Rule.Corrects]).
	Corrections int
}

// Decision is the [Policy]'s verdict on an [Attempt].
type Decision struct {
	Action Action
	// Delay is the wait before a retry.
	Delay time.Duration
	// Cooldown, when positive, is how long new turns should skip the model.
	Cooldown time.Duration
	// RetryAfter is the delay to advise the client when the turn fails with
	// a retryable error.
	RetryAfter time.Duration
}

// Policy decides, from the class of a failure and the state of the step,
// whether to retry, fall back, compact or fail.
type Policy struct {
	Retry Retry
}

// Decide returns what to do after the failed attempt a. It reads the
// class's [Rule] and nothing else about the class:
//
//   - a rule that falls back at once does so when a fallback is available;
//     one that falls back to a larger model does so when one is;
//   - a rule that compacts does so once per step;
//   - a rule that retries waits the provider's Retry-After (up to
//     MaxRetryAfter; HintImmediately: no wait) or the jittered backoff, and
//     gives up when its retries are spent, the provider says never
//     (HintNever), the budget is spent, or the wait would outlast the
//     caller's deadline;
//   - giving up falls back when the rule allows it and a model is left,
//     and fails otherwise, cooling the model down when the rule says so or
//     the budget is spent on a transient failure.
//
// No decision but failing is taken when the turn has no model call left.
func (p Policy) Decide(a Attempt) Decision {
	rule := RuleFor(a.Kind)
	r := p.Retry
	// leave gives the model up for this step: fall back when the rule and
	// the chain allow it, else fail advising retryAfter. cool says the
	// reason is the model's (not the caller's deadline), so the rule's
	// cooldown applies.
	leave := func(retryAfter time.Duration, cool bool) Decision {
		d := Decision{Action: ActionFail, RetryAfter: retryAfter}
		if a.HasFallback && (rule.Fallback == FallbackAtOnce || rule.Fallback == FallbackAfterRetries) {
			d = Decision{Action: ActionFallback}
		}
		if cool && (rule.CoolsDown || (rule.Transient && a.BudgetExhausted)) {
			d.Cooldown = a.RetryAfter
			if d.Cooldown <= 0 {
				d.Cooldown = r.Cooldown
			}
		}
		return d
	}
	// calling lets d stand only when the turn may make another model call.
	calling := func(d Decision) Decision {
		if d.Action == ActionFail || !a.OutOfCalls {
			return d
		}
		return Decision{Action: ActionFail, RetryAfter: max(d.Delay, a.RetryAfter), Cooldown: d.Cooldown}
	}

	switch {
	case rule.Fallback == FallbackAtOnce && a.HasFallback:
		return calling(leave(0, true))
	case rule.Fallback == FallbackLarger && a.HasLargerFallback:
		return calling(Decision{Action: ActionFallback})
	case rule.Compacts && !a.Compacted:
		return calling(Decision{Action: ActionCompact})
	case rule.Retry && rule.Corrects:
		if a.Corrections >= r.OutputRetries {
			return leave(0, false)
		}
		return calling(Decision{Action: ActionRetry})
	case !rule.Retry:
		return leave(0, true)
	}

	// A failure worth retrying on the same model.
	var wait time.Duration
	switch {
	case a.Hint == llm.HintImmediately:
	case a.RetryAfter > 0:
		wait = a.RetryAfter
	default:
		wait = r.backoff(a.Number, a.Jitter)
	}
	switch {
	case a.Number > r.MaxRetries || a.Hint == llm.HintNever || a.BudgetExhausted:
		return calling(leave(max(a.RetryAfter, r.InitialBackoff), true))
	case a.RetryAfter > 0 && wait > r.MaxRetryAfter:
		// The provider asks for longer than the turn honours.
		return calling(leave(wait, true))
	case a.Remaining >= 0 && wait >= a.Remaining:
		// The wait would outlast the caller's deadline: the caller's
		// limit, not the model's fault.
		return calling(leave(wait, false))
	}
	return calling(Decision{Action: ActionRetry, Delay: wait})
}
