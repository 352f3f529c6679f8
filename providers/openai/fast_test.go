package openai

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

// fastSeeds are SSE bodies for the conformance test of the fast path:
// the shapes OpenAI and compatible servers send, and the odd ones the
// fast path must hand to the SDK.
var fastSeeds = []string{
	chunkLine(`{"role":"assistant","content":"","refusal":null}`, "") + chunkLine(`{"content":"Hel"}`, "") + chunkLine(`{"content":"lo \u00e9\n\"x\"\\ \u2603"}`, "") +
		chunkLine(`{}`, "stop") +
		`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":5,"total_tokens":105,"prompt_tokens_details":{"cached_tokens":80,"cache_write_tokens":3},"completion_tokens_details":{"reasoning_tokens":0}}}` + "\n\n" +
		"data: [DONE]\n\n",
	chunkLine(`{"reasoning_content":"think"}`, "") + chunkLine(`{"reasoning":"more","reasoning_content":null}`, "") + chunkLine(`{"reasoning":"a","reasoning_content":"b"}`, "") +
		chunkLine(`{"content":"x"}`, "length") + "data: [DONE]\n\n",
	chunkLine(`{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\":"}}]}`, "") +
		chunkLine(`{"tool_calls":[{"index":1,"id":"b","type":"function","function":{"name":"g","arguments":"{}"}}]}`, "") +
		chunkLine(`{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}`, "") +
		chunkLine(`{"tool_calls":[{"index":2,"id":"c","type":"function","function":{"name":"h"}}]}`, "") +
		chunkLine(`{"tool_calls":null,"function_call":null}`, "") +
		chunkLine(`{}`, "tool_calls") + "data: [DONE]\n\n",
	chunkLine(`{"refusal":"I can't"}`, "") + chunkLine(`{"refusal":" help."}`, "") + chunkLine(`{}`, "stop") + "data: [DONE]\n\n",
	chunkLine(`{"content":"I"}`, "content_filter") + "data: [DONE]\n\n",
	chunkLine(`{"content":"a"}`, "") + `data: {"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}` + "\n\n",
	chunkLine(`{"content":"a"}`, "") + `data: {"choices":[],"error":null}` + "\n\n" + chunkLine(`{}`, "stop"),
	`error: {"code":500,"message":"slot unavailable","type":"server_error"}` + "\n\n" + "data: [DONE]\n\n",
	"data: {not json\n\n",
	"data: [1,2]\n\n",
	"data: \"text\"\n\n",
	"data: null\n\n",
	": comment\r\nevent: thread.message\r\ndata: {\"choices\":[]}\r\n\r\n",
	"event: message\ndata: {\"choices\":[{\"index\":0,\n\"delta\":{\"content\":\"multi\"}}]}\ndata:  \n\n" + chunkLine(`{}`, "stop"),
	chunkLine(`{"content":"\ud83d\ude00 surrogates"}`, "") + chunkLine(`{"content":5}`, "") + chunkLine(`{"content":{"a":1}}`, "stop"),
	`data: {"choices":[{"index":0,"delta":{"content":"dup","content":"licate"},"finish_reason":null}]}` + "\n\n" +
		`data: {"choices":[{"index":1,"delta":{"content":"second choice"}},null,{"index":"0","delta":{"content":"str index"}}]}` + "\n\n" +
		`data: {"choices":[{"index":0.0,"delta":{"content":"float index"}},{"index":1e0}]}` + "\n\n" +
		`data: {"choices":[{"index":0,"delta":null,"finish_reason":"stop"}],"usage":{}}` + "\n\n",
	`data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}],"usage":5}` + "\n\n" +
		`data: {"usage":{"prompt_tokens":1.5,"completion_tokens":"2"}}` + "\n\n" + "data: [DONE] trailing\n\n",
	`data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]} x` + "\n\n",
	`data: {"choices":[{"index":0,"delta":{"content":"bad \x01 control"},"finish_reason":"stop"}]}` + "\n\n",
	"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"invalid \xff utf8\"},\"finish_reason\":\"stop\"}]}\n\n",
	"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"partial\"}}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}",
	"",
}

// runBoth streams body through the SDK's decoding and through the fast
// path, each from a response whose body ends with end (io.EOF for a clean
// end), and returns what each yielded.
func runBoth(t *testing.T, p *Provider, body []byte, end error) (sdk, fast []llm.Chunk, sdkErr, fastErr error) {
	t.Helper()
	resp := func() *http.Response {
		return &http.Response{
			StatusCode: 200,
			Header:     http.Header{"Content-Type": {"text/event-stream"}, "X-Request-Id": {"req_1"}},
			Body:       io.NopCloser(&providertest.Pieces{B: body, End: end}),
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
	s := ssestream.NewStream[openai.ChatCompletionChunk](ssestream.NewDecoder(r), nil)
	p.consume(t.Context(), s, r, collect(&sdk, &sdkErr))
	_ = s.Close()
	p.consumeFast(t.Context(), resp(), collect(&fast, &fastErr))
	return sdk, fast, sdkErr, fastErr
}

// FuzzFastMatchesSDK holds the fast path to the SDK: for any body, cut
// short or not, both must yield the same chunks and the same error. The
// seeds (run by go test) are the shared fixtures and fastSeeds.
func FuzzFastMatchesSDK(f *testing.F) {
	for _, name := range []string{"openai_ok.sse", "openai_midstream_error.sse"} {
		f.Add([]byte(providertest.Fixture(f, name)), false)
	}
	for _, s := range fastSeeds {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	p, err := New(Config{Name: "oa", BaseURL: "http://127.0.0.1:1/v1", APIKey: testKey})
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
// shapes real servers send itself, rather than handing them to the SDK.
func TestFastPathTakesTheCommonShape(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "openai_ok.sse") + fastSeeds[0] + fastSeeds[1] + fastSeeds[2]
	var c chunk
	for ev := range strings.SplitSeq(body, "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		if !parseChunk([]byte(data+"\n"), &c) {
			t.Errorf("parseChunk declined %s", data)
		}
	}
}

// TestFastPathDrainsTheBody checks that the body is read to its end after
// [DONE], so its connection can be reused.
func TestFastPathDrainsTheBody(t *testing.T) {
	t.Parallel()
	body := &providertest.Pieces{B: []byte(fastSeeds[3] + "data: {\"ignored\":true}\n\n"), End: io.EOF}
	p, err := New(Config{Name: "oa", BaseURL: "http://127.0.0.1:1/v1"})
	if err != nil {
		t.Fatal(err)
	}
	resp := &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(body)}
	p.consumeFast(t.Context(), resp, func(llm.Chunk, error) bool { return true })
	if n, _ := body.Read(make([]byte, 1)); n != 0 || !bytes.Equal(body.B, nil) {
		t.Errorf("%d bytes left unread after [DONE]", len(body.B))
	}
}
