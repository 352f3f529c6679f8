// Package gemini is turnstile's provider for the Gemini API
// (generativelanguage.googleapis.com, the Gemini API backend of
// google.golang.org/genai).
//
// It maps a [llm.Request] to a streamed generateContent call: the
// system prompt to systemInstruction, user text to user turns, assistant
// text, thoughts and function calls to model turns, tool results to
// functionResponse parts ({"output": …} or, for a failed tool,
// {"error": …}; a result without a name gets its call's, which the API
// requires), tools to function declarations with their JSON Schema,
// and MaxOutputTokens, Temperature, TopP and StopSequences to the
// generation config (the output schema, tool choice and reasoning as
// setGenerationOptions says, by the model's capabilities); consecutive
// messages of one role are merged into one turn. A signature that is not
// base64 is not Gemini's and is dropped.
// Gemini's thought signatures travel in [llm.PartThinking] parts: a
// signature streamed on a function call or text part is yielded as a
// [llm.ChunkThinking] with an empty text just before that part, and a
// thinking part without text is sent back as the signature of the part
// that follows it, as the API requires.
//
// The stream becomes [llm.Chunk]s: text, thought text, function calls
// (which arrive whole, so start, arguments and end come together; a call
// without an id, as Gemini 2.5 sends them, goes without one, and the
// runtime gives it one unique in the conversation; a call of the respond
// function is the reply's text), usage (input tokens exclude cached ones,
// which count as cache reads; thought tokens count as output) and the
// stop reason. A blocked prompt or a safety finish is a refusal; a
// MALFORMED_FUNCTION_CALL, UNEXPECTED_TOOL_CALL, TOO_MANY_TOOL_CALLS or
// OTHER finish, or one the adapter does not know, is a server error worth
// a retry, and LANGUAGE an invalid request.
//
// Every failure is classified as a [*llm.Error] from the google.rpc
// status and its details (QuotaFailure quota ids: per-day quotas are
// exhausted, per-minute ones rate limits; RetryInfo's retryDelay is the
// RetryAfter; ErrorInfo API_KEY_INVALID is auth), a documented message
// fragment for the plain 400 of an oversized input, then the HTTP status.
// A mid-stream error keeps its status's class; transport failures are
// network or timeout; a stream without a finishReason is "missing finish".
// When the caller's context is done its error is returned unchanged. The
// SDK's HTTP retries and its automatic stream continuation are off: one
// Stream is at most one HTTP request.
//
// The package imports only llm, the shared adapter code under
// providers/internal (httpfail, stream, jsonscan, endpoint, which also
// holds its configuration [Settings]) and the official SDK,
// google.golang.org/genai.
package gemini

import (
	"context"
	"errors"
	"io"
	"iter"
	"net/http"
	"sync"

	"google.golang.org/genai"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/endpoint"
	"github.com/turnstile-dev/turnstile/providers/internal/httpfail"
	"github.com/turnstile-dev/turnstile/providers/internal/stream"
)

// DefaultBaseURL is the endpoint used when [Config.BaseURL] is empty.
const DefaultBaseURL = "https://generativelanguage.googleapis.com/"

// Config configures a [Provider]. Its fields are those of every HTTP
// provider (see providers/README.md); for Gemini:
//
//   - Name is the configured provider name, reported on every error;
//     empty means "gemini".
//   - BaseURL is the API endpoint, without the API version; empty means
//     [DefaultBaseURL].
//   - APIKey is the Gemini API key, already read from the environment by
//     the caller. It is required.
//   - Headers are extra HTTP headers sent with every request.
//   - ConnectTimeout bounds dialling and the TLS handshake (0: 10s). It is
//     ignored when HTTPClient is set.
//   - HTTPClient replaces the default HTTP client, for tests. The provider
//     uses a copy whose transport also records each response's status and
//     headers for classification.
type Config endpoint.Config

// Provider streams Gemini replies. It is safe for concurrent use.
type Provider struct {
	name string
	// secrets are the API key and header values, redacted from errors.
	secrets []string
	models  *genai.Models
	// replay decodes the rest of a body the fast path leaves to the SDK;
	// fast is false only in tests, for the SDK's decoding alone.
	replay *genai.Models
	fast   bool
}

var _ llm.Provider = (*Provider)(nil)

