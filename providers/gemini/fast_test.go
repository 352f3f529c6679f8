package gemini

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

// fastSeeds are SSE bodies for the conformance test of the fast path:
// the shapes the Gemini API sends, and the odd ones the fast path must
// hand to the SDK.
var fastSeeds = []string{
	crlf(`{"candidates": [{"content": {"parts": [{"text": "**Thinking** \u00e9 \"x\"\n","thought": true,"thoughtSignature":"CikB"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 9,"totalTokenCount": 20,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 9}],"thoughtsTokenCount": 11},"modelVersion": "gemini-2.5-flash","responseId": "r1"}`) +
		data(`{"candidates": [{"content": {"parts": [{"text": "Hel"}],"role": "model"},"index": 0}],"modelVersion": "gemini-2.5-flash","responseId": "r1"}`) +
		data(`{"candidates": [{"content": {"parts": [{"text": "lo","thoughtSignature":"c2ln"},{"text":""},{"thought":false,"text":"!"}],"role": "model"},"finishReason": "STOP","finishMessage":"done","index": 0}],"usageMetadata": {"promptTokenCount": 9,"candidatesTokenCount": 2,"totalTokenCount": 22,"cachedContentTokenCount":4,"toolUsePromptTokenCount":1,"thoughtsTokenCount": 11,"trafficType":"ON_DEMAND","candidatesTokensDetails":null},"modelVersion": "gemini-2.5-flash","responseId": "r1","createTime":"x"}`),
	data(`{"candidates": [{"content": {"parts": [{"functionCall": {"name": "f","args": {"b": 1.50, "a": "<&>"}}}],"role": "model"},"finishReason": "STOP"}]}`),
	data(`{"candidates": [{"content": {"parts": [{"text": "a"}]}}]}`) + data(`{"candidates": [{"finishReason": "MAX_TOKENS"}]}`),
	data(`{"candidates": [{"content": {"parts": [{"text": "a"}]}}, {"content": {"parts": [{"text": "second"}]}, "index": 1}]}`) +
		data(`{"candidates": [{"finishReason": "SAFETY", "safetyRatings": [{"category": "HARM_CATEGORY_HARASSMENT", "probability": "HIGH"}]}]}`),
	data(`{"candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": "MALFORMED_FUNCTION_CALL"}]}`),
	data(`{"promptFeedback": {"blockReason": "SAFETY"}}`),
	data(`{"candidates": [{"content": {"parts": [{"text": "a"}]}}]}`) + `data: {"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}` + "\n\n",
	`{"error": {"code": 503, "status": "UNAVAILABLE"}}` + "\n\n",
	data(`{"candidates": [{"content": {"parts": [{"text": "a"}]}}],"error":null}`) + data(`{"candidates": [{"finishReason": "STOP"}]}`),
	"data: {not json\n\n",
	"data: [1,2]\n\n",
	"data: null\n\n",
	"data: \"text\"\n\n",
	"event: x\n\n",
	data(`{"candidates": null}`) + data(`{"candidates": [null]}`),
	data(`{"candidates": [{"content": null, "finishReason": "STOP"}]}`),
	data(`{"candidates": [{"content": {"parts": [null]}}]}`),
	data(`{"candidates": [{"content": {"Parts": [{"text": "case"}]}}]}`) + data(`{"candidates": [{"content": {"parts": [{"TEXT": "case"}]}}]}`),
	data(`{"candidates": [{"content": {"parts": [{"text": "dup", "text": "licate"}]}}]}`),
	data(`{"candidates": [{"content": {"parts": [{"text": 5}]}}]}`) + data(`{"candidates": [{"index": "0"}]}`),
	data(`{"candidates": [{"index": 1.0}]}`) + data(`{"candidates": [{"index": 3000000000}]}`),
	data(`{"candidates": [{"content": {"parts": [{"thought": "yes", "text": "t"}]}}]}`),
	data(`{"candidates": [{"content": {"parts": [{"thoughtSignature": "not base64!", "text": "t"}]}}]}`),
	data(`{"candidates": [{"content": {"parts": [{"thoughtSignature": "c2\nln", "text": "t"}]}}]}`),
	data(`{"usageMetadata": {"promptTokenCount": 1e2}}`) + data(`{"usageMetadata": {"promptTokensDetails": [{"modality": 1}]}}`),
	data(`{"candidates": [{"content": {"parts": [{"text": "\ud83d\ude00 surrogates"}]}}]}`),
	"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"invalid \xff utf8\"}]}}]}\n\n",
	"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"crlf\"}]}, \"finishReason\": \"STOP\"}]}\r\n\r\n",
	"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"a\"}]}}]}\r\n\r\ndata: {\"candidates\": [{\"finishReason\": \"STOP\"}]}\n\n",
	"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"no end\"}]}, \"finishReason\": \"STOP\"}]}",
	"\n\n\ndata: {\"candidates\": [{\"finishReason\": \"STOP\"}]}\n\n",
	"data: {\"candidates\": [{\"finishReason\": \"STOP\"}]} x\n\n",
	"",
}

