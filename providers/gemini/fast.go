package gemini

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"math"
	"net/http"
	"reflect"
	"strings"
	"sync"

	"google.golang.org/genai"

	"github.com/turnstile-dev/turnstile/providers/internal/jsonscan"
)

// The SDK stays the source of truth: it builds and sends the request, and
// reads and classifies every answer that is not a success. The events of a
// successful stream are read here, and only those of the shape the Gemini
// API sends: the SDK decodes each event into a map, converts it, encodes
// it again and decodes that into its structs (about 25 µs and 150
// allocations per event). The transport hands the body of a successful
// response to the adapter ([recorder]) and the SDK an empty one; from the
// first event the fast path does not take (an error, a function call, any
// field it does not read or check) to the end of the body, the rest is
// decoded by the SDK itself: a second client whose transport answers with
// what is left of the body ([Provider.sdkRest]). fast_test.go proves over
// the fixtures and a fuzz corpus that both paths yield the same.

// scanBufs are the event scanners' initial buffers, of the SDK's size.
var scanBufs = sync.Pool{New: func() any { b := make([]byte, 1024); return &b }}

// maxEvent is the SDK's limit on one event (256 MiB).
const maxEvent = 256 << 20

// eventScanner splits a body into events exactly as the SDK does: at the
// first blank line ("\n\n"), else at the first "\r\n\r\n", with a final
// "\r" dropped; at the end of the body what is left is the last event.
type eventScanner struct {
	*bufio.Scanner
	buf *[]byte
	// window is the buffered input from the start of the current event:
	// what the SDK must read first if it takes over.
	window []byte
}

func newEventScanner(body io.Reader) *eventScanner {
	s := &eventScanner{Scanner: bufio.NewScanner(body), buf: scanBufs.Get().(*[]byte)}
	s.Buffer((*s.buf)[:cap(*s.buf)], maxEvent)
	s.Split(s.split)
	return s
}

func (s *eventScanner) split(data []byte, atEOF bool) (int, []byte, error) {
	if atEOF && len(data) == 0 {
		return 0, nil, nil
	}
	end, sep := bytes.Index(data, []byte("\n\n")), 2
	if end < 0 {
		end, sep = bytes.Index(data, []byte("\r\n\r\n")), 4
	}
	switch {
	case end >= 0:
	case atEOF:
		end, sep = len(data), 0
	default:
		return 0, nil, nil
	}
	s.window = data
	return end + sep, bytes.TrimSuffix(data[:end], []byte("\r")), nil
}

// release returns the scanner's buffer; it must not be used afterwards.
func (s *eventScanner) release() {
	scanBufs.Put(s.buf)
	s.Scanner, s.window = nil, nil
}

// fastEvents reads the events of body, the body of a successful response
// to c with the header h, and yields them, ending with the error that
// ended the body, if any. It hands the rest of the body to the SDK from
// the first event it does not take.
func (p *Provider) fastEvents(ctx context.Context, c call, body io.Reader, h http.Header, yield func(*genai.GenerateContentResponse, error) bool) {
	s := newEventScanner(body)
	defer s.release()
	r := fastResponse{http: &genai.HTTPResponse{Headers: h}}
	for s.Scan() {
		ev := s.Bytes()
		if len(ev) == 0 {
			continue
		}
		if name, data, _ := bytes.Cut(ev, []byte(":")); string(name) == "data" && r.parse(data) {
			if !yield(&r.resp, nil) {
				return
			}
			continue
		}
		rest := io.MultiReader(bytes.NewReader(bytes.Clone(s.window)), body)
		p.sdkRest(ctx, c, rest, h, yield)
		return
	}
	if err := s.Err(); err != nil {
		// The SDK's own reader reports (and logs) the failure.
		p.sdkRest(ctx, c, failedBody{err}, h, yield)
	}
}

// failedBody is a body whose reads fail with err.
type failedBody struct{ err error }

func (b failedBody) Read([]byte) (int, error) { return 0, b.err }

var errNoReplay = errors.New("gemini: a replayed request without its body")

// replayKey marks the context of a request to the replay client; its
// value is the *replayBody to answer with.
type replayKey struct{}

// replayBody is the answer of the replay client's transport: a successful
// response with the rest of a body and the real response's header.
type replayBody struct {
	body   io.Reader
	header http.Header
}

// replayTransport answers each request with the replayBody of its context.
type replayTransport struct{}

// RoundTrip answers r without sending it.
func (replayTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rb, _ := r.Context().Value(replayKey{}).(*replayBody)
	if rb == nil {
		return nil, errNoReplay
	}
	return &http.Response{
		StatusCode: http.StatusOK, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: rb.header, Body: io.NopCloser(rb.body), Request: r,
	}, nil
}