// New returns a provider for cfg. It reads nothing from the environment:
// the SDK's GOOGLE_* and GEMINI_* variables are ignored.
func New(cfg Config) (*Provider, error) {
	if cfg.APIKey == "" {
		return nil, errors.New("gemini: an API key is required")
	}
	c, err := endpoint.Config(cfg).Resolve("gemini", DefaultBaseURL)
	if err != nil {
		return nil, err
	}
	wrapped := *c.HTTPClient
	wrapped.Transport = recorder{next: c.HTTPClient.Transport}
	headers := http.Header{}
	for k, v := range c.Headers {
		headers.Set(k, v)
	}
	client, err := genai.NewClient(context.Background(), &genai.ClientConfig{
		APIKey:     c.APIKey,
		Backend:    genai.BackendGeminiAPI,
		HTTPClient: &wrapped,
		HTTPOptions: genai.HTTPOptions{
			BaseURL: c.BaseURL,
			Headers: headers,
			// One attempt: the runtime owns retries.
			RetryOptions: &genai.HTTPRetryOptions{Attempts: genai.Ptr[int32](1)},
		},
	})
	if err != nil {
		// The SDK's message may print the whole config, key included.
		return nil, errors.New("gemini: cannot create the client")
	}
	// The replay client decodes what the fast path leaves to the SDK
	// (see fastEvents); its requests never leave the process.
	replay, err := genai.NewClient(context.Background(), &genai.ClientConfig{
		APIKey:      "replay",
		Backend:     genai.BackendGeminiAPI,
		HTTPClient:  &http.Client{Transport: replayTransport{}},
		HTTPOptions: genai.HTTPOptions{BaseURL: c.BaseURL, RetryOptions: &genai.HTTPRetryOptions{Attempts: genai.Ptr[int32](1)}},
	})
	if err != nil {
		return nil, errors.New("gemini: cannot create the client")
	}
	return &Provider{name: c.Name, secrets: c.Secrets(), models: client.Models, replay: replay.Models, fast: true}, nil
}

// Stream sends req as one streamed generateContent call and yields its
// chunks, ending with a [llm.ChunkStop] or with one classified error.
func (p *Provider) Stream(ctx context.Context, req *llm.Request) iter.Seq2[llm.Chunk, error] {
	return stream.Run(p.name, req, buildCall, func(c call, yield func(llm.Chunk, error) bool) {
		rec := &response{fast: p.fast}
		defer rec.closeBody()
		d := &decoder{provider: p.name, answer: c.answer}
		sdk := p.models.GenerateContentStream(context.WithValue(ctx, responseKey{}, rec), c.model, c.contents, c.config)
		// The SDK yields an error or, when the transport took the body of
		// a successful response (rec.body), nothing: the body's events
		// are then read by the fast path.
		events := func(yield func(*genai.GenerateContentResponse, error) bool) {
			for r, err := range sdk {
				if !yield(r, err) {
					return
				}
			}
			if body := rec.takenBody(); body != nil {
				defer rec.closeBody()
				p.fastEvents(ctx, c, body, rec.headers(), yield)
			}
		}
		stream.Consume(ctx, p.name, stream.Call[*genai.GenerateContentResponse]{
			Events:   events,
			Decoder:  d,
			Classify: func(err error) *llm.Error { return p.classify(err, rec, d.responseID) },
			Response: func() (int, string) {
				code, id := rec.get()
				if id == "" {
					id = d.responseID
				}
				return code, id
			},
		}, yield)
	})
}

// responseKey marks the request context that carries a *response.
type responseKey struct{}

// response is the status and headers of one call's HTTP response, which
// the SDK does not expose on its errors.
type response struct {
	// fast asks the transport to take the body of a successful response
	// for the fast path, and give the SDK an empty one.
	fast   bool
	mu     sync.Mutex
	code   int
	header http.Header
	body   io.ReadCloser
}

// takenBody returns the body the transport took, nil if none.
func (r *response) takenBody() io.ReadCloser {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.body
}

// closeBody closes the body the transport took, if any.
func (r *response) closeBody() {
	r.mu.Lock()
	b := r.body
	r.body = nil
	r.mu.Unlock()
	if b != nil {
		_ = b.Close()
	}
}

func (r *response) set(code int, h http.Header) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.code, r.header = code, h
}

// get returns the status and the request id.
func (r *response) get() (int, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.code, httpfail.RequestID(r.header)
}

func (r *response) headers() http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.header
}

// recorder is an [http.RoundTripper] that records each response's status
// and headers into the *response its request's context carries.
type recorder struct{ next http.RoundTripper }

// RoundTrip sends r through the next transport and records the response.
func (t recorder) RoundTrip(r *http.Request) (*http.Response, error) {
	next := t.next
	if next == nil {
		next = http.DefaultTransport
	}
	resp, err := next.RoundTrip(r)
	if rec, ok := r.Context().Value(responseKey{}).(*response); ok && resp != nil {
		rec.set(resp.StatusCode, resp.Header.Clone())
		if rec.fast && resp.StatusCode >= 200 && resp.StatusCode < 300 && resp.Body != nil {
			rec.mu.Lock()
			rec.body = resp.Body
			rec.mu.Unlock()
			resp.Body = http.NoBody
		}
	}
	return resp, err
}
