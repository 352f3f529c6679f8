// Package gemini is turnstile's provider for the Gemini API
// (generativelanguage.googleapis.com, the Gemini API backend of
// google.golang.org/genai).
//
// It maps a [llm.Request] to a streamed generateContent call: the
// system prompt to systemInstruction, user text to user turns, assistant
// text, thoughts and function calls to model turns, tool results to
// functionResponse parts ({"output": …} or, for a failed tool,
// {"error": …}), tools to function declarations with their JSON Schema,
// and MaxOutputTokens, Temperature and StopSequences to the generation
// config; consecutive messages of one role are merged into one turn.
// Gemini's thought signatures travel in [llm.PartThinking] parts: a
// signature streamed on a function call or text part is yielded as a
// [llm.ChunkThinking] with an empty text just before that part, and a
// thinking part without text is sent back as the signature of the part
// that follows it, as the API requires.
//
// The stream becomes [llm.Chunk]s: text, thought text, function calls
// (which arrive whole, so start, arguments and end come together; a call
// without an id gets one), usage (input tokens exclude cached ones, which
// count as cache reads; thought tokens count as output) and the stop
// reason. A blocked prompt or a safety finish is a refusal; a
// MALFORMED_FUNCTION_CALL or UNEXPECTED_TOOL_CALL finish is a server error
// worth one retry.
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
// The package imports only llm, policy, providers/internal/httpfail and
// providers/internal/endpoint (for its configuration [Settings]), and the
// official SDK, google.golang.org/genai.
package gemini

import (
	"context"
	"errors"
	"iter"
	"net/http"
	"sync"
	"time"

	"google.golang.org/genai"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/httpfail"
)

// DefaultBaseURL is the endpoint used when [Config.BaseURL] is empty.
const DefaultBaseURL = "https://generativelanguage.googleapis.com/"

// Config configures a [Provider].
type Config struct {
	// Name is the configured provider name, reported on every error.
	Name string
	// BaseURL is the API endpoint, without the API version; empty means
	// [DefaultBaseURL].
	BaseURL string
	// APIKey is the Gemini API key, already read from the environment by
	// the caller. It is required.
	APIKey string
	// Headers are extra HTTP headers sent with every request.
	Headers map[string]string
	// ConnectTimeout bounds dialling and the TLS handshake (0: 10s). It is
	// ignored when HTTPClient is set.
	ConnectTimeout time.Duration
	// HTTPClient replaces the default HTTP client, for tests. The provider
	// uses a copy whose transport also records each response's status and
	// headers for classification.
	HTTPClient *http.Client
}

// Provider streams Gemini replies. It is safe for concurrent use.
type Provider struct {
	name   string
	apiKey string
	models *genai.Models
}

var _ llm.Provider = (*Provider)(nil)

// New returns a provider for cfg. It reads nothing from the environment:
// the SDK's GOOGLE_* and GEMINI_* variables are ignored.
func New(cfg Config) (*Provider, error) {
	if cfg.Name == "" {
		cfg.Name = "gemini"
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultBaseURL
	}
	if cfg.APIKey == "" {
		return nil, errors.New("gemini: an API key is required")
	}
	hc, err := httpfail.Client("gemini", cfg.HTTPClient, cfg.ConnectTimeout)
	if err != nil {
		return nil, err
	}
	wrapped := *hc
	wrapped.Transport = recorder{next: hc.Transport}
	headers := http.Header{}
	for k, v := range cfg.Headers {
		headers.Set(k, v)
	}
	client, err := genai.NewClient(context.Background(), &genai.ClientConfig{
		APIKey:     cfg.APIKey,
		Backend:    genai.BackendGeminiAPI,
		HTTPClient: &wrapped,
		HTTPOptions: genai.HTTPOptions{
			BaseURL: cfg.BaseURL,
			Headers: headers,
			// One attempt: the runtime owns retries.
			RetryOptions: &genai.HTTPRetryOptions{Attempts: genai.Ptr[int32](1)},
		},
	})
	if err != nil {
		// The SDK's message may print the whole config, key included.
		return nil, errors.New("gemini: cannot create the client")
	}
	return &Provider{name: cfg.Name, apiKey: cfg.APIKey, models: client.Models}, nil
}

// Stream sends req as one streamed generateContent call and yields its
// chunks, ending with a [llm.ChunkStop] or with one classified error.
func (p *Provider) Stream(ctx context.Context, req *llm.Request) iter.Seq2[llm.Chunk, error] {
	return func(yield func(llm.Chunk, error) bool) {
		yield, done := httpfail.Guard(p.name, yield)
		defer done()
		contents, config, err := buildRequest(req)
		if err != nil {
			yield(llm.Chunk{}, httpfail.InvalidRequest(p.name, err))
			return
		}
		rec := &response{}
		rctx := context.WithValue(ctx, responseKey{}, rec)
		d := decoder{provider: p.name}
		emit := func(c llm.Chunk) bool {
			switch c.Kind {
			case llm.ChunkText, llm.ChunkThinking, llm.ChunkToolCallStart, llm.ChunkToolCallArgs:
				d.output = true
			}
			return yield(c, nil)
		}
		for resp, err := range p.models.GenerateContentStream(rctx, req.Model, contents, config) {
			if err != nil {
				yield(llm.Chunk{}, p.classify(ctx, err, rec, d.responseID))
				return
			}
			ok, ferr := d.response(resp, emit)
			if ferr != nil {
				ferr.StatusCode, ferr.RequestID = rec.get()
				yield(llm.Chunk{}, ferr)
				return
			}
			if !ok {
				return
			}
		}
		if err := ctx.Err(); err != nil {
			yield(llm.Chunk{}, err)
			return
		}
		if !d.finished {
			code, id := rec.get()
			if id == "" {
				id = d.responseID
			}
			yield(llm.Chunk{}, httpfail.MissingFinish(p.name, d.output, code, id))
			return
		}
		yield(llm.Chunk{Kind: llm.ChunkStop, Stop: d.stop}, nil)
	}
}

// responseKey marks the request context that carries a *response.
type responseKey struct{}

// response is the status and headers of one call's HTTP response, which
// the SDK does not expose on its errors.
type response struct {
	mu     sync.Mutex
	code   int
	header http.Header
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
	}
	return resp, err
}