// sdkRest decodes body, the rest of a successful response to c whose
// header is h, with the SDK, and yields what it yields.
func (p *Provider) sdkRest(ctx context.Context, c call, body io.Reader, h http.Header, yield func(*genai.GenerateContentResponse, error) bool) {
	ctx = context.WithValue(ctx, replayKey{}, &replayBody{body: body, header: h})
	for r, err := range p.replay.GenerateContentStream(ctx, c.model, c.contents, c.config) {
		if !yield(r, err) {
			return
		}
	}
}

// fastResponse is a response read by the fast path, reused from one event
// to the next: the decoder keeps nothing of it.
type fastResponse struct {
	resp    genai.GenerateContentResponse
	cands   [1]*genai.Candidate
	cand    genai.Candidate
	content genai.Content
	parts   []genai.Part
	ptrs    []*genai.Part
	usage   genai.GenerateContentResponseUsageMetadata
	http    *genai.HTTPResponse
	// other is the scratch space of the candidates after the first,
	// which are checked but not kept: only the first is used.
	other fastCandidate
}

// fastCandidate is what is read of one candidate.
type fastCandidate struct {
	cand       genai.Candidate
	hasContent bool
	content    genai.Content
	parts      []genai.Part
}

// parse reads one event's data. It reports false for anything but the
// plain shape — an object whose fields, as far as the SDK converts and
// decodes them, are text and thought parts, a finish reason, usage counts,
// a model version and a response id, of the types the SDK's structs have
// and none repeated — and the SDK then decodes the event.
func (r *fastResponse) parse(data []byte) bool {
	r.resp = genai.GenerateContentResponse{SDKHTTPResponse: r.http}
	s := jsonscan.New(data)
	var seen jsonscan.Keys
	n := 0
	first := fastCandidate{parts: r.parts[:0]}
	ok := s.Object(func(key []byte) bool {
		switch string(key) {
		case "candidates":
			if !seen.Once(1) {
				return false
			}
			if s.Null() {
				return true
			}
			return s.Array(func() bool {
				n++
				if n == 1 {
					return parseCandidate(&s, &first)
				}
				r.other.parts = r.other.parts[:0]
				return parseCandidate(&s, &r.other)
			})
		case "modelVersion":
			return seen.Once(2) && s.StringOrNull(&r.resp.ModelVersion)
		case "responseId":
			return seen.Once(4) && s.StringOrNull(&r.resp.ResponseID)
		case "usageMetadata":
			if !seen.Once(8) {
				return false
			}
			if s.Null() {
				return true
			}
			r.usage = genai.GenerateContentResponseUsageMetadata{}
			r.resp.UsageMetadata = &r.usage
			return parseUsage(&s, &r.usage)
		case "error", "promptFeedback", "sdkHttpResponse", "modelStatus":
			// An error event, or fields the fast path does not read.
			return s.Null() && seen.Once(16)
		}
		return s.Skip()
	})
	r.parts = first.parts
	if !ok || !s.End() {
		return false
	}
	if n == 0 {
		return true
	}
	r.cand = first.cand
	if first.hasContent {
		r.content = first.content
		r.ptrs = r.ptrs[:0]
		for i := range r.parts {
			r.ptrs = append(r.ptrs, &r.parts[i])
		}
		r.content.Parts = r.ptrs
		r.cand.Content = &r.content
	}
	r.cands[0] = &r.cand
	r.resp.Candidates = r.cands[:]
	return true
}

// parseCandidate reads a candidate into c. The SDK's conversion keeps
// only some keys of a candidate, by their exact names; the others are
// dropped unread.
func parseCandidate(s *jsonscan.Scanner, c *fastCandidate) bool {
	if s.Peek() != '{' {
		return false
	}
	c.cand, c.hasContent, c.content = genai.Candidate{}, false, genai.Content{}
	var seen jsonscan.Keys
	return s.Object(func(key []byte) bool {
		switch string(key) {
		case "content":
			if !seen.Once(1) {
				return false
			}
			if s.Null() {
				return true
			}
			c.hasContent = true
			return parseContent(s, &c.content, &c.parts)
		case "finishReason":
			var v string
			ok := seen.Once(2) && s.StringOrNull(&v)
			c.cand.FinishReason = genai.FinishReason(v)
			return ok
		case "index":
			return seen.Once(4) && int32Into(s, &c.cand.Index)
		case "citationMetadata", "tokenCount", "groundingMetadata", "avgLogprobs", "logprobsResult",
			"safetyRatings", "urlContextMetadata", "continuationToken":
			// Kept by the conversion; not read here.
			return s.Null() && seen.Once(8)
		}
		return s.Skip()
	})
}

// parseContent reads a content object, which the SDK decodes as it is,
// with encoding/json's rules: a key that matches a field of Content but
// for its case is left to the SDK.
func parseContent(s *jsonscan.Scanner, content *genai.Content, parts *[]genai.Part) bool {
	if s.Peek() != '{' {
		return false
	}
	var seen jsonscan.Keys
	return s.Object(func(key []byte) bool {
		switch string(key) {
		case "parts":
			if !seen.Once(1) {
				return false
			}
			if s.Null() {
				return true
			}
			return s.Array(func() bool {
				*parts = append(*parts, genai.Part{})
				return parsePart(s, &(*parts)[len(*parts)-1])
			})
		case "role":
			return seen.Once(2) && s.StringOrNull(&content.Role)
		}
		return !folds(key, contentFields) && s.Skip()
	})
}

