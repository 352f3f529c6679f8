// Package gemini adapts the Gemini API (generativelanguage.googleapis.com,
// streamGenerateContent) to [runtime.Provider] through the official SDK,
// google.golang.org/genai.
//
// It maps the runtime's conversation to Gemini contents (assistant turns
// become role "model", tool results become functionResponse parts of a
// user turn, thinking parts keep their thought signatures), streams each
// response chunk as runtime chunks (text, thought text, whole function calls,
// usage, finish reason), and classifies every failure from its real signal:
// the google.rpc status and details of an [genai.APIError] (RetryInfo,
// QuotaFailure, ErrorInfo), including errors delivered inside the stream,
// and Go's transport errors. The SDK's own retries are off; the runtime owns
// retries.
//
// Gemini attaches thought signatures to function-call and text parts, not
// only to thought parts. Such a signature is streamed as a signature-only
// [runtime.ChunkThinking] just before its part, so it is committed as a
// thinking part with no text; when the conversation is sent back, a
// signature-only thinking part is re-attached to the part that follows it.
package gemini

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"time"

	"google.golang.org/genai"

	"github.com/turnstile-dev/turnstile/providers/internal/httpfail"
	"github.com/turnstile-dev/turnstile/runtime"
)

// Config configures a [Provider].
type Config struct {
	// Name is the provider's configured name, reported in errors.
	Name string
	// BaseURL overrides the API endpoint (default
	// https://generativelanguage.googleapis.com/).
	BaseURL string
	// APIKey authenticates requests (sent as x-goog-api-key). Required: the
	// adapter never falls back to the SDK's environment variables.
	APIKey string
	// Headers are extra HTTP headers sent with every request.
	Headers map[string]string
	// ConnectTimeout bounds connecting to the API (default 10s).
	ConnectTimeout time.Duration
	// HTTPClient replaces the HTTP client, for tests; ConnectTimeout is then
	// ignored.
	HTTPClient *http.Client
}

// Provider streams Gemini model calls. It is safe for concurrent use.
type Provider struct {
	name   string
	apiKey string
	client *genai.Client
}

var _ runtime.Provider = (*Provider)(nil)

