// Package fake holds scripted stand-ins for the runtime's upstreams, for
// tests: a [Provider] that replays scripted replies and records every
// request, and a [Tool] that counts its calls.
package fake

import (
	"context"
	"encoding/json"
	"iter"
	"sync"

	"github.com/turnstile-dev/turnstile/runtime"
)

// Reply is one scripted model call: Chunks are yielded in order, then Err
// when set. With Hang the call blocks after its chunks until ctx is done.
type Reply struct {
	Chunks []runtime.Chunk
	Err    error
	Hang   bool
}

// Provider replays Replies, one per call, in order; calls past the end
// repeat the last reply. It records each request. Safe for concurrent use.
type Provider struct {
	mu       sync.Mutex
	replies  []Reply
	requests []*runtime.Request
}

var _ runtime.Provider = (*Provider)(nil)

// NewProvider returns a Provider scripted with replies.
func NewProvider(replies ...Reply) *Provider { return &Provider{replies: replies} }

// Stream implements [runtime.Provider].
func (p *Provider) Stream(ctx context.Context, req *runtime.Request) iter.Seq2[runtime.Chunk, error] {
	p.mu.Lock()
	n := len(p.requests)
	clone := *req
	clone.Messages = append([]runtime.Message(nil), req.Messages...)
	p.requests = append(p.requests, &clone)
	r := p.replies[min(n, len(p.replies)-1)]
	p.mu.Unlock()
	return func(yield func(runtime.Chunk, error) bool) {
		for _, c := range r.Chunks {
			if ctx.Err() != nil {
				yield(runtime.Chunk{}, ctx.Err())
				return
			}
			if !yield(c, nil) {
				return
			}
		}
		if r.Hang {
			<-ctx.Done()
			yield(runtime.Chunk{}, ctx.Err())
			return
		}
		if r.Err != nil {
			yield(runtime.Chunk{}, r.Err)
		}
	}
}

// Calls returns how many calls the provider received.
func (p *Provider) Calls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.requests)
}

// Requests returns the requests received, in order.
func (p *Provider) Requests() []*runtime.Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*runtime.Request(nil), p.requests...)
}

// Text returns the chunks of a reply that says text and ends the turn.
func Text(text string) []runtime.Chunk {
	return []runtime.Chunk{
		{Kind: runtime.ChunkText, Text: text},
		{Kind: runtime.ChunkUsage, Usage: runtime.Usage{InputTokens: 10, OutputTokens: 5}},
		{Kind: runtime.ChunkStop, Stop: runtime.StopEndTurn},
	}
}

// Call returns the chunks of a reply that calls tool name with args.
func Call(id, name, args string) []runtime.Chunk {
	return []runtime.Chunk{
		{Kind: runtime.ChunkToolCallStart, Index: 0, CallID: id, Name: name},
		{Kind: runtime.ChunkToolCallArgs, Index: 0, Text: args},
		{Kind: runtime.ChunkToolCallEnd, Index: 0},
		{Kind: runtime.ChunkUsage, Usage: runtime.Usage{InputTokens: 10, OutputTokens: 5}},
		{Kind: runtime.ChunkStop, Stop: runtime.StopToolUse},
	}
}

// Tool is a server-side tool that records its calls and answers with Fn.
type Tool struct {
	ToolSpec runtime.ToolSpec
	// Fn computes the result; nil answers {"ok":true}.
	Fn func(ctx context.Context, call runtime.ToolCall, progress func(runtime.ToolProgress)) (runtime.ToolOutput, error)

	mu    sync.Mutex
	calls []runtime.ToolCall
}

var _ runtime.Tool = (*Tool)(nil)

// NewTool returns a Tool named name with an object schema.
func NewTool(name string, fn func(context.Context, runtime.ToolCall, func(runtime.ToolProgress)) (runtime.ToolOutput, error)) *Tool {
	return &Tool{ToolSpec: runtime.ToolSpec{Name: name, Description: "test tool " + name, Schema: json.RawMessage(`{"type":"object"}`)}, Fn: fn}
}

// Spec implements [runtime.Tool].
func (t *Tool) Spec() runtime.ToolSpec { return t.ToolSpec }

// Call implements [runtime.Tool].
func (t *Tool) Call(ctx context.Context, call runtime.ToolCall, progress func(runtime.ToolProgress)) (runtime.ToolOutput, error) {
	t.mu.Lock()
	t.calls = append(t.calls, call)
	t.mu.Unlock()
	if t.Fn == nil {
		return runtime.ToolOutput{Content: `{"ok":true}`}, nil
	}
	return t.Fn(ctx, call, progress)
}

// Calls returns the calls received.
func (t *Tool) Calls() []runtime.ToolCall {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]runtime.ToolCall(nil), t.calls...)
}