// parsePart reads a text or thought part.
func parsePart(s *jsonscan.Scanner, p *genai.Part) bool {
	if s.Peek() != '{' {
		return false
	}
	var seen jsonscan.Keys
	return s.Object(func(key []byte) bool {
		switch string(key) {
		case "text":
			return seen.Once(1) && s.StringOrNull(&p.Text)
		case "thought":
			return seen.Once(2) && boolInto(s, &p.Thought)
		case "thoughtSignature":
			if !seen.Once(4) {
				return false
			}
			if s.Null() {
				return true
			}
			v, ok := s.String()
			if !ok {
				return false
			}
			// encoding/json's reading of a []byte.
			b, err := base64.StdEncoding.DecodeString(v)
			p.ThoughtSignature = b
			return err == nil
		}
		return !folds(key, partFields) && s.Skip()
	})
}

// parseUsage reads usage metadata, which the SDK decodes as it is.
func parseUsage(s *jsonscan.Scanner, u *genai.GenerateContentResponseUsageMetadata) bool {
	if s.Peek() != '{' {
		return false
	}
	var seen jsonscan.Keys
	return s.Object(func(key []byte) bool {
		switch string(key) {
		case "promptTokenCount":
			return seen.Once(1) && int32Into(s, &u.PromptTokenCount)
		case "candidatesTokenCount":
			return seen.Once(2) && int32Into(s, &u.CandidatesTokenCount)
		case "totalTokenCount":
			return seen.Once(4) && int32Into(s, &u.TotalTokenCount)
		case "thoughtsTokenCount":
			return seen.Once(8) && int32Into(s, &u.ThoughtsTokenCount)
		case "cachedContentTokenCount":
			return seen.Once(16) && int32Into(s, &u.CachedContentTokenCount)
		case "toolUsePromptTokenCount":
			return seen.Once(32) && int32Into(s, &u.ToolUsePromptTokenCount)
		case "trafficType":
			var v string
			ok := seen.Once(64) && s.StringOrNull(&v)
			u.TrafficType = genai.TrafficType(v)
			return ok
		case "promptTokensDetails", "candidatesTokensDetails", "cacheTokensDetails", "toolUsePromptTokensDetails":
			// Checked, not kept: the decoder does not read them.
			return s.Null() || s.Array(func() bool { return checkModalityCount(s) })
		}
		return !folds(key, usageFields) && s.Skip()
	})
}

// checkModalityCount checks a {modality, tokenCount} object.
func checkModalityCount(s *jsonscan.Scanner) bool {
	if s.Peek() != '{' {
		return false
	}
	var seen jsonscan.Keys
	var modality string
	var count int32
	return s.Object(func(key []byte) bool {
		switch string(key) {
		case "modality":
			return seen.Once(1) && s.StringOrNull(&modality)
		case "tokenCount":
			return seen.Once(2) && int32Into(s, &count)
		}
		return !folds(key, modalityFields) && s.Skip()
	})
}

// The JSON names of the SDK's structs that encoding/json fills from the
// event as it is: a key equal to one of them but for its case sets that
// field too.
var (
	contentFields  = jsonNames[genai.Content]()
	partFields     = jsonNames[genai.Part]()
	usageFields    = jsonNames[genai.GenerateContentResponseUsageMetadata]()
	modalityFields = jsonNames[genai.ModalityTokenCount]()
)

func jsonNames[T any]() []string {
	t := reflect.TypeFor[T]()
	var names []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name == "" {
			name = t.Field(i).Name
		}
		names = append(names, name)
	}
	return names
}

// folds reports a key that encoding/json could match to one of names
// without being it: equal but for its case, or not plain ASCII.
func folds(key []byte, names []string) bool {
	for _, c := range key {
		if c >= 0x80 {
			return true
		}
	}
	for _, n := range names {
		if strings.EqualFold(string(key), n) {
			return true
		}
	}
	return false
}

// int32Into reads an integer that fits an int32, or null as zero.
func int32Into(s *jsonscan.Scanner, dst *int32) bool {
	if s.Null() {
		*dst = 0
		return true
	}
	v, ok := s.Int()
	if !ok || v < math.MinInt32 || v > math.MaxInt32 {
		return false
	}
	*dst = int32(v)
	return true
}

// boolInto reads true, false, or null as false.
func boolInto(s *jsonscan.Scanner, dst *bool) bool {
	raw, ok := s.Raw()
	switch {
	case !ok:
		return false
	case string(raw) == "true":
		*dst = true
	case string(raw) == "false", string(raw) == "null":
		*dst = false
	default:
		return false
	}
	return true
}
