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
	// model and id are the model and the message id message_start named.
	model, id string
}

// Finish reports the stop reason and whether message_stop arrived.
func (d *decoder) Finish() (llm.StopReason, bool) { return d.stop, d.finished }

// Model returns the model message_start named.
func (d *decoder) Model() string { return d.model }

// ResponseID returns the message id message_start named.
func (d *decoder) ResponseID() string { return d.id }

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

// event is what the decoder reads of one stream event, whether the SDK
// decoded it ([viewOf]) or the fast path did ([parseEvent]).
type event struct {
	typ   string
	index int64
	// model, id and startUsage are message_start's message.model,
	// message.id and message.usage.
	model, id  string
	startUsage llm.Usage
	block      blockStart
	delta      delta
	// usage is message_delta's usage; usageSet has a bit (usageInput, …)
	// for each field it holds (the SDK's JSON.X.Valid).
	usage    llm.Usage
	usageSet uint8
}

// blockStart is what the decoder reads of content_block_start's
// content_block; input is the raw JSON of its input (JSON.Input.Raw).
type blockStart struct {
	typ, text, thinking, signature, id, name, input string
}

// delta is what the decoder reads of content_block_delta's and
// message_delta's delta.
type delta struct {
	typ, text, thinking, signature, partialJSON, stopReason string
}

// The bits of event.usageSet.
const (
	usageInput uint8 = 1 << iota
	usageOutput
	usageCacheRead
	usageCacheWrite
)

// viewOf returns what the decoder reads of an event the SDK decoded.
func viewOf(ev *anthropic.MessageStreamEventUnion) *event {
	su, cb, d, u := ev.Message.Usage, ev.ContentBlock, ev.Delta, ev.Usage
	v := &event{
		typ: ev.Type, index: ev.Index, model: ev.Message.Model, id: ev.Message.ID,
		startUsage: llm.Usage{
			InputTokens:      su.InputTokens,
			OutputTokens:     su.OutputTokens,
			CacheReadTokens:  su.CacheReadInputTokens,
			CacheWriteTokens: su.CacheCreationInputTokens,
		},
		block: blockStart{typ: cb.Type, text: cb.Text, thinking: cb.Thinking, signature: cb.Signature,
			id: cb.ID, name: cb.Name, input: cb.JSON.Input.Raw()},
		delta: delta{typ: d.Type, text: d.Text, thinking: d.Thinking, signature: d.Signature,
			partialJSON: d.PartialJSON, stopReason: string(d.StopReason)},
		usage: llm.Usage{
			InputTokens:      u.InputTokens,
			OutputTokens:     u.OutputTokens,
			CacheReadTokens:  u.CacheReadInputTokens,
			CacheWriteTokens: u.CacheCreationInputTokens,
		},
	}
	for _, f := range []struct {
		bit   uint8
		valid bool
	}{
		{usageInput, u.JSON.InputTokens.Valid()}, {usageOutput, u.JSON.OutputTokens.Valid()},
		{usageCacheRead, u.JSON.CacheReadInputTokens.Valid()}, {usageCacheWrite, u.JSON.CacheCreationInputTokens.Valid()},
	} {
		if f.valid {
			v.usageSet |= f.bit
		}
	}
	return v
}

