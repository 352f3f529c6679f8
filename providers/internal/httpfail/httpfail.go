// Package httpfail classifies the failures that every HTTP model provider
// adapter under providers/ meets, so the three adapters agree on them:
//
//   - transport errors from Go's net/http ([Network]): connection refused,
//     reset, closed or cut short, HTTP/2 RST_STREAM and GOAWAY, DNS failures
//     and timeouts;
//   - HTTP statuses with nothing more specific in the body ([StatusKind]);
//   - the server's retry advice in response headers ([RetryAfter], [Hint])
//     and in Google's RetryInfo ([ParseDuration]);
//   - the provider's request id ([RequestID]);
//   - the few documented message fragments a provider leaves no typed field
//     for ([MatchFragment]), all kept in one table.
//
// It also builds the HTTP client the adapters use ([Client], [NewClient])
// and the errors the adapters share: a failure the provider reported in an
// error body or event, once the adapter has read its class from the typed
// fields ([Reported], [Waits]); a failure without one ([Untyped]); a
// request the adapter cannot map ([InvalidRequest]); a stream without its
// terminal marker ([MissingFinish]); and tool arguments that are not a
// JSON object ([BadArguments]).
//
// The package may import only the standard library, llm,
// golang.org/x/net/http2 and OpenTelemetry's HTTP instrumentation
// (otelhttp); it knows no provider SDK.
package httpfail

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"golang.org/x/net/http2"
)

// Network classifies err as a transport failure. It reports KindTimeout for
// any timeout (a [net.Error] whose Timeout is true, or a context deadline
// that is not the caller's), KindNetwork for a refused, reset, aborted,
// closed or cut-short connection, a DNS failure, an HTTP/2 stream reset or
// GOAWAY, and false when err is none of these. Call it only after
// checking that the caller's own context is not done: when it is, the
// failure is the caller's cancellation whatever err says.
func Network(err error) (llm.Kind, bool) {
	if err == nil {
		return 0, false
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return llm.KindTimeout, true
	}
	var (
		dns   *net.DNSError
		op    *net.OpError
		se    http2.StreamError
		ga    http2.GoAwayError
		conns = []error{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED,
			syscall.EPIPE, syscall.ENETUNREACH, syscall.EHOSTUNREACH, io.EOF, io.ErrUnexpectedEOF}
	)
	for _, target := range conns {
		if errors.Is(err, target) {
			return llm.KindNetwork, true
		}
	}
	switch {
	case errors.As(err, &dns), errors.As(err, &op), errors.As(err, &se), errors.As(err, &ga):
		return llm.KindNetwork, true
	}
	// net/http's bundled HTTP/2 client has no exported GOAWAY error.
	if k, ok := MatchFragment(ScopeNetHTTP, err.Error()); ok {
		return k, true
	}
	return 0, false
}

// NetworkMessage returns a short, safe description of a transport failure
// of kind k, without addresses or URLs.
func NetworkMessage(k llm.Kind, err error) string {
	var dns *net.DNSError
	switch {
	case k == llm.KindTimeout:
		return "timed out talking to the provider"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset by peer"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed before the response was complete"
	case errors.Is(err, io.EOF):
		return "connection closed by the provider"
	case errors.As(err, &dns):
		return "provider host not found"
	}
	var se http2.StreamError
	if errors.As(err, &se) {
		return "HTTP/2 stream reset by the provider (" + se.Code.String() + ")"
	}
	return "network failure talking to the provider"
}

// StatusKind returns the class of an HTTP status when the response says
// nothing more specific: 400 and other 4xx invalid request, 401 and 403
// auth, 402 quota, 404 not found, 408 timeout, 409 server error (a
// conflict that clears on retry), 413 context overflow (the request is too
// large), 429 rate limited, 503 and 529 overloaded, 500, 502, 504 and other
// 5xx server error. Anything else, including 2xx, is KindServerError: the
// adapter calls it only for a response it could not use.
func StatusKind(code int) llm.Kind {
	switch code {
	case http.StatusUnauthorized, http.StatusForbidden:
		return llm.KindAuth
	case http.StatusPaymentRequired:
		return llm.KindQuotaExhausted
	case http.StatusNotFound:
		return llm.KindNotFound
	case http.StatusRequestTimeout:
		return llm.KindTimeout
	case http.StatusConflict:
		return llm.KindServerError
	case http.StatusRequestEntityTooLarge:
		return llm.KindContextOverflow
	case http.StatusTooManyRequests:
		return llm.KindRateLimited
	case http.StatusServiceUnavailable, 529:
		return llm.KindOverloaded
	}
	if code >= 400 && code < 500 {
		return llm.KindInvalidRequest
	}
	return llm.KindServerError
}