// crlf is one event of a Gemini stream as the API ends it.
func crlf(json string) string { return "data: " + json + "\r\n\r\n" }

// piecesTransport answers every request with a 200 stream of body, read
// a few bytes at a time (whole when whole is set), ended by end.
type piecesTransport struct {
	body  []byte
	end   error
	whole bool
}

func (t piecesTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	var body io.Reader = &providertest.Pieces{B: t.body, End: t.end}
	if t.whole {
		body = io.MultiReader(bytes.NewReader(t.body), &providertest.Pieces{End: t.end})
	}
	return &http.Response{
		StatusCode: 200, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:  http.Header{"Content-Type": {"text/event-stream"}, "X-Request-Id": {"req_1"}},
		Body:    io.NopCloser(body),
		Request: r,
	}, nil
}

// run streams simpleRequest from a provider whose upstream answers with t,
// through the fast path or through the SDK alone.
func run(t *testing.T, tr piecesTransport, fast bool) providertest.Stream {
	t.Helper()
	p, err := New(Config{Name: "gm", BaseURL: "http://127.0.0.1:1", APIKey: testKey, HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	p.fast = fast
	var r providertest.Stream
	for c, err := range p.Stream(t.Context(), simpleRequest) {
		if err != nil {
			r.Err = err
			continue
		}
		r.Chunks = append(r.Chunks, c)
	}
	return r
}

// FuzzFastMatchesSDK holds the fast path to the SDK: for any body, cut
// short or not, both must yield the same chunks and the same error. The
// SDK splits events at "\n\n", else at "\r\n\r\n", in what it has read so
// far, so for a few bodies its events depend on how the body's bytes
// arrive; those bodies, for which the SDK itself has no one answer, are
// skipped. The seeds (run by go test) are the shared fixtures and
// fastSeeds.
func FuzzFastMatchesSDK(f *testing.F) {
	for _, name := range []string{"gemini_ok.sse", "gemini_midstream_error.sse"} {
		f.Add([]byte(providertest.Fixture(f, name)), false)
	}
	for _, s := range fastSeeds {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, cut bool) {
		end := io.EOF
		if cut {
			end = io.ErrUnexpectedEOF
		}
		tr := piecesTransport{body: body, end: end}
		sdk, fast := run(t, tr, false), run(t, tr, true)
		whole := tr
		whole.whole = true
		if providertest.StreamDiff(sdk, run(t, whole, false)) != "" {
			t.Skip("the SDK's events depend on how the body arrives")
		}
		if d := providertest.StreamDiff(sdk, fast); d != "" {
			t.Error(d)
		}
	})
}

// TestFastPathTakesTheCommonShape checks that the fast path decodes the
// events real servers send itself, rather than handing them to the SDK.
func TestFastPathTakesTheCommonShape(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "gemini_midstream_error.sse") + fastSeeds[0] + string(benchBody())
	var r fastResponse
	n := 0
	for ev := range strings.SplitSeq(strings.ReplaceAll(body, "\r\n\r\n", "\n\n"), "\n\n") {
		d, ok := strings.CutPrefix(ev, "data:")
		if !ok || strings.Contains(d, `"error"`) {
			continue
		}
		n++
		if !r.parse([]byte(d)) {
			t.Errorf("parse declined %s", d)
		}
	}
	if n < 24 {
		t.Errorf("%d events checked, want 24 or more", n)
	}
}

// benchBody is a reply of 20 text chunks as the Gemini API streams it,
// the last with the finish reason, each with the usage so far.
func benchBody() []byte {
	var b strings.Builder
	for i := range 20 {
		finish := ""
		if i == 19 {
			finish = `,"finishReason": "STOP"`
		}
		b.WriteString(crlf(`{"candidates": [{"content": {"parts": [{"text": "word` + strconv.Itoa(i) + ` "}],"role": "model"}` + finish + `,"index": 0}],"usageMetadata": {"promptTokenCount": 12,"candidatesTokenCount": ` + strconv.Itoa(i+1) + `,"totalTokenCount": ` + strconv.Itoa(i+13) + `,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 12}]},"modelVersion": "gemini-2.5-flash","responseId": "qpc2afWVFJK4vr0Pq6WiyAU"}`))
	}
	return []byte(b.String())
}

// BenchmarkDecode decodes one 20-chunk reply to runtime chunks, through
// the SDK's decoding and through the fast path, from a transport that
// answers at once (the request is built and sent in both):
//
//	go test -run XXX -bench BenchmarkDecode -benchmem ./providers/gemini
func BenchmarkDecode(b *testing.B) {
	body := benchBody()
	for _, fast := range []bool{false, true} {
		name := "sdk"
		if fast {
			name = "fast"
		}
		b.Run(name, func(b *testing.B) {
			p, err := New(Config{Name: "gm", BaseURL: "http://127.0.0.1:1", APIKey: testKey,
				HTTPClient: &http.Client{Transport: bodyTransport(body)}})
			if err != nil {
				b.Fatal(err)
			}
			p.fast = fast
			b.ReportAllocs()
			for b.Loop() {
				for _, err := range p.Stream(b.Context(), simpleRequest) {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
