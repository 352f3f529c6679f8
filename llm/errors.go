package llm

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Kind is the class of a failure. It says what happened; what to do about it
// is the [Policy]'s decision. Its String form is stable and is used as the
// wire error code and the google.rpc.ErrorInfo reason.
type Kind uint8

// The classes of failure.
const (
	// KindInternal is a bug or an unclassified failure. Not retryable.
	KindInternal Kind = iota
	// KindRateLimited is a temporary rate limit (HTTP 429); RetryAfter says
	// how long to wait when the provider said.
	KindRateLimited
	// KindQuotaExhausted is a spent quota, credit balance or spend limit:
	// waiting does not help.
	KindQuotaExhausted
	// KindOverloaded is a provider that sheds load (Anthropic 529, HTTP 503).
	KindOverloaded
	// KindServerError is a provider fault (HTTP 500, 502, 504).
	KindServerError
	// KindTimeout is a connect, time-to-first-token or idle-gap timeout.
	KindTimeout
	// KindNetwork is a connection refused, reset or cut short.
	KindNetwork
	// KindStreamInterrupted is a stream that failed or closed without a stop
	// after output had been streamed.
	KindStreamInterrupted
	// KindContextOverflow is a request larger than the model's context window.
	KindContextOverflow
	// KindInvalidRequest is a request the provider rejects as malformed or
	// against its policy.
	KindInvalidRequest
	// KindAuth is a missing, invalid or unauthorised credential.
	KindAuth
	// KindNotFound is an unknown model or endpoint.
	KindNotFound
	// KindContentFiltered is a request blocked by a content filter before
	// the model answered.
	KindContentFiltered
	// KindCancelled is a turn whose caller gave up.
	KindCancelled
	// KindDeadlineExceeded is a turn whose caller's deadline passed.
	KindDeadlineExceeded
	// KindUnavailable is a service that cannot take the turn now: it is
	// draining, or no model of the chain is available.
	KindUnavailable
	// KindToolsUnsafe is a failure after a tool with side effects ran, so the
	// step cannot be replayed blindly.
	KindToolsUnsafe
	// KindOutputInvalid is a final reply that does not match the request's
	// output schema ([Request.OutputSchema]).
	KindOutputInvalid
	// KindBudgetExhausted is a client key that spent its budget (cost per
	// day or month) while its turn ran: the turn ended after the call that
	// crossed it. Waiting until the budget's window resets helps.
	KindBudgetExhausted
	// KindStoreFull is a turn store without room for the turn: the disk
	// under the embedded store filled past its reserve while the turn ran,
	// and the turn was ended. Running it again once space returns helps.
	KindStoreFull
)

var kindNames = [...]string{
	KindInternal:          "INTERNAL",
	KindRateLimited:       "RATE_LIMITED",
	KindQuotaExhausted:    "QUOTA_EXHAUSTED",
	KindOverloaded:        "OVERLOADED",
	KindServerError:       "SERVER_ERROR",
	KindTimeout:           "TIMEOUT",
	KindNetwork:           "NETWORK",
	KindStreamInterrupted: "STREAM_INTERRUPTED",
	KindContextOverflow:   "CONTEXT_OVERFLOW",
	KindInvalidRequest:    "INVALID_REQUEST",
	KindAuth:              "AUTH",
	KindNotFound:          "NOT_FOUND",
	KindContentFiltered:   "CONTENT_FILTERED",
	KindCancelled:         "CANCELLED",
	KindDeadlineExceeded:  "DEADLINE_EXCEEDED",
	KindUnavailable:       "UNAVAILABLE",
	KindToolsUnsafe:       "TOOLS_UNSAFE",
	KindOutputInvalid:     "OUTPUT_INVALID",
	KindBudgetExhausted:   "BUDGET_EXHAUSTED",
	KindStoreFull:         "STORE_FULL",
}

// Kinds returns every class of failure, in the order of their values.
func Kinds() []Kind {
	out := make([]Kind, len(kindNames))
	for i := range out {
		out[i] = Kind(i)
	}
	return out
}

// String returns the kind's stable UPPER_SNAKE name, e.g. "RATE_LIMITED".
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("KIND_%d", k)
}

// Hint is a provider's advice on retrying, taken from the wire (for example
// x-should-retry). The [Policy] decides from the [Kind]; a hint can only
// make it more careful: HintNever forbids a retry on the same model.
type Hint uint8

// The retry hints.
const (
	// HintDefault means no advice beyond the kind.
	HintDefault Hint = iota
	// HintNever means the same request will fail again on this model.
	HintNever
	// HintImmediately means a retry may start without delay.
	HintImmediately
	// HintAfter means retry after Error.RetryAfter.
	HintAfter
	// HintBackoff means retry with exponential backoff.
	HintBackoff
)

// Error is a classified failure. Message is shown to people and clients;
// Err is for logs only and its text must never be sent to a client.
// Neither may contain a secret such as an API key or a request body.
type Error struct {
	// Kind is the class of the failure.
	Kind Kind
	// Message is a short explanation fit to show a person, for example the
	// provider's own error message.
	Message string
	// Provider names the provider that failed, when one did.
	Provider string
	// Model is the model alias the failure concerns; the runtime fills it in.
	Model string
	// StatusCode is the provider's HTTP status, zero when none.
	StatusCode int
	// RequestID is the provider's request id, for logs.
	RequestID string
	// RetryAfter is the provider's requested delay, zero when none.
	RetryAfter time.Duration
	// Hint is the provider's retry advice.
	Hint Hint
	// Err is the underlying error, for logs.
	Err error
}

// Error returns the kind and message, and the cause when there is one.
func (e *Error) Error() string {
	s := e.Kind.String()
	if e.Provider != "" {
		s = e.Provider + ": " + s
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.Err != nil && (e.Message == "" || e.Err.Error() != e.Message) {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an [*Error] of kind k whose Message is the formatted text.
// A %w verb in format wraps its operand as Err.
func Errorf(k Kind, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	return &Error{Kind: k, Message: err.Error(), Err: errors.Unwrap(err)}
}

// KindOf reports the class of err: the Kind of the first [*Error] in its
// chain, KindCancelled or KindDeadlineExceeded for context errors, and
// KindInternal for anything else.
func KindOf(err error) Kind {
	var e *Error
	switch {
	case err == nil:
		return KindInternal
	case errors.As(err, &e):
		return e.Kind
	case errors.Is(err, context.DeadlineExceeded):
		return KindDeadlineExceeded
	case errors.Is(err, context.Canceled):
		return KindCancelled
	}
	return KindInternal
}

// AsError returns err as an [*Error], classifying it with [KindOf] when it is
// not one already. The message of an unclassified error is generic, so no
// internal detail reaches a client.
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	k := KindOf(err)
	msg := "internal error"
	switch k {
	case KindCancelled:
		msg = "the turn was cancelled"
	case KindDeadlineExceeded:
		msg = "the turn's deadline passed"
	}
	return &Error{Kind: k, Message: msg, Err: err}
}
