// Package anthropic is turnstile's provider for the Anthropic Messages API.
//
// It maps a [llm.Request] to a streamed message: the system prompt to
// the system field, user text and tool results to user turns (tool results
// as tool_result blocks, with is_error), assistant text, tool calls and
// thinking blocks to assistant turns — a thinking part goes back with its
// signature unchanged, as the API requires, and one without a signature is
// dropped — tools to custom tools, and MaxOutputTokens (default
// [DefaultMaxTokens]), Temperature and StopSequences to their fields;
// consecutive messages of one role are merged into one turn. The stream
// becomes [llm.Chunk]s: text, thinking text and signatures (Index
// counts the reply's thinking blocks), tool calls with their JSON
// fragments (closed, after checking they are a JSON object, at
// content_block_stop), usage (input, output, cache read and cache write
// tokens, from message_start and message_delta) and the stop reason.
// Redacted thinking blocks are skipped.
//
// Every failure is classified as a [*llm.Error] from the error type in
// the body (rate_limit_error, overloaded_error, billing_error, …), its
// details.error_code, a documented message fragment for the plain 400s
// that have nothing else ("prompt is too long", "credit balance is too
// low"), then the HTTP status, with retry-after (else the reset time of an
// exhausted anthropic-ratelimit-* limit), x-should-retry and request-id
// read from the headers. An event: error mid-stream keeps its
// error type's class; a stop_reason of model_context_window_exceeded is a
// context overflow; transport failures are network or timeout; a stream
// without message_stop is "missing finish". When the caller's context is
// done its error is returned unchanged. The SDK's retries are off: one
// Stream is at most one HTTP request.
//
// The package imports only llm, policy, providers/internal/httpfail and
// providers/internal/endpoint (for its configuration [Settings]), and the
// official SDK, github.com/anthropics/anthropic-sdk-go.
package anthropic

import (
	"context"
	"iter"
	"net/http"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/option"
	"github.com/anthropics/anthropic-sdk-go/packages/ssestream"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/httpfail"
)

// DefaultBaseURL is the endpoint used when [Config.BaseURL] is empty.
const DefaultBaseURL = "https://api.anthropic.com/"

// DefaultMaxTokens is the output limit sent when the request sets none:
// the Messages API requires one.
const DefaultMaxTokens = 4096

// Config configures a [Provider].
type Config struct {
	// Name is the configured provider name, reported on every error.
	Name string
	// BaseURL is the API endpoint, without /v1; empty means [DefaultBaseURL].
	BaseURL string
	// APIKey is sent as x-api-key, already read from the environment by the
	// caller.
	APIKey string
	// Headers are extra HTTP headers sent with every request, for example
	// anthropic-beta.
	Headers map[string]string
	// ConnectTimeout bounds dialling and the TLS handshake (0: 10s). It is
	// ignored when HTTPClient is set.
	ConnectTimeout time.Duration
	// HTTPClient replaces the default HTTP client, for tests.
	HTTPClient *http.Client
}

// Provider streams Anthropic messages. It is safe for concurrent use.
type Provider struct {
	name     string
	apiKey   string
	messages anthropic.MessageService
}

var _ llm.Provider = (*Provider)(nil)

// New returns a provider for cfg. It reads nothing from the environment:
// the SDK's ANTHROPIC_* variables are ignored.
func New(cfg Config) (*Provider, error) {
	if cfg.Name == "" {
		cfg.Name = "anthropic"
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultBaseURL
	}
	hc, err := httpfail.Client("anthropic", cfg.HTTPClient, cfg.ConnectTimeout)
	if err != nil {
		return nil, err
	}
	opts := []option.RequestOption{
		option.WithBaseURL(cfg.BaseURL),
		option.WithHTTPClient(hc),
		// The runtime owns retries; the SDK would retry 408/409/429/5xx twice.
		option.WithMaxRetries(0),
	}
	if cfg.APIKey != "" {
		opts = append(opts, option.WithAPIKey(cfg.APIKey))
	}
	for k, v := range cfg.Headers {
		opts = append(opts, option.WithHeader(k, v))
	}
	return &Provider{
		name:     cfg.Name,
		apiKey:   cfg.APIKey,
		messages: anthropic.NewMessageService(opts...),
	}, nil
}

// Stream sends req as one streamed message and yields its chunks, ending
// with a [llm.ChunkStop] or with one classified error.
func (p *Provider) Stream(ctx context.Context, req *llm.Request) iter.Seq2[llm.Chunk, error] {
	return func(yield func(llm.Chunk, error) bool) {
		yield, done := httpfail.Guard(p.name, yield)
		defer done()
		params, err := buildParams(req)
		if err != nil {
			yield(llm.Chunk{}, httpfail.InvalidRequest(p.name, err))
			return
		}
		var resp *http.Response
		stream := p.messages.NewStreaming(ctx, params, option.WithResponseInto(&resp))
		defer stream.Close()
		p.consume(ctx, stream, resp, yield)
	}
}

// consume turns the SDK's event stream into chunks. resp is the HTTP
// response, nil when none arrived.
func (p *Provider) consume(ctx context.Context, stream *ssestream.Stream[anthropic.MessageStreamEventUnion], resp *http.Response, yield func(llm.Chunk, error) bool) {
	d := decoder{provider: p.name}
	emit := func(c llm.Chunk) bool {
		switch c.Kind {
		case llm.ChunkText, llm.ChunkThinking, llm.ChunkToolCallStart, llm.ChunkToolCallArgs:
			d.output = true
		}
		return yield(c, nil)
	}
	var code int
	var h http.Header
	if resp != nil {
		code, h = resp.StatusCode, resp.Header
	}
	for stream.Next() {
		ok, err := d.event(stream.Current(), emit)
		if err != nil {
			err.StatusCode, err.RequestID = code, httpfail.RequestID(h)
			yield(llm.Chunk{}, err)
			return
		}
		if !ok {
			return
		}
	}
	if err := stream.Err(); err != nil {
		yield(llm.Chunk{}, p.classify(ctx, err, resp))
		return
	}
	if err := ctx.Err(); err != nil {
		yield(llm.Chunk{}, err)
		return
	}
	if !d.finished {
		yield(llm.Chunk{}, httpfail.MissingFinish(p.name, d.output, code, httpfail.RequestID(h)))
		return
	}
	yield(llm.Chunk{Kind: llm.ChunkStop, Stop: d.stop}, nil)
}
