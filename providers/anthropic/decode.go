package anthropic

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/packages/ssestream"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/httpfail"
	"github.com/turnstile-dev/turnstile/providers/internal/stream"
)

// decoder holds the state of one streamed message: it is the
// stream.Decoder of a Messages event stream.
type decoder struct {
	provider string
	// blocks maps a content block index to what it is.
	blocks    map[int64]*block
	toolCalls int
	thinking  int
	usage     llm.Usage
	finished  bool
	stop      llm.StopReason
	// model is the model message_start named.
	model string
}

// Finish reports the stop reason and whether message_stop arrived.
func (d *decoder) Finish() (llm.StopReason, bool) { return d.stop, d.finished }

// Model returns the model message_start named.
func (d *decoder) Model() string { return d.model }

type blockKind uint8

const (
	blockOther blockKind = iota
	blockText
	blockThinking
	blockTool
)

// block is one content block of the reply. index is the runtime's index:
// the tool call's or thinking block's position in the reply.
type block struct {
	kind   blockKind
	index  int
	name   string
	args   bytes.Buffer
	closed bool
}

// Decode yields the runtime chunks of one stream event through emit. It
// returns false when emit did, and an error for a tool call whose
// arguments are not a JSON object or a reply that overflowed the context.
func (d *decoder) Decode(ev anthropic.MessageStreamEventUnion, emit func(llm.Chunk) bool) (bool, *llm.Error) {
	if d.blocks == nil {
		d.blocks = map[int64]*block{}
	}
	switch ev.Type {
	case "message_start":
		d.model = ev.Message.Model
		u := ev.Message.Usage
		d.usage = llm.Usage{
			InputTokens:      u.InputTokens,
			OutputTokens:     u.OutputTokens,
			CacheReadTokens:  u.CacheReadInputTokens,
			CacheWriteTokens: u.CacheCreationInputTokens,
		}
		return emit(llm.Chunk{Kind: llm.ChunkUsage, Usage: d.usage}), nil
	case "content_block_start":
		return d.start(ev, emit), nil
	case "content_block_delta":
		return d.delta(ev, emit), nil
	case "content_block_stop":
		return d.stopBlock(ev.Index, emit)
	case "message_delta":
		// message_delta's usage is cumulative; fields it leaves out keep
		// message_start's values.
		u := ev.Usage
		if u.JSON.InputTokens.Valid() {
			d.usage.InputTokens = u.InputTokens
		}
		if u.JSON.OutputTokens.Valid() {
			d.usage.OutputTokens = u.OutputTokens
		}
		if u.JSON.CacheReadInputTokens.Valid() {
			d.usage.CacheReadTokens = u.CacheReadInputTokens
		}
		if u.JSON.CacheCreationInputTokens.Valid() {
			d.usage.CacheWriteTokens = u.CacheCreationInputTokens
		}
		if !emit(llm.Chunk{Kind: llm.ChunkUsage, Usage: d.usage}) {
			return false, nil
		}
		if ev.Delta.StopReason == "model_context_window_exceeded" {
			return false, &llm.Error{
				Kind:     llm.KindContextOverflow,
				Message:  "the reply reached the model's context window (model_context_window_exceeded)",
				Provider: d.provider,
				Err:      errors.New("stop_reason: model_context_window_exceeded"),
			}
		}
		if ev.Delta.StopReason != "" {
			d.stop = stopReason(ev.Delta.StopReason)
		}
	case "message_stop":
		d.finished = true
	}
	return true, nil
}

