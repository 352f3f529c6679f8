package httpfail

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// MalformedEvent is the message of a failure to decode a stream event the
// provider sent: a broken upstream, worth a retry.
const MalformedEvent = "the provider sent a malformed stream event"

// Untyped classifies a failure that carries no error from the provider: a
// transport failure ([Network]) as KindNetwork or KindTimeout, a stream
// event the SDK could not decode (a JSON syntax or type error) as
// KindServerError, and anything else as KindInternal, which is not retried.
// code and requestID are the HTTP response's, zero when none arrived. Call
// it only after checking that the caller's own context is not done.
func Untyped(provider string, code int, requestID string, err error) *llm.Error {
	e := &llm.Error{Provider: provider, StatusCode: code, RequestID: requestID, Err: err}
	if k, ok := Network(err); ok {
		e.Kind, e.Message = k, NetworkMessage(k, err)
		return e
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	if errors.As(err, &syn) || errors.As(err, &typ) {
		e.Kind, e.Message = llm.KindServerError, MalformedEvent
		return e
	}
	e.Kind, e.Message = llm.KindInternal, "unexpected failure calling the provider"
	return e
}

// Waits reports whether a reported failure of kind k with HTTP status
// code is one whose wait the response's headers may give: a rate limit, an
// overload, any 429 and any 5xx.
func Waits(k llm.Kind, code int) bool {
	return k == llm.KindRateLimited || k == llm.KindOverloaded || code == http.StatusTooManyRequests || code >= 500
}

// Reported is a failure the provider reported in an error body or an
// error event, as an adapter read it from the provider's typed fields.
type Reported struct {
	// Kind is the failure's class.
	Kind llm.Kind
	// Message is the provider's message, empty when it sent none. It may
	// quote the API key or a header: [Reported.Error] redacts them.
	Message string
	// StatusCode is the HTTP status, 200 for an error event mid-stream.
	StatusCode int
	// RequestID is the provider's request id; empty means the one in
	// Header ([RequestID]).
	RequestID string
	// RetryAfter is the wait the provider asked for, zero when none.
	RetryAfter time.Duration
	// Header holds the response's headers, nil when there were none.
	Header http.Header
}

// Error returns r as provider's [llm.Error] wrapping err. The message has
// secrets redacted; when the provider sent none it is the status's
// ([StatusMessage]), or for an error event mid-stream a generic one. The
// hint comes from the headers and RetryAfter ([Hint]).
func (r Reported) Error(provider string, secrets []string, err error) *llm.Error {
	msg := Redact(r.Message, secrets...)
	if msg == "" {
		if r.StatusCode >= 400 {
			msg = StatusMessage(r.StatusCode)
		} else {
			msg = "the provider reported an error while streaming"
		}
	}
	id := r.RequestID
	if id == "" {
		id = RequestID(r.Header)
	}
	return &llm.Error{
		Kind:       r.Kind,
		Message:    msg,
		Provider:   provider,
		StatusCode: r.StatusCode,
		RequestID:  id,
		RetryAfter: r.RetryAfter,
		Hint:       Hint(r.Header, r.RetryAfter),
		Err:        err,
	}
}

// Response returns resp's status and headers, zero when resp is nil (no
// response arrived).
func Response(resp *http.Response) (int, http.Header) {
	if resp == nil {
		return 0, nil
	}
	return resp.StatusCode, resp.Header
}
