package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// defaultRetryAfter is the Retry-After of fail=rate_limit without retry_after.
const defaultRetryAfter = time.Second

// Failure classes that are not a plain HTTP error.
const (
	classDisconnect = "disconnect"
	classTimeout    = "timeout"
)

// failClass describes how a real adapter reports one kind of failure.
type failClass struct {
	kind   llm.Kind
	status int
	// message returns the provider's message for a call of model whose
	// request text measures size bytes.
	message func(model string, size int, d *directive) string
}

func fixed(s string) func(string, int, *directive) string {
	return func(string, int, *directive) string { return s }
}

// failClasses maps each fail= value to its classification. Status codes and
// messages follow what OpenAI, Anthropic and Gemini send for the same fault
// (see reference/provider-errors.md).
var failClasses = map[string]failClass{
	"rate_limit": {llm.KindRateLimited, 429, func(_ string, _ int, d *directive) string {
		return fmt.Sprintf("Rate limit reached for requests. Please try again in %s.", d.retryAfterOr(defaultRetryAfter))
	}},
	"quota": {llm.KindQuotaExhausted, 429,
		fixed("You exceeded your current quota, please check your plan and billing details.")},
	"overloaded":   {llm.KindOverloaded, 529, fixed("Overloaded")},
	"unavailable":  {llm.KindOverloaded, 503, fixed("The model is overloaded. Please try again later.")},
	"server_error": {llm.KindServerError, 500, fixed("The server had an error while processing your request. Sorry about that!")},
	"bad_gateway":  {llm.KindServerError, 502, fixed("502 Bad Gateway")},
	"gateway_timeout": {llm.KindServerError, 504,
		fixed("504 Gateway Timeout")},
	"auth":      {llm.KindAuth, 401, fixed("invalid x-api-key")},
	"forbidden": {llm.KindAuth, 403, fixed("Your API key does not have permission to use the specified resource.")},
	"not_found": {llm.KindNotFound, 404, func(model string, _ int, _ *directive) string {
		return fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", model)
	}},
	"invalid": {llm.KindInvalidRequest, 400, fixed("The request is invalid.")},
	"context_overflow": {llm.KindContextOverflow, 400, func(_ string, size int, d *directive) string {
		tokens := tokensOf(size)
		limit := tokens - 1
		if d.above > 0 {
			limit = tokensOf(d.above)
		}
		return fmt.Sprintf("prompt is too long: %d tokens > %d maximum", tokens, limit)
	}},
	"content_filter": {llm.KindContentFiltered, 400,
		fixed("The response was filtered due to the prompt triggering content management policy. Please modify your prompt and retry.")},
	// disconnect's kind depends on whether output was streamed; see [failure.error].
	classDisconnect: {llm.KindNetwork, 0, nil},
	// timeout yields no error: the stream hangs until its context is done.
	classTimeout: {llm.KindTimeout, 0, nil},
}

// classAliases are accepted spellings of a class.
var classAliases = map[string]string{
	"stall":    classTimeout,
	"overload": "overloaded",
	"rate":     "rate_limit",
}

func lookupClass(name string) (string, bool) {
	if a, ok := classAliases[name]; ok {
		name = a
	}
	_, ok := failClasses[name]
	return name, ok
}

func classNames() []string {
	names := make([]string, 0, len(failClasses))
	for n := range failClasses {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func (d *directive) retryAfterOr(def time.Duration) time.Duration {
	if d.hasRetryAfter {
		return d.retryAfter
	}
	return def
}

// failureError returns the error a call fails with under d after streamed
// paced chunks, or nil for a stall. name is the provider name, model the
// request's model id and size the request's text size in bytes.
func failureError(d *directive, name, model string, size, streamed int, requestID string) *llm.Error {
	c := failClasses[d.class]
	e := &llm.Error{
		Kind:       c.kind,
		Provider:   name,
		StatusCode: c.status,
		RequestID:  requestID,
		Err:        fmt.Errorf("sim: failure injected by directive %s", d.raw),
	}
	switch d.class {
	case classTimeout:
		return nil
	case classDisconnect:
		if streamed > 0 {
			e.Kind = llm.KindStreamInterrupted
			e.Message = "the stream was cut short: unexpected EOF"
		} else {
			e.Message = "read: connection reset by peer"
		}
	default:
		e.Message = c.message(model, size, d)
	}
	if d.message != "" {
		e.Message = d.message
	}
	if d.class == "rate_limit" || d.hasRetryAfter {
		e.RetryAfter = d.retryAfterOr(defaultRetryAfter)
		e.Hint = llm.HintAfter
	}
	return e
}

// invalidRequest is the error a call fails with when the request itself is
// malformed, as a provider's 400 invalid_request_error.
func invalidRequest(name string, err error) *llm.Error {
	return &llm.Error{
		Kind:       llm.KindInvalidRequest,
		Message:    err.Error(),
		Provider:   name,
		StatusCode: 400,
		Err:        err,
	}
}