// Decode yields the runtime chunks of one stream event through emit. It
// returns false when emit did, and an error for a tool call whose
// arguments are not a JSON object or a reply that overflowed the context.
func (d *decoder) Decode(ev *event, emit func(llm.Chunk) bool) (bool, *llm.Error) {
	if d.blocks == nil {
		d.blocks = map[int64]*block{}
	}
	switch ev.typ {
	case "message_start":
		d.model, d.id = ev.model, ev.id
		d.usage = ev.startUsage
		return emit(llm.Chunk{Kind: llm.ChunkUsage, Usage: d.usage}), nil
	case "content_block_start":
		return d.start(ev, emit), nil
	case "content_block_delta":
		return d.blockDelta(ev, emit), nil
	case "content_block_stop":
		return d.stopBlock(ev.index, emit)
	case "message_delta":
		// message_delta's usage is cumulative; fields it leaves out keep
		// message_start's values.
		u := ev.usage
		if ev.usageSet&usageInput != 0 {
			d.usage.InputTokens = u.InputTokens
		}
		if ev.usageSet&usageOutput != 0 {
			d.usage.OutputTokens = u.OutputTokens
		}
		if ev.usageSet&usageCacheRead != 0 {
			d.usage.CacheReadTokens = u.CacheReadTokens
		}
		if ev.usageSet&usageCacheWrite != 0 {
			d.usage.CacheWriteTokens = u.CacheWriteTokens
		}
		if !emit(llm.Chunk{Kind: llm.ChunkUsage, Usage: d.usage}) {
			return false, nil
		}
		if ev.delta.stopReason == "model_context_window_exceeded" {
			return false, &llm.Error{
				Kind:     llm.KindContextOverflow,
				Message:  "the reply reached the model's context window (model_context_window_exceeded)",
				Provider: d.provider,
				Err:      errors.New("stop_reason: model_context_window_exceeded"),
			}
		}
		if ev.delta.stopReason != "" {
			d.stop = stopReason(anthropic.StopReason(ev.delta.stopReason))
		}
	case "message_stop":
		d.finished = true
	}
	return true, nil
}

func (d *decoder) start(ev *event, emit func(llm.Chunk) bool) bool {
	cb := &ev.block
	b := &block{}
	d.blocks[ev.index] = b
	switch cb.typ {
	case "text":
		b.kind = blockText
		if cb.text != "" {
			return emit(llm.Chunk{Kind: llm.ChunkText, Text: cb.text})
		}
	case "thinking":
		b.kind, b.index = blockThinking, d.thinking
		d.thinking++
		if cb.thinking != "" || cb.signature != "" {
			return emit(llm.Chunk{Kind: llm.ChunkThinking, Index: b.index, Text: cb.thinking, Signature: cb.signature})
		}
	case "tool_use":
		b.kind, b.index, b.name = blockTool, d.toolCalls, cb.name
		d.toolCalls++
		if !emit(llm.Chunk{Kind: llm.ChunkToolCallStart, Index: b.index, CallID: cb.id, Name: cb.name}) {
			return false
		}
		// The input arrives in deltas; a start that already carries a
		// non-empty input (some proxies) is passed on whole.
		if raw := cb.input; raw != "" && raw != "{}" && raw != "null" {
			b.args.WriteString(raw)
			return emit(llm.Chunk{Kind: llm.ChunkToolCallArgs, Index: b.index, Text: raw})
		}
	}
	return true
}

func (d *decoder) blockDelta(ev *event, emit func(llm.Chunk) bool) bool {
	b, ok := d.blocks[ev.index]
	if !ok || b.closed {
		return true
	}
	delta := &ev.delta
	switch delta.typ {
	case "text_delta":
		if delta.text != "" {
			return emit(llm.Chunk{Kind: llm.ChunkText, Text: delta.text})
		}
	case "thinking_delta":
		if b.kind == blockThinking && delta.thinking != "" {
			return emit(llm.Chunk{Kind: llm.ChunkThinking, Index: b.index, Text: delta.thinking})
		}
	case "signature_delta":
		if b.kind == blockThinking && delta.signature != "" {
			return emit(llm.Chunk{Kind: llm.ChunkThinking, Index: b.index, Signature: delta.signature})
		}
	case "input_json_delta":
		if b.kind == blockTool && delta.partialJSON != "" {
			b.args.WriteString(delta.partialJSON)
			return emit(llm.Chunk{Kind: llm.ChunkToolCallArgs, Index: b.index, Text: delta.partialJSON})
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
	stream.Consume(ctx, p.name, stream.SSE[*event](sdkEvents{s}, resp, &decoder{provider: p.name}, p.classify), yield)
}

// sdkEvents reads the SDK's stream as the decoder's events.
type sdkEvents struct {
	*ssestream.Stream[anthropic.MessageStreamEventUnion]
}

// Current returns the view of the SDK's current event.
func (s sdkEvents) Current() *event {
	ev := s.Stream.Current()
	return viewOf(&ev)
}