// New returns a Provider for cfg.
func New(cfg Config) (*Provider, error) {
	if cfg.Name == "" {
		cfg.Name = "gemini"
	}
	if cfg.APIKey == "" {
		return nil, errors.New("gemini: an API key is required")
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = httpfail.NewClient(cfg.ConnectTimeout)
	}
	// Capture each response's headers (request id, Retry-After) for the
	// error classification: the SDK's APIError does not keep them.
	hc = withHeaderCapture(hc)
	headers := http.Header{}
	for k, v := range cfg.Headers {
		headers.Set(k, v)
	}
	one := int32(1)
	client, err := genai.NewClient(context.Background(), &genai.ClientConfig{
		APIKey:     cfg.APIKey,
		Backend:    genai.BackendGeminiAPI,
		HTTPClient: hc,
		HTTPOptions: genai.HTTPOptions{
			BaseURL: cfg.BaseURL,
			Headers: headers,
			// One attempt per call: the runtime owns retries.
			RetryOptions: &genai.HTTPRetryOptions{Attempts: &one},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("gemini: %s", httpfail.Redact(err.Error(), cfg.APIKey))
	}
	return &Provider{name: cfg.Name, apiKey: cfg.APIKey, client: client}, nil
}

// Stream implements [runtime.Provider].
func (p *Provider) Stream(ctx context.Context, req *runtime.Request) iter.Seq2[runtime.Chunk, error] {
	return func(yield func(runtime.Chunk, error) bool) {
		// The SDK's decoder panics on some malformed responses (a field of
		// the wrong JSON type): that is a broken upstream, not a bug here.
		// A panic raised by the consumer inside yield is passed on.
		inYield := false
		defer func() {
			if r := recover(); r != nil {
				if inYield {
					panic(r)
				}
				yield(runtime.Chunk{}, &runtime.Error{
					Kind: runtime.KindServerError, Provider: p.name,
					Message: "the provider sent a response that could not be read",
					Err:     fmt.Errorf("gemini: decoding the response panicked: %v", r),
				})
			}
		}()
		send := func(c runtime.Chunk, err error) bool {
			inYield = true
			defer func() { inYield = false }()
			return yield(c, err)
		}
		contents, err := toContents(req.Messages)
		if err != nil {
			send(runtime.Chunk{}, &runtime.Error{Kind: runtime.KindInvalidRequest, Provider: p.name, Message: err.Error(), Err: err})
			return
		}
		cfg, err := toConfig(req)
		if err != nil {
			send(runtime.Chunk{}, &runtime.Error{Kind: runtime.KindInvalidRequest, Provider: p.name, Message: err.Error(), Err: err})
			return
		}
		hdr := &captured{}
		ctx = context.WithValue(ctx, captureKey{}, hdr)
		d := decoder{provider: p.name}
		for resp, err := range p.client.Models.GenerateContentStream(ctx, req.Model, contents, cfg) {
			if err != nil {
				if ctx.Err() != nil {
					send(runtime.Chunk{}, ctx.Err())
					return
				}
				send(runtime.Chunk{}, p.classify(err, hdr.header(), d.output))
				return
			}
			for _, c := range d.decode(resp) {
				if !send(c, nil) {
					return
				}
			}
			if d.failed != nil {
				d.failed.RequestID = httpfail.RequestID(hdr.header())
				send(runtime.Chunk{}, d.failed)
				return
			}
			if d.done {
				return
			}
		}
		if ctx.Err() != nil {
			send(runtime.Chunk{}, ctx.Err())
			return
		}
		// The stream ended without a finish reason.
		send(runtime.Chunk{}, httpfail.MissingFinish(p.name, d.output, http.StatusOK, httpfail.RequestID(hdr.header())))
	}
}

// captured holds the headers of the response to one call.
type captured struct {
	h http.Header
}

func (c *captured) header() http.Header { return c.h }

type captureKey struct{}

// headerCapture records the response headers of each request into the
// captured value of its context.
type headerCapture struct{ base http.RoundTripper }

func (t headerCapture) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(r)
	if c, ok := r.Context().Value(captureKey{}).(*captured); ok && resp != nil {
		c.h = resp.Header.Clone()
	}
	return resp, err
}

func withHeaderCapture(hc *http.Client) *http.Client {
	c := *hc
	base := c.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	c.Transport = headerCapture{base: base}
	return &c
}

// decoder turns response chunks into runtime chunks.
type decoder struct {
	provider string
	// output reports that a content chunk was produced.
	output bool
	// calls counts the function calls of the reply.
	calls int
	// blocks counts thinking blocks (runtime chunk indexes).
	blocks int
	usage  runtime.Usage
	done   bool
	failed *runtime.Error
}

func (d *decoder) decode(resp *genai.GenerateContentResponse) []runtime.Chunk {
	var out []runtime.Chunk
	if u := resp.UsageMetadata; u != nil {
		usage := runtime.Usage{
			InputTokens:     int64(u.PromptTokenCount - u.CachedContentTokenCount + u.ToolUsePromptTokenCount),
			OutputTokens:    int64(u.CandidatesTokenCount + u.ThoughtsTokenCount),
			CacheReadTokens: int64(u.CachedContentTokenCount),
		}
		// Report usage as soon as it is known: an attempt that fails later
		// still cost these tokens.
		if usage != d.usage {
			d.usage = usage
			out = append(out, d.usageChunk())
		}
	}
	if len(resp.Candidates) == 0 {
		if pf := resp.PromptFeedback; pf != nil && pf.BlockReason != "" {
			// The prompt was blocked before the model answered: a refusal.
			d.done = true
			return append(out, runtime.Chunk{Kind: runtime.ChunkStop, Stop: runtime.StopRefusal})
		}
		return out
	}
	cand := resp.Candidates[0]
	if cand.Content != nil {
		for _, part := range cand.Content.Parts {
			out = append(out, d.part(part)...)
		}
	}
	if cand.FinishReason == "" || cand.FinishReason == genai.FinishReasonUnspecified {
		return out
	}
	stop, err := d.finish(cand.FinishReason)
	if err != nil {
		d.failed = err
		return out
	}
	d.done = true
	return append(out, runtime.Chunk{Kind: runtime.ChunkStop, Stop: stop})
}

func (d *decoder) usageChunk() runtime.Chunk {
	return runtime.Chunk{Kind: runtime.ChunkUsage, Usage: d.usage}
}

func (d *decoder) part(part *genai.Part) []runtime.Chunk {
	if part == nil {
		return nil
	}
	var out []runtime.Chunk
	sig := ""
	if len(part.ThoughtSignature) > 0 {
		sig = encodeSignature(part.ThoughtSignature)
	}
	switch {
	case part.Thought:
		d.output = true
		if part.Text != "" {
			out = append(out, runtime.Chunk{Kind: runtime.ChunkThinking, Index: d.blocks, Text: part.Text})
		}
		if sig != "" {
			out = append(out, runtime.Chunk{Kind: runtime.ChunkThinking, Index: d.blocks, Signature: sig})
			d.blocks++
		}
	case part.FunctionCall != nil:
		d.output = true
		if sig != "" {
			out = append(out, runtime.Chunk{Kind: runtime.ChunkThinking, Index: d.blocks, Signature: sig})
			d.blocks++
		}
		fc := part.FunctionCall
		args := fc.Args
		if args == nil {
			args = map[string]any{}
		}
		b, err := json.Marshal(args)
		if err != nil {
			d.failed = httpfail.BadArguments(d.provider, fc.Name, err)
			return out
		}
		idx := d.calls
		d.calls++
		out = append(out,
			runtime.Chunk{Kind: runtime.ChunkToolCallStart, Index: idx, CallID: fc.ID, Name: fc.Name},
			runtime.Chunk{Kind: runtime.ChunkToolCallArgs, Index: idx, Text: string(b)},
			runtime.Chunk{Kind: runtime.ChunkToolCallEnd, Index: idx},
		)
	case part.Text != "":
		d.output = true
		if sig != "" {
			out = append(out, runtime.Chunk{Kind: runtime.ChunkThinking, Index: d.blocks, Signature: sig})
			d.blocks++
		}
		out = append(out, runtime.Chunk{Kind: runtime.ChunkText, Text: part.Text})
	}
	return out
}

// finish maps a finish reason to a stop reason, or to an error for the
// reasons that mean the reply is unusable.
func (d *decoder) finish(r genai.FinishReason) (runtime.StopReason, *runtime.Error) {
	switch r {
	case genai.FinishReasonStop:
		if d.calls > 0 {
			return runtime.StopToolUse, nil
		}
		return runtime.StopEndTurn, nil
	case genai.FinishReasonMaxTokens:
		return runtime.StopMaxTokens, nil
	case genai.FinishReasonSafety, genai.FinishReasonRecitation, genai.FinishReasonBlocklist,
		genai.FinishReasonProhibitedContent, genai.FinishReasonSPII, genai.FinishReasonImageSafety,
		genai.FinishReasonImageProhibitedContent, genai.FinishReasonImageRecitation:
		return runtime.StopRefusal, nil
	case genai.FinishReasonMalformedFunctionCall, genai.FinishReasonUnexpectedToolCall, genai.FinishReasonTooManyToolCalls:
		// The model produced a broken tool call; another attempt usually
		// does better.
		return 0, &runtime.Error{
			Kind: runtime.KindServerError, Provider: d.provider, StatusCode: http.StatusOK,
			Message: fmt.Sprintf("the model produced an unusable tool call (finish reason %s)", r),
		}
	}
	if d.calls > 0 {
		return runtime.StopToolUse, nil
	}
	return runtime.StopEndTurn, nil
}
