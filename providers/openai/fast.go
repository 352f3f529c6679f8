package openai

import (
	"bytes"
	"context"
	"net/http"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/jsonscan"
	"github.com/turnstile-dev/turnstile/providers/internal/stream"
)

// The SDK stays the source of truth: it decides the request (direct.go
// sends exactly its bytes and headers), and reads and classifies every
// answer that is not a stream. Only the events
// of a successful stream are read here, and only those of the shape
// OpenAI and the compatible servers send; any other event is handed to
// the SDK's own decoding (see [sdkEvent]), so both paths yield the same
// chunks and errors for every body (fast_test.go proves it over the
// fixtures and a fuzz corpus). Decoding through the SDK costs a JSON
// validation, a gjson scan and a reflective decode per event: most of a
// short turn's CPU time.

// drainWait bounds the wait for the end of a body after [DONE].
const drainWait = 20 * time.Millisecond

// streamChunks reads a streamed reply: with the fast path when the SDK
// answered with a stream, else through the SDK.
func (p *Provider) streamChunks(ctx context.Context, s *ssestream.Stream[openai.ChatCompletionChunk], resp *http.Response, yield func(llm.Chunk, error) bool) {
	if s.Err() != nil || resp == nil || resp.Body == nil {
		p.consume(ctx, s, resp, yield)
		return
	}
	p.consumeFast(ctx, resp, yield)
}

// consumeFast reads resp's event stream, which the SDK accepted, and
// yields its chunks. It leaves the body to be closed by the caller.
func (p *Provider) consumeFast(ctx context.Context, resp *http.Response, yield func(llm.Chunk, error) bool) {
	r := stream.NewEventReader(resp.Body, false)
	defer r.Release()
	done := false
	events := func(yield func(*chunk, error) bool) {
		var c chunk
		for r.Next() {
			data := r.Data()
			if bytes.HasPrefix(data, []byte("[DONE]")) {
				done = true
				return
			}
			if !bytes.HasPrefix(r.Type(), []byte("thread.")) && parseChunk(data, &c) {
				if !yield(&c, nil) {
					return
				}
				continue
			}
			v, end, err := sdkEvent(r.Type(), data)
			switch {
			case err != nil:
				yield(nil, err)
				return
			case end:
				done = true
				return
			}
			if !yield(v, nil) {
				return
			}
		}
		if err := r.Err(); err != nil {
			yield(nil, err)
		}
	}
	stream.Consume(ctx, p.name, p.call(events, resp), yield)
	if done {
		stream.Drain(resp.Body, drainWait)
	}
}

// sdkEvent decodes one event with the SDK's stream, exactly as it does
// for every event it reads itself: end reports [DONE], err an error event
// or an event it could not decode.
func sdkEvent(typ, data []byte) (c *chunk, end bool, err error) {
	s := ssestream.NewStream[openai.ChatCompletionChunk](&oneEvent{ev: ssestream.Event{Type: string(typ), Data: bytes.Clone(data)}}, nil)
	if s.Next() {
		return viewOf(s.Current()), false, nil
	}
	if err := s.Err(); err != nil {
		return nil, false, err
	}
	return nil, true, nil
}

// oneEvent is an ssestream.Decoder of one event.
type oneEvent struct {
	ev   ssestream.Event
	read bool
}

func (o *oneEvent) Next() bool {
	if o.read {
		return false
	}
	o.read = true
	return true
}

func (o *oneEvent) Event() ssestream.Event { return o.ev }
func (o *oneEvent) Close() error           { return nil }
func (o *oneEvent) Err() error             { return nil }

// parseChunk reads a chat.completion.chunk event into c, reusing c's
// slices. It reports false for anything but the plain shape — a JSON
// object without an "error" key whose fields the decoder reads have the
// documented types — and the event then goes to the SDK.
func parseChunk(data []byte, c *chunk) bool {
	s := jsonscan.New(data)
	c.choices, c.hasUsage, c.usage = c.choices[:0], false, llm.Usage{}
	var seen jsonscan.Keys
	once := seen.Once
	ok := s.Object(func(key []byte) bool {
		switch string(key) {
		case "error":
			return false // an error event: the SDK's
		case "model":
			if !once(4) {
				return false
			}
			if c.model != "" {
				return s.Skip() // named by an earlier event
			}
			return s.StringOrNull(&c.model)
		case "id":
			if !once(8) {
				return false
			}
			if c.id != "" {
				return s.Skip() // named by an earlier event
			}
			return s.StringOrNull(&c.id)
		case "choices":
			if !once(1) {
				return false
			}
			if s.Null() {
				return true
			}
			return s.Array(func() bool {
				c.choices = append(c.choices, choice{})
				return parseChoice(&s, &c.choices[len(c.choices)-1])
			})
		case "usage":
			if !once(2) {
				return false
			}
			if s.Null() {
				return true
			}
			c.hasUsage = true
			return parseUsage(&s, &c.usage)
		}
		return s.Skip()
	})
	return ok && s.End()
}

