// Package openai is turnstile's provider for the OpenAI Chat Completions API
// and the servers that speak it (vLLM, Ollama, llama.cpp, OpenRouter, Groq
// and others: set [Config.BaseURL]; fields a server adds are ignored).
//
// It maps a [llm.Request] to a streamed chat completion: the system
// prompt becomes a system message, user text a user message, assistant
// text and tool calls an assistant message, each tool result a tool
// message, tools function tools, and MaxOutputTokens, Temperature and
// StopSequences their request fields (the output schema, tool choice,
// reasoning and end user as setGenerationOptions says). Thinking parts are not sent back:
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
// at most one HTTP request. The request is the SDK's, byte for byte, but
// sent by the adapter itself (see direct.go).
//
// The package imports only llm, the shared adapter code under
// providers/internal (httpfail, stream, endpoint, which also holds its
// configuration [Settings]) and the official SDK, github.com/openai/openai-go/v3.
package openai

import (
	"context"
	"iter"
	"net/http"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/endpoint"
	"github.com/turnstile-dev/turnstile/providers/internal/stream"
)

// DefaultBaseURL is the endpoint used when [Config.BaseURL] is empty.
const DefaultBaseURL = "https://api.openai.com/v1/"

// Config configures a [Provider]. Its fields are those of every HTTP
// provider (see providers/README.md); for OpenAI:
//
//   - Name is the configured provider name, reported on every error;
//     empty means "openai".
//   - BaseURL is the API endpoint, including /v1 (for example
//     http://127.0.0.1:11434/v1 for Ollama); empty means [DefaultBaseURL].
//   - APIKey is the bearer token, already read from the environment by the
//     caller; empty sends none, as local servers expect.
//   - Headers are extra HTTP headers sent with every request.
//   - ConnectTimeout bounds dialling and the TLS handshake (0: 10s). It is
//     ignored when HTTPClient is set.
//   - HTTPClient replaces the default HTTP client, for tests.
//
// The zero value talks to OpenAI without a key, which fails with KindAuth.
type Config endpoint.Config

// New returns a provider for cfg. It reads nothing from the environment:
// the SDK's OPENAI_* variables are ignored.
func New(cfg Config) (*Provider, error) {
	c, opts, err := endpoint.Stainless(endpoint.Config(cfg), "openai", DefaultBaseURL, option.WithBaseURL, option.WithHTTPClient, option.WithMaxRetries, option.WithAPIKey, option.WithHeader)
	if err != nil {
		return nil, err
	}
	chat := openai.NewChatCompletionService(opts...)
	return &Provider{name: c.Name, secrets: c.Secrets(), chat: chat, direct: newDirect(&chat, c.HTTPClient)}, nil
}

// Provider streams chat completions. It is safe for concurrent use.
type Provider struct {
	name string
	// secrets are the API key and header values, redacted from errors.
	secrets []string
	chat    openai.ChatCompletionService
	// direct sends the requests the SDK would send (see direct.go); nil
	// when the SDK built none at New, and then the SDK sends them.
	direct *direct
}

var _ llm.Provider = (*Provider)(nil)

// Stream sends req as one streamed chat completion and yields its chunks,
// ending with a [llm.ChunkStop] or with one classified error.
func (p *Provider) Stream(ctx context.Context, req *llm.Request) iter.Seq2[llm.Chunk, error] {
	return stream.Run(p.name, req, buildParams, func(params openai.ChatCompletionNewParams, yield func(llm.Chunk, error) bool) {
		if p.direct == nil {
			p.viaSDK(ctx, params, yield)
			return
		}
		body, ok := appendParams(make([]byte, 0, 1024), &params)
		if !ok {
			p.viaSDK(ctx, params, yield)
			return
		}
		resp, err := p.direct.send(ctx, body)
		if err != nil || resp.StatusCode >= 400 || ctx.Err() != nil {
			// Not a stream: the SDK reads and classifies what came back,
			// as if its own client had received it.
			p.viaSDK(ctx, params, yield, option.WithMiddleware(func(*http.Request, option.MiddlewareNext) (*http.Response, error) {
				return resp, err
			}))
			return
		}
		defer resp.Body.Close()
		p.consumeFast(ctx, resp, yield)
	})
}

// viaSDK sends params through the SDK's own request pipeline, with opts,
// and yields the reply's chunks.
func (p *Provider) viaSDK(ctx context.Context, params openai.ChatCompletionNewParams, yield func(llm.Chunk, error) bool, opts ...option.RequestOption) {
	var resp *http.Response
	s := p.chat.NewStreaming(ctx, params, append(opts, option.WithResponseInto(&resp))...)
	defer s.Close()
	p.streamChunks(ctx, s, resp, yield)
}
