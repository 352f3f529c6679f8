package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"iter"
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
	// model is the model every chunk names, id the completion's id; the
	// first of each is kept.
	model, id string
}

// Finish reports the stop reason and whether a finish reason arrived.
func (d *decoder) Finish() (llm.StopReason, bool) { return d.stop, d.finished }

// Model returns the model the chunks named.
func (d *decoder) Model() string { return d.model }

// ResponseID returns the completion id the chunks named.
func (d *decoder) ResponseID() string { return d.id }

type toolCall struct {
	id, name string
	args     bytes.Buffer
	closed   bool
}

// chunk is what the decoder reads of one chat.completion.chunk event,
// whether the SDK decoded it ([viewOf]) or the fast path did
// ([parseChunk]).
type chunk struct {
	// model is the model the event names. The fast path reads it until
	// one event has named it, and keeps it across events: the decoder
	// keeps the first.
	model string
	// id is the completion's id, read as model is.
	id      string
	choices []choice
	// hasUsage reports a usage object (the SDK's JSON.Usage.Valid).
	hasUsage bool
	usage    llm.Usage
}

type choice struct {
	index                       int64
	content, refusal, reasoning string
	toolCalls                   []toolCallDelta
	finishReason                string
}

type toolCallDelta struct {
	index               int64
	id, name, arguments string
}

// viewOf returns what the decoder reads of a chunk the SDK decoded.
func viewOf(c openai.ChatCompletionChunk) *chunk {
	v := &chunk{model: c.Model, id: c.ID, choices: make([]choice, len(c.Choices))}
	for i, ch := range c.Choices {
		v.choices[i] = choice{
			index: ch.Index, content: ch.Delta.Content, refusal: ch.Delta.Refusal,
			reasoning: reasoning(ch.Delta), finishReason: ch.FinishReason,
		}
		for _, tc := range ch.Delta.ToolCalls {
			v.choices[i].toolCalls = append(v.choices[i].toolCalls, toolCallDelta{
				index: tc.Index, id: tc.ID, name: tc.Function.Name, arguments: tc.Function.Arguments,
			})
		}
	}
	if c.JSON.Usage.Valid() {
		v.hasUsage = true
		v.usage = usageOf(c.Usage.PromptTokens, c.Usage.CompletionTokens,
			c.Usage.PromptTokensDetails.CachedTokens, c.Usage.PromptTokensDetails.CacheWriteTokens)
	}
	return v
}

// usageOf maps OpenAI's counts: input tokens exclude the cached ones.
func usageOf(prompt, completion, cached, cacheWrite int64) llm.Usage {
	return llm.Usage{
		InputTokens:      max(prompt-cached, 0),
		OutputTokens:     completion,
		CacheReadTokens:  cached,
		CacheWriteTokens: cacheWrite,
	}
}

// Decode yields the runtime chunks of one stream chunk through emit. It
// returns false when emit did, and an error for a tool call whose
// arguments are not a JSON object.
func (d *decoder) Decode(c *chunk, emit func(llm.Chunk) bool) (bool, *llm.Error) {
	if d.model == "" {
		d.model = c.model
	}
	if d.id == "" {
		d.id = c.id
	}
	for i := range c.choices {
		choice := &c.choices[i]
		if choice.index != 0 {
			continue // only one choice is asked for
		}
		if r := choice.reasoning; r != "" {
			if !emit(llm.Chunk{Kind: llm.ChunkThinking, Text: r}) {
				return false, nil
			}
		}
		if choice.refusal != "" {
			d.refused = true
		}
		for _, text := range [2]string{choice.content, choice.refusal} {
			if text != "" && !emit(llm.Chunk{Kind: llm.ChunkText, Text: text}) {
				return false, nil
			}
		}
		for _, tc := range choice.toolCalls {
			if !d.toolDelta(tc, emit) {
				return false, nil
			}
		}
		if choice.finishReason != "" && !d.finished {
			d.finished = true
			d.stop = stopReason(choice.finishReason, len(d.calls) > 0)
			if d.refused {
				d.stop = llm.StopRefusal
			}
			if ok, err := d.closeCalls(emit); !ok || err != nil {
				return ok, err
			}
		}
	}
	if c.hasUsage {
		if !emit(llm.Chunk{Kind: llm.ChunkUsage, Usage: c.usage}) {
			return false, nil
		}
	}
	return true, nil
}

// toolDelta opens a tool call on its first fragment and passes on its
// argument fragments. A fragment with a new id at a known index opens a
// new call, for servers that reuse index 0.
func (d *decoder) toolDelta(tc toolCallDelta, emit func(llm.Chunk) bool) bool {
	if d.byIndex == nil {
		d.byIndex = map[int64]int{}
	}
	pos, seen := d.byIndex[tc.index]
	if !seen || (tc.id != "" && d.calls[pos].id != "" && tc.id != d.calls[pos].id) {
		pos = len(d.calls)
		d.byIndex[tc.index] = pos
		d.calls = append(d.calls, &toolCall{id: tc.id, name: tc.name})
		if !emit(llm.Chunk{Kind: llm.ChunkToolCallStart, Index: pos, CallID: tc.id, Name: tc.name}) {
			return false
		}
	}
	call := d.calls[pos]
	if frag := tc.arguments; frag != "" && !call.closed {
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

// consume turns the SDK's stream into chunks, decoding every event with
// the SDK. resp is the HTTP response, nil when none arrived.
func (p *Provider) consume(ctx context.Context, s *ssestream.Stream[openai.ChatCompletionChunk], resp *http.Response, yield func(llm.Chunk, error) bool) {
	events := func(yield func(*chunk, error) bool) {
		for c, err := range stream.Events(s) {
			if err != nil {
				yield(nil, err)
				return
			}
			if !yield(viewOf(c), nil) {
				return
			}
		}
	}
	stream.Consume(ctx, p.name, p.call(events, resp), yield)
}

// call returns the stream.Call of a reply whose events are events and
// whose HTTP response is resp.
func (p *Provider) call(events iter.Seq2[*chunk, error], resp *http.Response) stream.Call[*chunk] {
	return stream.Call[*chunk]{
		Events:   events,
		Decoder:  &decoder{provider: p.name},
		Classify: func(err error) *llm.Error { return p.classify(err, resp) },
		Response: func() (int, string) {
			code, h := httpfail.Response(resp)
			return code, httpfail.RequestID(h)
		},
	}
}