func (d *decoder) start(ev anthropic.MessageStreamEventUnion, emit func(llm.Chunk) bool) bool {
	cb := ev.ContentBlock
	b := &block{}
	d.blocks[ev.Index] = b
	switch cb.Type {
	case "text":
		b.kind = blockText
		if cb.Text != "" {
			return emit(llm.Chunk{Kind: llm.ChunkText, Text: cb.Text})
		}
	case "thinking":
		b.kind, b.index = blockThinking, d.thinking
		d.thinking++
		if cb.Thinking != "" || cb.Signature != "" {
			return emit(llm.Chunk{Kind: llm.ChunkThinking, Index: b.index, Text: cb.Thinking, Signature: cb.Signature})
		}
	case "tool_use":
		b.kind, b.index, b.name = blockTool, d.toolCalls, cb.Name
		d.toolCalls++
		if !emit(llm.Chunk{Kind: llm.ChunkToolCallStart, Index: b.index, CallID: cb.ID, Name: cb.Name}) {
			return false
		}
		// The input arrives in deltas; a start that already carries a
		// non-empty input (some proxies) is passed on whole.
		if raw := cb.JSON.Input.Raw(); raw != "" && raw != "{}" && raw != "null" {
			b.args.WriteString(raw)
			return emit(llm.Chunk{Kind: llm.ChunkToolCallArgs, Index: b.index, Text: raw})
		}
	}
	return true
}

func (d *decoder) delta(ev anthropic.MessageStreamEventUnion, emit func(llm.Chunk) bool) bool {
	b, ok := d.blocks[ev.Index]
	if !ok || b.closed {
		return true
	}
	delta := ev.Delta
	switch delta.Type {
	case "text_delta":
		if delta.Text != "" {
			return emit(llm.Chunk{Kind: llm.ChunkText, Text: delta.Text})
		}
	case "thinking_delta":
		if b.kind == blockThinking && delta.Thinking != "" {
			return emit(llm.Chunk{Kind: llm.ChunkThinking, Index: b.index, Text: delta.Thinking})
		}
	case "signature_delta":
		if b.kind == blockThinking && delta.Signature != "" {
			return emit(llm.Chunk{Kind: llm.ChunkThinking, Index: b.index, Signature: delta.Signature})
		}
	case "input_json_delta":
		if b.kind == blockTool && delta.PartialJSON != "" {
			b.args.WriteString(delta.PartialJSON)
			return emit(llm.Chunk{Kind: llm.ChunkToolCallArgs, Index: b.index, Text: delta.PartialJSON})
		}
	}
	return true
}

// stopBlock closes a tool call, checking its arguments; a call with no
// arguments gets "{}".
func (d *decoder) stopBlock(index int64, emit func(llm.Chunk) bool) (bool, *llm.Error) {
	b, ok := d.blocks[index]
	if !ok || b.closed || b.kind != blockTool {
		return true, nil
	}
	b.closed = true
	if len(bytes.TrimSpace(b.args.Bytes())) == 0 {
		b.args.WriteString("{}")
		if !emit(llm.Chunk{Kind: llm.ChunkToolCallArgs, Index: b.index, Text: "{}"}) {
			return false, nil
		}
	}
	var obj map[string]json.RawMessage
	err := json.Unmarshal(b.args.Bytes(), &obj)
	if err == nil && obj == nil {
		err = errors.New("null is not an object")
	}
	if err != nil {
		return false, httpfail.BadArguments(d.provider, b.name, err)
	}
	return emit(llm.Chunk{Kind: llm.ChunkToolCallEnd, Index: b.index}), nil
}

// stopReason maps a stop_reason.
func stopReason(r anthropic.StopReason) llm.StopReason {
	switch r {
	case "end_turn":
		return llm.StopEndTurn
	case "tool_use":
		return llm.StopToolUse
	case "max_tokens":
		return llm.StopMaxTokens
	case "stop_sequence":
		return llm.StopSequence
	case "refusal":
		return llm.StopRefusal
	case "pause_turn":
		return llm.StopPauseTurn
	}
	return llm.StopUnspecified
}

// consume turns the SDK's event stream into chunks. resp is the HTTP
// response, nil when none arrived.
func (p *Provider) consume(ctx context.Context, s *ssestream.Stream[anthropic.MessageStreamEventUnion], resp *http.Response, yield func(llm.Chunk, error) bool) {
	stream.Consume(ctx, p.name, stream.SSE(s, resp, &decoder{provider: p.name}, p.classify), yield)
}
