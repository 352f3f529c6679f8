package policy

import (
	"slices"

	"github.com/turnstile-dev/turnstile/llm"
)

// Fallback says when a class of failure moves a turn down its chain.
type Fallback uint8

// The fallback behaviours of a [Rule].
const (
	// FallbackNever keeps the turn on its model: the failure is the
	// request's, and another model would fail the same way.
	FallbackNever Fallback = iota
	// FallbackAtOnce moves to the next model without retrying this one:
	// waiting does not help here, or another model can answer now.
	FallbackAtOnce
	// FallbackAfterRetries moves on once the model's retries are spent (or
	// the retry budget or the caller's deadline forbids them).
	FallbackAfterRetries
	// FallbackLarger moves only to a later model with a larger context
	// window.
	FallbackLarger
)

// String returns the behaviour as the class table of docs/retries.md
// writes it.
func (f Fallback) String() string {
	switch f {
	case FallbackAtOnce:
		return "at once"
	case FallbackAfterRetries:
		return "after retries"
	case FallbackLarger:
		return "to a larger model"
	}
	return "no"
}

// Rule is how the policy treats one class of failure. The table of rules,
// [Rules], is the single place where the classes differ; the class table
// of docs/retries.md is held to it by a test.
type Rule struct {
	// Transient reports that the same request may succeed later. A
	// transient failure spends the model's retry budget, and a turn that
	// ends with it tells the client retrying is safe (retryable true),
	// unless a tool with side effects was interrupted.
	Transient bool
	// Retry reports that the same model is called again, after the
	// provider's Retry-After or a jittered backoff, up to MaxRetries per
	// step.
	Retry bool
	// Fallback says when the failure moves the turn to the next model.
	Fallback Fallback
	// CoolsDown reports that a model the turn leaves over this failure is
	// skipped by new turns for the provider's Retry-After, else for
	// Retry.Cooldown. Any transient failure cools the model down when the
	// retry budget is spent.
	CoolsDown bool
	// Compacts reports that the conversation is shortened and the same
	// model called again, once per step, when no larger model can take it.
	Compacts bool
	// AfterOutput, when set, is the class the failure takes when the
	// attempt had already streamed output: a connection lost mid-reply is
	// an interrupted stream, whose output the client must discard.
	AfterOutput llm.Kind
	// Corrects, with Retry, replaces the backoff retries: the same model is
	// called again at once, shown what was wrong with its reply, up to
	// Retry.OutputRetries times per step, without spending the retry
	// budget. The failure is the reply's, not the model's health.
	Corrects bool
	// PerKey reports that the failure belongs to the credential or the
	// endpoint called, not to the model: another deployment of the same
	// model (another key, region or organisation) may well serve the
	// call, so the runtime moves the call there, at once, before any
	// retry on the same deployment or fallback to another model.
	PerKey bool
}

// ClientRetryable reports what the client is told when a turn ends with
// this class: true, re-sending the conversation plus the committed
// messages is safe and may succeed; false, a retry will not help.
func (r Rule) ClientRetryable() bool { return r.Transient }

// transient is the rule of a failure worth retrying on the same model,
// then on the next one.
var transient = Rule{Transient: true, Retry: true, Fallback: FallbackAfterRetries}

// rules is the decision table, indexed by class.
var rules = map[llm.Kind]Rule{
	// Another model can answer now; alone, the model is waited for.
	llm.KindRateLimited:       {Transient: true, Retry: true, Fallback: FallbackAtOnce, CoolsDown: true, PerKey: true},
	llm.KindQuotaExhausted:    {Fallback: FallbackAtOnce, CoolsDown: true, PerKey: true},
	llm.KindOverloaded:        {Transient: true, Retry: true, Fallback: FallbackAfterRetries, CoolsDown: true, PerKey: true},
	llm.KindServerError:       transient,
	llm.KindTimeout:           transient,
	llm.KindNetwork:           {Transient: true, Retry: true, Fallback: FallbackAfterRetries, AfterOutput: llm.KindStreamInterrupted},
	llm.KindStreamInterrupted: transient,
	llm.KindUnavailable:       transient,
	llm.KindContextOverflow:   {Fallback: FallbackLarger, Compacts: true},
	llm.KindInvalidRequest:    {},
	llm.KindAuth:              {Fallback: FallbackAtOnce, CoolsDown: true, PerKey: true},
	llm.KindNotFound:          {Fallback: FallbackAtOnce, CoolsDown: true},
	llm.KindContentFiltered:   {},
	llm.KindCancelled:         {},
	llm.KindDeadlineExceeded:  {},
	llm.KindToolsUnsafe:       {},
	llm.KindInternal:          {},
	// The reply did not match the output schema: the model is asked again,
	// shown the validation errors.
	llm.KindOutputInvalid: {Retry: true, Corrects: true},
	// The client key spent its budget: no model of the chain helps.
	llm.KindBudgetExhausted: {},
	// The turn store had no room left for the turn (its disk filled past
	// the reserve): no model helps; the client runs the turn again once
	// space returns, unless a tool with side effects was interrupted.
	llm.KindStoreFull: {Transient: true},
}

// RuleFor returns the rule of class k. A class without a rule is treated
// like KindInternal: failed at once, not retryable.
func RuleFor(k llm.Kind) Rule { return rules[k] }

// Kinds returns every class the table has a rule for, in the order of
// their values.
func Kinds() []llm.Kind {
	out := make([]llm.Kind, 0, len(rules))
	for k := range rules {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Classify returns the class a failure of kind k takes after an attempt
// that had (streamed) or had not streamed output, as the table's
// AfterOutput says.
func Classify(k llm.Kind, streamed bool) llm.Kind {
	if r := rules[k]; streamed && r.AfterOutput != 0 {
		return r.AfterOutput
	}
	return k
}

// Advice is what a turn that ends with a failure tells its client.
type Advice struct {
	// Kind is the class reported: the failure's own, or KindToolsUnsafe.
	Kind llm.Kind
	// Retryable reports that re-sending the conversation plus the turn's
	// committed messages is safe and may succeed.
	Retryable bool
}

// Advise returns what the client is told about a turn that ends with a
// failure of class k. unsafeTools reports that a tool with side effects
// was running when the turn failed: a blind replay could repeat its
// effect, so a transient failure becomes KindToolsUnsafe, not retryable.
func Advise(k llm.Kind, unsafeTools bool) Advice {
	r := rules[k]
	if r.Transient && unsafeTools {
		return Advice{Kind: llm.KindToolsUnsafe}
	}
	return Advice{Kind: k, Retryable: r.ClientRetryable()}
}
