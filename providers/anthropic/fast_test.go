package anthropic

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/packages/ssestream"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

// fastSeeds are SSE bodies for the conformance test of the fast path:
// the shapes the Messages API sends, and the odd ones the fast path must
// hand to the SDK.
var fastSeeds = []string{
	ev("message_start", msgStart) +
		ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`) +
		ev("ping", `{"type": "ping"}`) +
		ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Two \u00e9 \"cities\"\n"}}`) +
		ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCgIYAhIM"}}`) +
		ev("content_block_stop", `{"type":"content_block_stop","index":0}`) +
		ev("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"text","text":"pre","citations":null}}`) +
		ev("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Checking. \u2603"}}`) +
		ev("content_block_stop", `{"type":"content_block_stop","index":1}`) +
		ev("content_block_start", `{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}}`) +
		ev("content_block_delta", `{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"city\":"}}`) +
		ev("content_block_delta", `{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":" \"Paris\"}"}}`) +
		ev("content_block_stop", `{"type":"content_block_stop","index":2}`) +
		ev("content_block_start", `{"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"toolu_2","name":"noargs","input":{}}}`) +
		ev("content_block_stop", `{"type":"content_block_stop","index":3}`) +
		ev("content_block_start", `{"type":"content_block_start","index":4,"content_block":{"type":"tool_use","id":"toolu_3","name":"whole","input": {"a": [1, 2]} }}`) +
		ev("content_block_stop", `{"type":"content_block_stop","index":4}`) +
		ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":42,"input_tokens":null,"cache_read_input_tokens":7}}`) +
		ev("message_stop", `{"type":"message_stop"}`),
	ev("message_start", `{"type":"message_start","message":{"model":"m","usage":{"input_tokens":5,"output_tokens":null}}}`) +
		ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"redacted_thinking","data":"xyz"}}`) +
		ev("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`) +
		ev("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"a"}}`) +
		ev("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"citations_delta","citation":{"type":"char_location","cited_text":"x"}}}`) +
		ev("content_block_delta", `{"type":"content_block_delta","index":9,"delta":{"type":"text_delta","text":"no block"}}`) +
		ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":3}}`) +
		ev("message_stop", `{"type":"message_stop"}`),
	ev("message_start", msgStart) + ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"model_context_window_exceeded"},"usage":{"output_tokens":3}}`),
	ev("message_start", msgStart) +
		ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"bad","input":{}}}`) +
		ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"[1]"}}`) +
		ev("content_block_stop", `{"type":"content_block_stop","index":0}`),
	ev("message_start", msgStart) + ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`) +
		ev("error", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}`),
	ev("error", `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`),
	ev("error", `not json`),
	"event: error\n\n",
	ev("message_start", msgStart) + "data: {\"type\":\"message_stop\"}\n\n" + ": comment\n\nevent: message_stop\n\n",
	ev("message_start", `{not json`),
	ev("message_start", `[1,2]`),
	ev("message_start", `"text"`),
	ev("message_start", `null`),
	ev("message_start", `{"type":"message_start","message":null}`),
	ev("message_start", `{"type":"message_start","type":"message_stop"}`),
	ev("message_start", `{"type":"message_start","message":{"model":5}}`),
	ev("message_start", `{"type":"unknown_event","index":1}`) + ev("message_stop", `{}`) + ev("message_stop", `{"type":"message_stop","extra":[1,{"a":null}]}`),
	ev("content_block_start", `{"type":"content_block_start","index":"0","content_block":{"type":"text","text":"str index"}}`) +
		ev("content_block_start", `{"type":"content_block_start","index":1.0,"content_block":{"type":"text","text":"float index"}}`) +
		ev("content_block_start", `{"type":"content_block_start","index":null,"content_block":{"type":"text","text":null}}`) +
		ev("content_block_start", `{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":null,"name":"n","input":null}}`) +
		ev("content_block_start", `{"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"i","name":"n","input":"s"}}`) +
		ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":1.5}}`) +
		ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":"2"}}`) +
		ev("message_delta", `{"type":"message_delta","delta":null,"usage":null}`) +
		ev("message_stop", `{"type":"message_stop"} x`),
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\ndata: \"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"multi\"}}\ndata:  \n\n",
	ev("content_block_delta", "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"bad \x01 control\"}}"),
	ev("content_block_delta", "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"invalid \xff utf8\"}}"),
	ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"\ud83d\ude00 surrogates"}}`),
	"event: message_start\r\ndata: " + msgStart + "\r\n\r\nevent: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n",
	ev("message_start", msgStart) + "event: message_stop\ndata: {\"type\":\"message_stop\"}",
	"event: message_start\ndata:\n\nevent: message_start\ndata: \n\n",
	"",
}

// runBoth streams body through the SDK's decoding and through the fast
// path, each from a response whose body ends with end (io.EOF for a clean
// end), and returns what each yielded.
func runBoth(t *testing.T, p *Provider, body []byte, end error) (sdk, fast []llm.Chunk, sdkErr, fastErr error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/v1/messages", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp := func() *http.Response {
		return &http.Response{
			StatusCode: 200,
			Header:     http.Header{"Content-Type": {"text/event-stream"}, "Request-Id": {"req_1"}},
			Body:       io.NopCloser(&providertest.Pieces{B: body, End: end}),
			Request:    req,
		}
	}
	collect := func(chunks *[]llm.Chunk, failed *error) func(llm.Chunk, error) bool {
		return func(c llm.Chunk, err error) bool {
			if err != nil {
				*failed = err
				return true
			}
			*chunks = append(*chunks, c)
			return true
		}
	}
	r := resp()
	s := ssestream.NewStream[anthropic.MessageStreamEventUnion](ssestream.NewDecoder(r), nil)
	p.consume(t.Context(), s, r, collect(&sdk, &sdkErr))
	_ = s.Close()
	p.consumeFast(t.Context(), resp(), collect(&fast, &fastErr))
	return sdk, fast, sdkErr, fastErr
}

// FuzzFastMatchesSDK holds the fast path to the SDK: for any body, cut
// short or not, both must yield the same chunks and the same error. The
// seeds (run by go test) are the shared fixtures and fastSeeds.
func FuzzFastMatchesSDK(f *testing.F) {
	for _, name := range []string{"anthropic_ok.sse", "anthropic_midstream_error.sse"} {
		f.Add([]byte(providertest.Fixture(f, name)), false)
	}
	for _, s := range fastSeeds {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	p, err := New(Config{Name: "an", BaseURL: "http://127.0.0.1:1/", APIKey: testKey})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte, cut bool) {
		end := io.EOF
		if cut {
			end = io.ErrUnexpectedEOF
		}
		sdk, fast, sdkErr, fastErr := runBoth(t, p, body, end)
		if d := providertest.StreamDiff(providertest.Stream{Chunks: sdk, Err: sdkErr}, providertest.Stream{Chunks: fast, Err: fastErr}); d != "" {
			t.Error(d)
		}
	})
}

// TestFastPathTakesTheCommonShape checks that the fast path decodes the
// events real servers send itself, rather than handing them to the SDK.
func TestFastPathTakesTheCommonShape(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "anthropic_ok.sse") + fastSeeds[0] + fastSeeds[1] + string(benchBody())
	var e event
	n := 0
	for frame := range strings.SplitSeq(body, "\n\n") {
		typ, data, ok := strings.Cut(frame, "\ndata: ")
		if !ok || typ == "event: ping" || typ == "event: error" {
			continue
		}
		n++
		if !parseEvent([]byte(data+"\n"), &e) {
			t.Errorf("parseEvent declined %s", data)
		}
	}
	if n < 40 {
		t.Errorf("%d events checked, want the fixtures' 40 or more", n)
	}
}

// TestFastPathSkipsATracedBody checks that a body the SDK's own
// OpenTelemetry spans follow is left to the SDK.
func TestFastPathSkipsATracedBody(t *testing.T) {
	t.Parallel()
	if traced(io.NopCloser(strings.NewReader(""))) {
		t.Error("a plain body reported as traced")
	}
	if !traced(tracedBody{}) {
		t.Error("a body with Unwrap and TraceEvents not reported as traced")
	}
}

// tracedBody has the methods of the SDK's traced response body.
type tracedBody struct{ io.ReadCloser }

func (tracedBody) Unwrap() io.ReadCloser                             { return nil }
func (tracedBody) TraceEvents(d ssestream.Decoder) ssestream.Decoder { return d }

// benchBody is a reply of 20 text deltas as the Messages API streams it:
// message_start, a text block with a ping after its start, its deltas and
// stop, message_delta and message_stop.
func benchBody() []byte {
	var b strings.Builder
	b.WriteString(ev("message_start", `{"type":"message_start","message":{"model":"claude-sonnet-4-5-20250929","id":"msg_01P7nF1bmxyzFZjF8zwbUDBM","type":"message","role":"assistant","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"output_tokens":1,"service_tier":"standard"}}}`))
	b.WriteString(ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`))
	b.WriteString(ev("ping", `{"type": "ping"}`))
	for i := range 20 {
		b.WriteString(ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"word`+strconv.Itoa(i)+` "}}`))
	}
	b.WriteString(ev("content_block_stop", `{"type":"content_block_stop","index":0}`))
	b.WriteString(ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":12,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":20}}`))
	b.WriteString(ev("message_stop", `{"type":"message_stop"}`))
	return []byte(b.String())
}

// BenchmarkDecode decodes one 20-delta reply to runtime chunks, through
// the SDK's decoding and through the fast path:
//
//	go test -run XXX -bench BenchmarkDecode -benchmem ./providers/anthropic
func BenchmarkDecode(b *testing.B) {
	body := benchBody()
	p, err := New(Config{Name: "an", BaseURL: "http://127.0.0.1:1/"})
	if err != nil {
		b.Fatal(err)
	}
	resp := func() *http.Response {
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: io.NopCloser(bytes.NewReader(body))}
	}
	yield := func(c llm.Chunk, err error) bool {
		if err != nil {
			b.Fatal(err)
		}
		return true
	}
	b.Run("sdk", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r := resp()
			s := ssestream.NewStream[anthropic.MessageStreamEventUnion](ssestream.NewDecoder(r), nil)
			p.consume(b.Context(), s, r, yield)
		}
	})
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p.consumeFast(b.Context(), resp(), yield)
		}
	})
}
