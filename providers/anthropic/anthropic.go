// Package anthropic is turnstile's provider for the Anthropic Messages API.
//
// It maps a [llm.Request] to a streamed message: the system prompt to
// the system field, user text and tool results to user turns (tool results
// as tool_result blocks, with is_error), assistant text, tool calls and
// thinking blocks to assistant turns — a thinking part goes back with its
// signature unchanged, as the API requires, and one without a signature is
// dropped — tools to custom tools, and MaxOutputTokens (default
// [DefaultMaxTokens]), Temperature, TopP and StopSequences to their fields
// (the output schema, tool choice, reasoning, sampling options and end
// user as setGenerationOptions says, by the model's capabilities);
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
// The package imports only llm, the shared adapter code under
// providers/internal (httpfail, stream, jsonscan, endpoint, which also
// holds its configuration [Settings]) and the official SDK,
// github.com/anthropics/anthropic-sdk-go.
package anthropic

import (
	"context"
	"iter"

	"github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/option"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/capability"
	"github.com/turnstile-dev/turnstile/providers/internal/endpoint"
	"github.com/turnstile-dev/turnstile/providers/internal/stream"
)

// DefaultBaseURL is the endpoint used when [Config.BaseURL] is empty.
const DefaultBaseURL = "https://api.anthropic.com/"

// DefaultMaxTokens is the output limit sent when the request sets none:
// the Messages API requires one.
const DefaultMaxTokens = 4096

// Config configures a [Provider]. Its fields are those of every HTTP
// provider (see providers/README.md); for Anthropic:
//
//   - Name is the configured provider name, reported on every error;
//     empty means "anthropic".
//   - BaseURL is the API endpoint, without /v1; empty means
//     [DefaultBaseURL].
//   - APIKey is sent as x-api-key, already read from the environment by
//     the caller.
//   - Headers are extra HTTP headers sent with every request, for example
//     anthropic-beta.
//   - ConnectTimeout bounds dialling and the TLS handshake (0: 10s). It is
//     ignored when HTTPClient is set.
//   - HTTPClient replaces the default HTTP client, for tests.
type Config endpoint.Config

// Provider streams Anthropic messages. It is safe for concurrent use.
type Provider struct {
	name string
	// secrets are the API key and header values, redacted from errors.
	secrets  []string
	messages anthropic.MessageService
}

var _ llm.Provider = (*Provider)(nil)

// New returns a provider for cfg. It reads nothing from the environment:
// the SDK's ANTHROPIC_* variables are ignored.
func New(cfg Config) (*Provider, error) {
	c, opts, err := endpoint.Stainless(endpoint.Config(cfg), "anthropic", DefaultBaseURL, option.WithBaseURL, option.WithHTTPClient, option.WithMaxRetries, option.WithAPIKey, option.WithHeader)
	if err != nil {
		return nil, err
	}
	// The SDK's own OpenTelemetry span (anthropic.messages.create, a
	// second GenAI chat span with the call's usage) is off: turnstile's
	// chat span is the call's, and the HTTP client's span its child, so
	// backends count each call's tokens once. Its trace-context headers go
	// too; the HTTP client's instrumentation sends them.
	opts = append(opts, option.WithoutOpenTelemetry())
	return &Provider{name: c.Name, secrets: c.Secrets(), messages: anthropic.NewMessageService(opts...)}, nil
}

// Capabilities returns what the Claude model takes, from the table of
// providers/internal/capability: adaptive or budget thinking, sampling
// options, prefill (which Claude 4.6 and later refuse), the temperature
// range and its signatures.
func (p *Provider) Capabilities(model string) llm.Capabilities {
	return capability.Lookup(capability.Anthropic, model).Capabilities
}

// capabilitiesOf returns what req's model takes: as the runtime resolved
// it, else from the table.
func capabilitiesOf(req *llm.Request) llm.Capabilities {
	if req.Capabilities != nil {
		return *req.Capabilities
	}
	return capability.Lookup(capability.Anthropic, req.Model).Capabilities
}

// Stream sends req as one streamed message and yields its chunks, ending
// with a [llm.ChunkStop] or with one classified error.
func (p *Provider) Stream(ctx context.Context, req *llm.Request) iter.Seq2[llm.Chunk, error] {
	return stream.Stainless(ctx, p.name, req, buildParams, p.messages.NewStreaming, option.WithResponseInto, p.streamEvents)
}
