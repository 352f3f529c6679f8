package anthropic

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"slices"

	"github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/packages/ssestream"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/httpfail"
	"github.com/turnstile-dev/turnstile/providers/internal/jsonscan"
	"github.com/turnstile-dev/turnstile/providers/internal/stream"
)

// The SDK stays the source of truth: it builds and sends the request, and
// reads and classifies every answer that is not a stream. Only the events
// of a successful stream are read here, and only those of the shape the
// Messages API sends; any other event — an error event, or one whose JSON
// is not of the plain shape — is handed to the SDK's own decoding (see
// [sdkEvent]), so both paths yield the same chunks and errors for every
// body (fast_test.go proves it over the fixtures and a fuzz corpus).
// Decoding through the SDK costs a JSON validation and a reflective
// decode of the whole event union per event.

// streamEvents reads a streamed reply: with the fast path when the SDK
// answered with a stream whose body it does not trace, else through the
// SDK.
func (p *Provider) streamEvents(ctx context.Context, s *ssestream.Stream[anthropic.MessageStreamEventUnion], resp *http.Response, yield func(llm.Chunk, error) bool) {
	if s.Err() != nil || resp == nil || resp.Body == nil || traced(resp.Body) {
		p.consume(ctx, s, resp, yield)
		return
	}
	p.consumeFast(ctx, resp, yield)
}

// traced reports a body the SDK's own OpenTelemetry spans follow (when a
// recording tracer provider is installed): their span follows the events
// the SDK decodes, so such a body is left to the SDK.
func traced(body io.ReadCloser) bool {
	_, ok := body.(interface {
		Unwrap() io.ReadCloser
		TraceEvents(ssestream.Decoder) ssestream.Decoder
	})
	return ok
}

// consumeFast reads resp's event stream, which the SDK accepted, and
// yields its chunks. It leaves the body to be closed by the caller.
func (p *Provider) consumeFast(ctx context.Context, resp *http.Response, yield func(llm.Chunk, error) bool) {
	r := stream.NewEventReader(resp.Body, true)
	defer r.Release()
	events := func(yield func(*event, error) bool) {
		var ev event
		for r.Next() {
			typ, data := r.Type(), r.Data()
			// The SDK's Stream skips these before decoding anything,
			// and makes an error event its error.
			switch {
			case len(typ) == 0 || string(typ) == "ping":
				continue
			case string(typ) != "error" && len(bytes.TrimSuffix(data, []byte("\n"))) == 0:
				continue
			}
			if string(typ) != "error" && parseEvent(data, &ev) {
				if !yield(&ev, nil) {
					return
				}
				continue
			}
			v, err := sdkEvent(resp, typ, data)
			switch {
			case err != nil:
				yield(nil, err)
				return
			case v == nil:
				continue
			}
			if !yield(v, nil) {
				return
			}
		}
		if err := r.Err(); err != nil {
			yield(nil, err)
		}
	}
	stream.Consume(ctx, p.name, stream.Call[*event]{
		Events:   events,
		Decoder:  &decoder{provider: p.name},
		Classify: func(err error) *llm.Error { return p.classify(err, resp) },
		Response: func() (int, string) {
			code, h := httpfail.Response(resp)
			return code, httpfail.RequestID(h)
		},
	}, yield)
}

// sdkEvent decodes one event with the SDK, exactly as its stream does
// for every event it reads itself from resp's body (an error event
// becomes the SDK's error, with resp's status and headers). v is nil
// when the SDK skips the event.
func sdkEvent(resp *http.Response, typ, data []byte) (v *event, err error) {
	one := *resp
	one.Body = io.NopCloser(bytes.NewReader(eventText(typ, data)))
	s := ssestream.NewStream[anthropic.MessageStreamEventUnion](ssestream.NewDecoder(&one), nil)
	if s.Next() {
		ev := s.Current()
		return viewOf(&ev), nil
	}
	return nil, s.Err()
}

// eventText writes an event back as the text/event-stream lines it was
// read from: its type, then each line of its data.
func eventText(typ, data []byte) []byte {
	var b bytes.Buffer
	if len(typ) > 0 {
		b.WriteString("event: ")
		b.Write(typ)
		b.WriteByte('\n')
	}
	for line := range bytes.Lines(data) {
		b.WriteString("data: ")
		b.Write(line)
	}
	b.WriteByte('\n')
	return b.Bytes()
}