// StatusMessage returns a message for a failed response that carried none:
// "HTTP 502 Bad Gateway", or "HTTP 529 Overloaded" for Anthropic's 529,
// which [http.StatusText] does not know.
func StatusMessage(code int) string {
	text := http.StatusText(code)
	if code == 529 {
		text = "Overloaded"
	}
	if text == "" {
		return "HTTP " + strconv.Itoa(code)
	}
	return "HTTP " + strconv.Itoa(code) + " " + text
}

// RetryAfter returns the delay a response asks for, zero when it asks for
// none: retry-after-ms (milliseconds) wins over retry-after, which holds
// seconds or an HTTP date (measured from now). Negative, unparsable and
// past values count as none.
func RetryAfter(h http.Header, now time.Time) time.Duration {
	if h == nil {
		return 0
	}
	if v := strings.TrimSpace(h.Get("retry-after-ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms > 0 && ms < 1e12 {
			return time.Duration(ms * float64(time.Millisecond))
		}
	}
	v := strings.TrimSpace(h.Get("retry-after"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s > 0 && s < 1e9 {
			return time.Duration(s * float64(time.Second))
		}
		return 0
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// Hint returns the server's retry advice: HintNever when x-should-retry is
// "false"; otherwise HintAfter when retryAfter is positive, HintBackoff when
// x-should-retry is "true", and HintDefault when the server said nothing.
func Hint(h http.Header, retryAfter time.Duration) llm.Hint {
	var should string
	if h != nil {
		should = strings.ToLower(strings.TrimSpace(h.Get("x-should-retry")))
	}
	switch {
	case should == "false":
		return llm.HintNever
	case retryAfter > 0:
		return llm.HintAfter
	case should == "true":
		return llm.HintBackoff
	}
	return llm.HintDefault
}

// RequestID returns the provider's request id from x-request-id (OpenAI and
// most compatible servers) or request-id (Anthropic), empty when neither
// is set.
func RequestID(h http.Header) string {
	if h == nil {
		return ""
	}
	if id := h.Get("x-request-id"); id != "" {
		return id
	}
	return h.Get("request-id")
}

// ParseDuration parses a protobuf JSON duration such as "55s", "0.5s" or
// "1.000340s", the form of google.rpc.RetryInfo's retryDelay. It reports
// false for anything else, including negative durations.
func ParseDuration(s string) (time.Duration, bool) {
	num, ok := strings.CutSuffix(strings.TrimSpace(s), "s")
	if !ok || num == "" || strings.HasPrefix(num, "-") || strings.HasPrefix(num, "+") {
		return 0, false
	}
	secs, err := strconv.ParseFloat(num, 64)
	if err != nil || secs < 0 || secs > 315576000000 {
		return 0, false
	}
	return time.Duration(secs * float64(time.Second)), true
}

// Redact returns msg with every occurrence of each secret replaced by
// "[redacted]". Secrets shorter than 8 bytes are left alone: they are not
// real keys and replacing them would mangle ordinary words.
func Redact(msg string, secrets ...string) string {
	for _, s := range secrets {
		if len(s) >= 8 {
			msg = strings.ReplaceAll(msg, s, "[redacted]")
		}
	}
	return msg
}

// RedactErr returns err with secrets redacted from its text, as [Redact]
// does, for the Err field of a [llm.Error] that ends up in logs. The
// result unwraps to err, so errors.Is and errors.As still see the SDK's
// error. It returns err itself when there is nothing to redact.
func RedactErr(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	if msg := err.Error(); Redact(msg, secrets...) == msg {
		return err
	}
	return &redacted{err: err, secrets: secrets}
}

type redacted struct {
	err     error
	secrets []string
}

func (r *redacted) Error() string { return Redact(r.err.Error(), r.secrets...) }
func (r *redacted) Unwrap() error { return r.err }

// MissingFinish returns the error for a stream that ended cleanly without
// its terminal marker: KindStreamInterrupted when output had been yielded,
// since the reply is incomplete, and KindServerError otherwise.
func MissingFinish(provider string, output bool, code int, requestID string) *llm.Error {
	e := &llm.Error{
		Kind:       llm.KindServerError,
		Message:    "the stream ended without a finish (missing finish)",
		Provider:   provider,
		StatusCode: code,
		RequestID:  requestID,
		Err:        io.ErrUnexpectedEOF,
	}
	if output {
		e.Kind = llm.KindStreamInterrupted
		e.Message = "the stream ended without a finish after partial output (missing finish)"
	}
	return e
}

// InvalidRequest returns the error for a request the adapter cannot map
// to its API (a tool schema that is not a JSON object, for example): the
// caller's mistake, which no retry fixes, found before anything is sent.
func InvalidRequest(provider string, err error) *llm.Error {
	return &llm.Error{Kind: llm.KindInvalidRequest, Message: err.Error(), Provider: provider, Err: err}
}

// BadArguments returns the error for a tool call whose complete arguments
// are not a JSON object: the model or the server produced garbage, which a
// retry may not repeat, so it is a server error.
func BadArguments(provider, name string, err error) *llm.Error {
	return &llm.Error{
		Kind:     llm.KindServerError,
		Message:  fmt.Sprintf("the arguments of tool call %q are not a JSON object", name),
		Provider: provider,
		Err:      err,
	}
}

// Client returns the HTTP client an adapter uses: hc when the caller set
// one (tests, custom transports), else [NewClient] with connectTimeout. A
// negative connectTimeout is a configuration error, reported as
// "<adapter>: negative connect timeout" whether or not hc is set.
func Client(adapter string, hc *http.Client, connectTimeout time.Duration) (*http.Client, error) {
	if connectTimeout < 0 {
		return nil, errors.New(adapter + ": negative connect timeout")
	}
	if hc != nil {
		return hc, nil
	}
	return NewClient(connectTimeout), nil
}

// MaxIdleConnsPerHost is how many idle connections a provider's client
// keeps per host. net/http's default, 2, closes nearly every connection of
// a busy provider after its reply (HTTP/1.1 carries one reply at a time),
// so most calls dial again: at 20 concurrent turns, 39% did.
const MaxIdleConnsPerHost = 256

// NewClient returns an HTTP client for a provider whose connection set-up
// (dial and TLS handshake) is bounded by connectTimeout, 10s when zero. It
// sets no overall timeout: a streamed reply may last minutes, and the
// runtime bounds the first token and the gaps between chunks itself. It
// keeps up to [MaxIdleConnsPerHost] idle connections per host, for 90s. Its
// requests carry the caller's trace context and are traced (see traced).
func NewClient(connectTimeout time.Duration) *http.Client {
	return &http.Client{Transport: traced(newTransport(connectTimeout))}
}

// newTransport returns the transport under NewClient's instrumentation.
func newTransport(connectTimeout time.Duration) *http.Transport {
	if connectTimeout <= 0 {
		connectTimeout = 10 * time.Second
	}
	t, ok := http.DefaultTransport.(*http.Transport)
	if ok {
		t = t.Clone()
	} else {
		t = &http.Transport{Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true, IdleConnTimeout: 90 * time.Second}
	}
	t.DialContext = (&net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}).DialContext
	t.TLSHandshakeTimeout = connectTimeout
	t.MaxIdleConnsPerHost = MaxIdleConnsPerHost
	t.MaxIdleConns = 4 * MaxIdleConnsPerHost
	return t
}

// Guard protects a provider's stream from its SDK's decoder: some SDK
// decoders panic on a response of the wrong shape (a field of the wrong
// JSON type), which is a broken upstream, not a bug of the caller. Use it
// first thing in a Stream iterator:
//
//	yield, done := httpfail.Guard(p.name, yield)
//	defer done()
//
// done turns such a panic into one KindServerError yielded last. A panic
// raised by the consumer inside yield is passed on unchanged.
func Guard(provider string, yield func(llm.Chunk, error) bool) (guarded func(llm.Chunk, error) bool, done func()) {
	inYield := false
	guarded = func(c llm.Chunk, err error) bool {
		inYield = true
		ok := yield(c, err)
		inYield = false
		return ok
	}
	done = func() {
		r := recover()
		if r == nil {
			return
		}
		if inYield {
			panic(r)
		}
		yield(llm.Chunk{}, &llm.Error{
			Kind:     llm.KindServerError,
			Provider: provider,
			Message:  "the provider sent a response that could not be read",
			Err:      fmt.Errorf("%s: decoding the response panicked: %v", provider, r),
		})
	}
	return guarded, done
}
