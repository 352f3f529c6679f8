// Package fake holds scripted stand-ins for the runtime's upstreams, for
// tests: a [Provider] that replays scripted replies and records every
// request, and a [Tool] that counts its calls.
package fake

import (
	"context"
	"encoding/json"
	"iter"
	"sync"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// Reply is one scripted model call: Chunks are yielded in order, then Err
// when set. With Hang the call blocks after its chunks until ctx is done.
type Reply struct {
	Chunks []llm.Chunk
	Err    error
	Hang   bool
	// Delay, when set, is how long the reply waits before its first
	// chunk (or until the call's context ends).
	Delay time.Duration
}

// Provider replays Replies, one per call, in order; calls past the end
// repeat the last reply. It records each request. Safe for concurrent use.
type Provider struct {
	// Caps is what the provider says each of its models takes
	// ([Provider.Capabilities]). With Caps.Prefill, a reply cut short is
	// continued from a trailing assistant message, as Claude before 4.6
	// does, instead of a continuation prompt.
	Caps llm.Capabilities

	mu       sync.Mutex
	replies  []Reply
	requests []*llm.Request
}

var _ llm.Provider = (*Provider)(nil)

// NewProvider returns a Provider scripted with replies.
func NewProvider(replies ...Reply) *Provider { return &Provider{replies: replies} }

// Stream implements [runtime.Provider].
func (p *Provider) Stream(ctx context.Context, req *llm.Request) iter.Seq2[llm.Chunk, error] {
	p.mu.Lock()
	n := len(p.requests)
	clone := *req
	clone.Messages = append([]llm.Message(nil), req.Messages...)
	p.requests = append(p.requests, &clone)
	r := p.replies[min(n, len(p.replies)-1)]
	p.mu.Unlock()
	return func(yield func(llm.Chunk, error) bool) {
		if r.Delay > 0 {
			t := time.NewTimer(r.Delay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				yield(llm.Chunk{}, ctx.Err())
				return
			}
		}
		for _, c := range r.Chunks {
			if ctx.Err() != nil {
				yield(llm.Chunk{}, ctx.Err())
				return
			}
			if !yield(c, nil) {
				return
			}
		}
		if r.Hang {
			<-ctx.Done()
			yield(llm.Chunk{}, ctx.Err())
			return
		}
		if r.Err != nil {
			yield(llm.Chunk{}, r.Err)
		}
	}
}

// Capabilities returns p.Caps, for every model.
func (p *Provider) Capabilities(string) llm.Capabilities { return p.Caps }

// Calls returns how many calls the provider received.
func (p *Provider) Calls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.requests)
}

// Requests returns the requests received, in order.
func (p *Provider) Requests() []*llm.Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*llm.Request(nil), p.requests...)
}

// Text returns the chunks of a reply that says text and ends the turn.
func Text(text string) []llm.Chunk {
	return []llm.Chunk{
		{Kind: llm.ChunkText, Text: text},
		{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 10, OutputTokens: 5}},
		{Kind: llm.ChunkStop, Stop: llm.StopEndTurn},
	}
}

// Call returns the chunks of a reply that calls tool name with args.
func Call(id, name, args string) []llm.Chunk {
	return []llm.Chunk{
		{Kind: llm.ChunkToolCallStart, Index: 0, CallID: id, Name: name},
		{Kind: llm.ChunkToolCallArgs, Index: 0, Text: args},
		{Kind: llm.ChunkToolCallEnd, Index: 0},
		{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 10, OutputTokens: 5}},
		{Kind: llm.ChunkStop, Stop: llm.StopToolUse},
	}
}

// Tool is a server-side tool that records its calls and answers with Fn.
type Tool struct {
	ToolSpec llm.ToolSpec
	// Fn computes the result; nil answers {"ok":true}.
	Fn func(ctx context.Context, call llm.ToolCall, progress func(llm.ToolProgress)) (llm.ToolOutput, error)

	mu    sync.Mutex
	calls []llm.ToolCall
}

var _ llm.Tool = (*Tool)(nil)

// NewTool returns a Tool named name with an object schema.
func NewTool(name string, fn func(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error)) *Tool {
	return &Tool{ToolSpec: llm.ToolSpec{Name: name, Description: "test tool " + name, Schema: json.RawMessage(`{"type":"object"}`)}, Fn: fn}
}

// Spec implements [runtime.Tool].
func (t *Tool) Spec() llm.ToolSpec { return t.ToolSpec }

// Call implements [runtime.Tool].
func (t *Tool) Call(ctx context.Context, call llm.ToolCall, progress func(llm.ToolProgress)) (llm.ToolOutput, error) {
	t.mu.Lock()
	t.calls = append(t.calls, call)
	t.mu.Unlock()
	if t.Fn == nil {
		return llm.ToolOutput{Content: `{"ok":true}`}, nil
	}
	return t.Fn(ctx, call, progress)
}

// Calls returns the calls received.
func (t *Tool) Calls() []llm.ToolCall {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]llm.ToolCall(nil), t.calls...)
}