// parseEvent reads a stream event's data into ev. It reports false for
// anything but the plain shape — a JSON object whose "type" is one of the
// Messages API's events and whose fields the decoder reads have their
// documented types, none repeated — and the event then goes to the SDK.
func parseEvent(data []byte, ev *event) bool {
	*ev = event{}
	s := jsonscan.New(data)
	var seen jsonscan.Keys
	ok := s.Object(func(key []byte) bool {
		switch string(key) {
		case "type":
			return seen.Once(1) && enumInto(&s, &ev.typ, eventTypes)
		case "index":
			return seen.Once(2) && s.IntOrNull(&ev.index)
		case "message":
			return seen.Once(4) && s.Peek() == '{' && parseMessage(&s, ev)
		case "content_block":
			return seen.Once(8) && s.Peek() == '{' && parseBlock(&s, &ev.block)
		case "delta":
			return seen.Once(16) && s.Peek() == '{' && parseDelta(&s, &ev.delta)
		case "usage":
			return seen.Once(32) && s.Peek() == '{' && parseUsage(&s, &ev.usage, &ev.usageSet)
		}
		return s.Skip()
	})
	if !ok || !s.End() {
		return false
	}
	return slices.Contains(eventTypes, ev.typ)
}

// The values of the fields enumInto reads: the events of the Messages
// API, its content blocks, deltas and stop reasons.
var (
	eventTypes  = []string{"content_block_delta", "message_start", "content_block_start", "content_block_stop", "message_delta", "message_stop"}
	blockTypes  = []string{"text", "thinking", "tool_use"}
	deltaTypes  = []string{"text_delta", "thinking_delta", "signature_delta", "input_json_delta"}
	stopReasons = []string{"end_turn", "tool_use", "max_tokens", "stop_sequence", "refusal", "pause_turn"}
)

// enumInto is [stringInto] for a field whose value is usually one of
// known: such a value, written without escapes, is not copied.
func enumInto(s *jsonscan.Scanner, dst *string, known []string) bool {
	raw, ok := s.Raw()
	if !ok {
		return false
	}
	if n := len(raw); n > 2 && raw[0] == '"' {
		for _, k := range known {
			if string(raw[1:n-1]) == k {
				*dst = k
				return true
			}
		}
	}
	one := jsonscan.New(raw)
	return one.StringOrNull(dst) && one.End()
}

func parseMessage(s *jsonscan.Scanner, ev *event) bool {
	var seen jsonscan.Keys
	return s.Object(func(key []byte) bool {
		switch string(key) {
		case "model":
			return seen.Once(1) && s.StringOrNull(&ev.model)
		case "id":
			return seen.Once(4) && s.StringOrNull(&ev.id)
		case "usage":
			if !seen.Once(2) || s.Peek() != '{' {
				return false
			}
			var set uint8
			return parseUsage(s, &ev.startUsage, &set)
		}
		return s.Skip()
	})
}

func parseBlock(s *jsonscan.Scanner, b *blockStart) bool {
	var seen jsonscan.Keys
	return s.Object(func(key []byte) bool {
		switch string(key) {
		case "type":
			return seen.Once(1) && enumInto(s, &b.typ, blockTypes)
		case "text":
			return seen.Once(2) && s.StringOrNull(&b.text)
		case "thinking":
			return seen.Once(4) && s.StringOrNull(&b.thinking)
		case "signature":
			return seen.Once(8) && s.StringOrNull(&b.signature)
		case "id":
			return seen.Once(16) && s.StringOrNull(&b.id)
		case "name":
			return seen.Once(32) && s.StringOrNull(&b.name)
		case "input":
			if !seen.Once(64) {
				return false
			}
			raw, ok := s.Raw()
			b.input = string(raw)
			return ok
		}
		return s.Skip()
	})
}

func parseDelta(s *jsonscan.Scanner, d *delta) bool {
	var seen jsonscan.Keys
	return s.Object(func(key []byte) bool {
		switch string(key) {
		case "type":
			return seen.Once(1) && enumInto(s, &d.typ, deltaTypes)
		case "text":
			return seen.Once(2) && s.StringOrNull(&d.text)
		case "thinking":
			return seen.Once(4) && s.StringOrNull(&d.thinking)
		case "signature":
			return seen.Once(8) && s.StringOrNull(&d.signature)
		case "partial_json":
			return seen.Once(16) && s.StringOrNull(&d.partialJSON)
		case "stop_reason":
			return seen.Once(32) && enumInto(s, &d.stopReason, stopReasons)
		}
		return s.Skip()
	})
}

// parseUsage reads a usage object into u, setting a bit of set for each
// field that holds a number (not null).
func parseUsage(s *jsonscan.Scanner, u *llm.Usage, set *uint8) bool {
	var seen jsonscan.Keys
	field := func(bit uint8, dst *int64) bool {
		if !seen.Once(bit) {
			return false
		}
		if s.Null() {
			return true
		}
		*set |= bit
		return s.IntOrNull(dst)
	}
	return s.Object(func(key []byte) bool {
		switch string(key) {
		case "input_tokens":
			return field(usageInput, &u.InputTokens)
		case "output_tokens":
			return field(usageOutput, &u.OutputTokens)
		case "cache_read_input_tokens":
			return field(usageCacheRead, &u.CacheReadTokens)
		case "cache_creation_input_tokens":
			return field(usageCacheWrite, &u.CacheWriteTokens)
		}
		return s.Skip()
	})
}
