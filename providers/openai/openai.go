// Package openai is turnstile's provider for the OpenAI Chat Completions API
// and the servers that speak it (vLLM, Ollama, llama.cpp, OpenRouter, Groq
// and others: set [Config.BaseURL]; fields a server adds are ignored).
//
// It maps a [llm.Request] to a streamed chat completion: the system
// prompt becomes a system message, user text a user message, assistant
// text and tool calls an assistant message, each tool result a tool
// message, tools function tools, and MaxOutputTokens, Temperature and
// StopSequences their request fields. Thinking parts are not sent back:
// Chat Completions has no field for them. The stream becomes
// [llm.Chunk]s: text, reasoning (the reasoning_content or reasoning
// delta of compatible servers), tool calls with their argument fragments
// (closed, after checking they are a JSON object, when the finish reason
// arrives), usage (input tokens exclude cached ones, which count as cache
// reads) and the stop reason.
//
// Every failure is classified as a [*llm.Error]: from the error body's
// code and type (insufficient_quota, context_length_exceeded,
// rate_limit_exceeded, …), then the HTTP status, with retry-after-ms,
// retry-after, x-ratelimit-reset-*, x-should-retry and x-request-id read
// from the headers; a data: {"error":…} event mid-stream by its type and
// code; transport failures as network or timeout; a stream without a
// finish reason as "missing finish". When the caller's context is done its
// error is returned unchanged. The SDK's own retries are off: one Stream is
// at most one HTTP request.
//
// The package imports only llm, policy, providers/internal/httpfail and
// providers/internal/endpoint (for its configuration [Settings]), and the
// official SDK, github.com/openai/openai-go/v3.
package openai

import (
	"context"
	"iter"
	"net/http"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/httpfail"
)

// DefaultBaseURL is the endpoint used when [Config.BaseURL] is empty.
const DefaultBaseURL = "https://api.openai.com/v1/"

// Config configures a [Provider]. The zero value talks to OpenAI without a
// key, which fails with KindAuth.
type Config struct {
	// Name is the configured provider name, reported on every error.
	Name string
	// BaseURL is the API endpoint, including /v1 (for example
	// http://127.0.0.1:11434/v1 for Ollama); empty means [DefaultBaseURL].
	BaseURL string
	// APIKey is the bearer token, already read from the environment by the
	// caller; empty sends none, as local servers expect.
	APIKey string
	// Headers are extra HTTP headers sent with every request.
	Headers map[string]string
	// ConnectTimeout bounds dialling and the TLS handshake (0: 10s). It is
	// ignored when HTTPClient is set.
	ConnectTimeout time.Duration
	// HTTPClient replaces the default HTTP client, for tests.
	HTTPClient *http.Client
}

// Provider streams chat completions. It is safe for concurrent use.
type Provider struct {
	name   string
	apiKey string
	chat   openai.ChatCompletionService
}

var _ llm.Provider = (*Provider)(nil)

// New returns a provider for cfg. It reads nothing from the environment:
// the SDK's OPENAI_* variables are ignored.
func New(cfg Config) (*Provider, error) {
	if cfg.Name == "" {
		cfg.Name = "openai"
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultBaseURL
	}
	hc, err := httpfail.Client("openai", cfg.HTTPClient, cfg.ConnectTimeout)
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
		name:   cfg.Name,
		apiKey: cfg.APIKey,
		chat:   openai.NewChatCompletionService(opts...),
	}, nil
}

// Stream sends req as one streamed chat completion and yields its chunks,
// ending with a [llm.ChunkStop] or with one classified error.
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
		stream := p.chat.NewStreaming(ctx, params, option.WithResponseInto(&resp))
		defer stream.Close()
		p.consume(ctx, stream, resp, yield)
	}
}

// consume turns the SDK's stream into chunks. resp is the HTTP response,
// nil when none arrived.
func (p *Provider) consume(ctx context.Context, stream *ssestream.Stream[openai.ChatCompletionChunk], resp *http.Response, yield func(llm.Chunk, error) bool) {
	d := decoder{provider: p.name}
	emit := func(c llm.Chunk) bool {
		switch c.Kind {
		case llm.ChunkText, llm.ChunkThinking, llm.ChunkToolCallStart, llm.ChunkToolCallArgs:
			d.output = true
		}
		return yield(c, nil)
	}
	for stream.Next() {
		ok, err := d.chunk(stream.Current(), emit)
		if err != nil {
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
		code, id := 0, ""
		if resp != nil {
			code, id = resp.StatusCode, httpfail.RequestID(resp.Header)
		}
		yield(llm.Chunk{}, httpfail.MissingFinish(p.name, d.output, code, id))
		return
	}
	yield(llm.Chunk{Kind: llm.ChunkStop, Stop: d.stop}, nil)
}
