package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/httpfail"
	"github.com/turnstile-dev/turnstile/providers/internal/stream"
)

// decoder holds the state of one streamed reply: it is the
// stream.Decoder of a chat completion stream.
type decoder struct {
	provider string
	// calls are the reply's tool calls in order; byIndex maps the wire's
	// tool call index to a position in calls.
	calls    []*toolCall
	byIndex  map[int64]int
	refused  bool
	finished bool
	stop     llm.StopReason
	// model is the model every chunk names; the first one is kept.
	model string
}

// Finish reports the stop reason and whether a finish reason arrived.
func (d *decoder) Finish() (llm.StopReason, bool) { return d.stop, d.finished }

// Model returns the model the chunks named.
func (d *decoder) Model() string { return d.model }

type toolCall struct {
	id, name string
	args     bytes.Buffer
	closed   bool
}

// Decode yields the runtime chunks of one stream chunk through emit. It
// returns false when emit did, and an error for a tool call whose
// arguments are not a JSON object.
func (d *decoder) Decode(c openai.ChatCompletionChunk, emit func(llm.Chunk) bool) (bool, *llm.Error) {
	if d.model == "" {
		d.model = c.Model
	}
	for _, choice := range c.Choices {
		if choice.Index != 0 {
			continue // only one choice is asked for
		}
		delta := choice.Delta
		if r := reasoning(delta); r != "" {
			if !emit(llm.Chunk{Kind: llm.ChunkThinking, Text: r}) {
				return false, nil
			}
		}
		if delta.Refusal != "" {
			d.refused = true
		}
		for _, text := range []string{delta.Content, delta.Refusal} {
			if text != "" && !emit(llm.Chunk{Kind: llm.ChunkText, Text: text}) {
				return false, nil
			}
		}
		for _, tc := range delta.ToolCalls {
			if !d.toolDelta(tc, emit) {
				return false, nil
			}
		}
		if choice.FinishReason != "" && !d.finished {
			d.finished = true
			d.stop = stopReason(choice.FinishReason, len(d.calls) > 0)
			if d.refused {
				d.stop = llm.StopRefusal
			}
			if ok, err := d.closeCalls(emit); !ok || err != nil {
				return ok, err
			}
		}
	}
	if c.JSON.Usage.Valid() {
		u := c.Usage
		cached := u.PromptTokensDetails.CachedTokens
		usage := llm.Usage{
			InputTokens:      max(u.PromptTokens-cached, 0),
			OutputTokens:     u.CompletionTokens,
			CacheReadTokens:  cached,
			CacheWriteTokens: u.PromptTokensDetails.CacheWriteTokens,
		}
		if !emit(llm.Chunk{Kind: llm.ChunkUsage, Usage: usage}) {
			return false, nil
		}
	}
	return true, nil
}

// toolDelta opens a tool call on its first fragment and passes on its
// argument fragments. A fragment with a new id at a known index opens a
// new call, for servers that reuse index 0.
func (d *decoder) toolDelta(tc openai.ChatCompletionChunkChoiceDeltaToolCall, emit func(llm.Chunk) bool) bool {
	if d.byIndex == nil {
		d.byIndex = map[int64]int{}
	}
	pos, seen := d.byIndex[tc.Index]
	if !seen || (tc.ID != "" && d.calls[pos].id != "" && tc.ID != d.calls[pos].id) {
		pos = len(d.calls)
		d.byIndex[tc.Index] = pos
		d.calls = append(d.calls, &toolCall{id: tc.ID, name: tc.Function.Name})
		if !emit(llm.Chunk{Kind: llm.ChunkToolCallStart, Index: pos, CallID: tc.ID, Name: tc.Function.Name}) {
			return false
		}
	}
	call := d.calls[pos]
	if frag := tc.Function.Arguments; frag != "" && !call.closed {
		call.args.WriteString(frag)
		return emit(llm.Chunk{Kind: llm.ChunkToolCallArgs, Index: pos, Text: frag})
	}
	return true
}

// closeCalls ends every open tool call, checking its arguments. A call
// with no arguments at all gets "{}", as tools without parameters do on
// some servers.
func (d *decoder) closeCalls(emit func(llm.Chunk) bool) (bool, *llm.Error) {
	for i, call := range d.calls {
		if call.closed {
			continue
		}
		call.closed = true
		if len(bytes.TrimSpace(call.args.Bytes())) == 0 {
			call.args.WriteString("{}")
			if !emit(llm.Chunk{Kind: llm.ChunkToolCallArgs, Index: i, Text: "{}"}) {
				return false, nil
			}
		}
		if err := jsonObject(call.args.Bytes()); err != nil {
			return false, httpfail.BadArguments(d.provider, call.name, err)
		}
		if !emit(llm.Chunk{Kind: llm.ChunkToolCallEnd, Index: i}) {
			return false, nil
		}
	}
	return true, nil
}

// jsonObject reports whether b is one JSON object.
func jsonObject(b []byte) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		return err
	}
	if obj == nil {
		return errors.New("null is not an object")
	}
	return nil
}

// reasoning returns the reasoning text compatible servers add to a delta:
// reasoning_content (vLLM, DeepSeek, llama.cpp) or reasoning (OpenRouter,
// Ollama).
func reasoning(delta openai.ChatCompletionChunkChoiceDelta) string {
	for _, key := range []string{"reasoning_content", "reasoning"} {
		// The SDK keeps unknown fields raw, marked invalid.
		f, ok := delta.JSON.ExtraFields[key]
		if !ok || f.Raw() == "" {
			continue
		}
		var s string
		if json.Unmarshal([]byte(f.Raw()), &s) == nil && s != "" {
			return s
		}
	}
	return ""
}

// stopReason maps a finish_reason. Some compatible servers say "stop"
// after tool calls; the calls decide.
func stopReason(reason string, calls bool) llm.StopReason {
	switch reason {
	case "tool_calls", "function_call":
		return llm.StopToolUse
	case "length":
		return llm.StopMaxTokens
	case "content_filter":
		return llm.StopRefusal
	case "stop":
		if calls {
			return llm.StopToolUse
		}
		return llm.StopEndTurn
	}
	if calls {
		return llm.StopToolUse
	}
	return llm.StopUnspecified
}

// consume turns the SDK's stream into chunks. resp is the HTTP response,
// nil when none arrived.
func (p *Provider) consume(ctx context.Context, s *ssestream.Stream[openai.ChatCompletionChunk], resp *http.Response, yield func(llm.Chunk, error) bool) {
	stream.Consume(ctx, p.name, stream.SSE(s, resp, &decoder{provider: p.name}, p.classify), yield)
}