func parseChoice(s *jsonscan.Scanner, ch *choice) bool {
	if s.Null() {
		return true
	}
	var seen jsonscan.Keys
	once := seen.Once
	return s.Object(func(key []byte) bool {
		switch string(key) {
		case "index":
			return once(1) && (s.Null() || intInto(s, &ch.index))
		case "finish_reason":
			return once(2) && s.StringOrNull(&ch.finishReason)
		case "delta":
			if !once(4) {
				return false
			}
			if s.Null() {
				return true
			}
			return parseDelta(s, ch)
		}
		return s.Skip()
	})
}

func parseDelta(s *jsonscan.Scanner, ch *choice) bool {
	var seen jsonscan.Keys
	once := seen.Once
	var reasoningContent, reasoning string
	ok := s.Object(func(key []byte) bool {
		switch string(key) {
		case "content":
			return once(1) && s.StringOrNull(&ch.content)
		case "refusal":
			return once(2) && s.StringOrNull(&ch.refusal)
		case "reasoning_content":
			return once(4) && s.StringOrNull(&reasoningContent)
		case "reasoning":
			return once(8) && s.StringOrNull(&reasoning)
		case "tool_calls":
			if !once(16) {
				return false
			}
			if s.Null() {
				return true
			}
			return s.Array(func() bool {
				var tc toolCallDelta
				if !parseToolCall(s, &tc) {
					return false
				}
				ch.toolCalls = append(ch.toolCalls, tc)
				return true
			})
		}
		return s.Skip()
	})
	// As [reasoning] reads them: reasoning_content first.
	ch.reasoning = reasoningContent
	if ch.reasoning == "" {
		ch.reasoning = reasoning
	}
	return ok
}

func parseToolCall(s *jsonscan.Scanner, tc *toolCallDelta) bool {
	if s.Null() {
		return true
	}
	var seen jsonscan.Keys
	once := seen.Once
	return s.Object(func(key []byte) bool {
		switch string(key) {
		case "index":
			return once(1) && (s.Null() || intInto(s, &tc.index))
		case "id":
			return once(2) && s.StringOrNull(&tc.id)
		case "function":
			if !once(4) {
				return false
			}
			if s.Null() {
				return true
			}
			var fseen jsonscan.Keys
			return s.Object(func(key []byte) bool {
				switch string(key) {
				case "name":
					return fseen.Once(1) && s.StringOrNull(&tc.name)
				case "arguments":
					return fseen.Once(2) && s.StringOrNull(&tc.arguments)
				}
				return s.Skip()
			})
		}
		return s.Skip()
	})
}

func parseUsage(s *jsonscan.Scanner, u *llm.Usage) bool {
	var prompt, completion, cached, cacheWrite int64
	var seen jsonscan.Keys
	once := seen.Once
	ok := s.Object(func(key []byte) bool {
		switch string(key) {
		case "prompt_tokens":
			return once(1) && (s.Null() || intInto(s, &prompt))
		case "completion_tokens":
			return once(2) && (s.Null() || intInto(s, &completion))
		case "prompt_tokens_details":
			if !once(4) {
				return false
			}
			if s.Null() {
				return true
			}
			var dseen uint8
			return s.Object(func(key []byte) bool {
				switch string(key) {
				case "cached_tokens":
					if dseen&1 != 0 {
						return false
					}
					dseen |= 1
					return s.Null() || intInto(s, &cached)
				case "cache_write_tokens":
					if dseen&2 != 0 {
						return false
					}
					dseen |= 2
					return s.Null() || intInto(s, &cacheWrite)
				}
				return s.Skip()
			})
		}
		return s.Skip()
	})
	*u = usageOf(prompt, completion, cached, cacheWrite)
	return ok
}

func intInto(s *jsonscan.Scanner, dst *int64) bool {
	v, ok := s.Int()
	*dst = v
	return ok
}
