package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
)

// The request of a turn is sent directly: the SDK's request pipeline
// (ExecuteNewRequest: a reflective encoding of the params, a JSON rewrite
// to set "stream", a fresh map of platform headers and a client copy per
// call) cost a seventh of the server's CPU per short turn. The SDK stays
// the source of truth for what is sent and for every answer but a stream:
//
//   - the params are still built by [buildParams]; [appendParams] only
//     encodes them, in the SDK's field order and string escaping, and
//     reports false for any shape it does not know, which then goes
//     through the SDK as before;
//   - the URL and the headers are those of a request the SDK built at
//     [New] (captured before it was sent: see [captureRequest]);
//   - an answer that is not a stream (status 400 or more), a transport
//     error, or a context done while waiting is handed to the SDK as if its
//     own client had received it ([Provider.viaSDK]), so it reads and
//     classifies it exactly as before.
//
// direct_test.go proves the bytes and headers equal to the SDK's, captured
// by a loopback server, over a table of requests and a fuzz target.

// direct is what the adapter needs to send a request itself.
type direct struct {
	url    string
	header http.Header
	client *http.Client
}

// errCaptured stops the SDK's request once it is captured.
var errCaptured = errors.New("openai: request captured")

// captureRequest returns the URL and headers of the request the SDK sends
// through chat with opts, without sending it.
func captureRequest(chat *openai.ChatCompletionService) (string, http.Header, error) {
	var got *http.Request
	s := chat.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "m"},
		option.WithMiddleware(func(r *http.Request, _ option.MiddlewareNext) (*http.Response, error) {
			got = r
			return nil, errCaptured
		}))
	err := s.Err()
	_ = s.Close()
	if got == nil || !errors.Is(err, errCaptured) {
		return "", nil, errors.Join(errors.New("openai: the SDK built no request"), err)
	}
	return got.URL.String(), got.Header.Clone(), nil
}

// newDirect returns the direct sender of the requests chat sends, with the
// client hc, guarded as the SDK guards its own; nil when the SDK would not
// build a request.
func newDirect(chat *openai.ChatCompletionService, hc *http.Client) *direct {
	u, h, err := captureRequest(chat)
	if err != nil {
		return nil
	}
	origin, err := url.Parse(u)
	if err != nil {
		return nil
	}
	c := *hc
	next := c.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	c.Transport = originGuard{origin: origin, next: next}
	return &direct{url: u, header: h, client: &c}
}

// send posts body. The caller closes the response's body.
func (d *direct) send(ctx context.Context, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header = d.header.Clone()
	return d.client.Do(req)
}

// errOrigin is the failure of a request, or a redirect, that leaves the
// configured base URL's origin.
var errOrigin = errors.New("openai: request URL origin must match the configured base URL")

// originGuard refuses every request to another origin than the base URL's,
// redirects included, as the SDK's client does: the API key must not follow
// a redirect elsewhere.
type originGuard struct {
	origin *url.URL
	next   http.RoundTripper
}

func (g originGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Opaque != "" || req.RequestURI != "" || !sameOrigin(req.URL, g.origin) ||
		(req.Host != "" && !sameOrigin(&url.URL{Scheme: req.URL.Scheme, Host: req.Host}, req.URL)) {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, errOrigin
	}
	return g.next.RoundTrip(req)
}

// sameOrigin reports whether a and b have the same scheme, host and port.
func sameOrigin(a, b *url.URL) bool {
	return strings.EqualFold(a.Scheme, b.Scheme) && strings.EqualFold(a.Hostname(), b.Hostname()) && port(a) == port(b)
}

func port(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	switch strings.ToLower(u.Scheme) {
	case "https":
		return "443"
	case "http":
		return "80"
	}
	return ""
}

// appendParams appends the JSON body the SDK sends for p, a request that
// [buildParams] built, with "stream": true. It reports false when p has a
// field or value it does not encode as the SDK does (a NaN temperature,
// which the SDK refuses, or a message shape buildParams does not make).
func appendParams(b []byte, p *openai.ChatCompletionNewParams) ([]byte, bool) {
	b = append(b, '{')
	ok := true
	if p.Messages != nil {
		b = append(b, `"messages":[`...)
		for i := range p.Messages {
			if i > 0 {
				b = append(b, ',')
			}
			if b, ok = appendMessage(b, &p.Messages[i]); !ok {
				return b, false
			}
		}
		b = append(b, "],"...)
	}
	if p.Model != "" {
		b = append(b, `"model":`...)
		b = appendString(b, p.Model)
		b = append(b, ',')
	}
	if p.MaxCompletionTokens.Valid() {
		b = append(b, `"max_completion_tokens":`...)
		b = strconv.AppendInt(b, p.MaxCompletionTokens.Value, 10)
		b = append(b, ',')
	}
	if p.PromptCacheKey.Valid() {
		b = append(b, `"prompt_cache_key":`...)
		b = appendString(b, p.PromptCacheKey.Value)
		b = append(b, ',')
	}
	if p.SafetyIdentifier.Valid() {
		b = append(b, `"safety_identifier":`...)
		b = appendString(b, p.SafetyIdentifier.Value)
		b = append(b, ',')
	}
	if p.Temperature.Valid() {
		b = append(b, `"temperature":`...)
		if b, ok = appendFloat(b, p.Temperature.Value); !ok {
			return b, false
		}
		b = append(b, ',')
	}
	if p.TopP.Valid() {
		b = append(b, `"top_p":`...)
		if b, ok = appendFloat(b, p.TopP.Value); !ok {
			return b, false
		}
		b = append(b, ',')
	}
	if p.ReasoningEffort != "" {
		b = append(b, `"reasoning_effort":`...)
		b = appendString(b, string(p.ReasoningEffort))
		b = append(b, ',')
	}
	if p.Stop.OfStringArray != nil {
		b = append(b, `"stop":[`...)
		for i, s := range p.Stop.OfStringArray {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, s)
		}
		b = append(b, "],"...)
	}
	if p.StreamOptions.IncludeUsage.Valid() {
		if !p.StreamOptions.IncludeUsage.Value {
			return b, false
		}
		b = append(b, `"stream_options":{"include_usage":true},`...)
	}
	if b, ok = appendGenerationOptions(b, p); !ok {
		return b, false
	}
	if p.Tools != nil {
		b = append(b, `"tools":[`...)
		for i, t := range p.Tools {
			if i > 0 {
				b = append(b, ',')
			}
			if t.OfFunction == nil || t.OfCustom != nil {
				return b, false
			}
			f := &t.OfFunction.Function
			if f.Strict.Valid() {
				return b, false
			}
			b = append(b, `{"function":{"name":`...)
			b = appendString(b, f.Name)
			if f.Description.Valid() {
				b = append(b, `,"description":`...)
				b = appendString(b, f.Description.Value)
			}
			if f.Parameters != nil {
				b = append(b, `,"parameters":`...)
				if b, ok = appendAny(b, f.Parameters); !ok {
					return b, false
				}
			}
			b = append(b, `},"type":"function"}`...)
		}
		b = append(b, "],"...)
	}
	return append(b, `"stream":true}`...), true
}

// appendGenerationOptions appends response_format and tool_choice of the
// shapes [setGenerationOptions] makes.
func appendGenerationOptions(b []byte, p *openai.ChatCompletionNewParams) ([]byte, bool) {
	ok := true
	switch rf := &p.ResponseFormat; {
	case rf.OfText != nil || rf.OfJSONObject != nil:
		return b, false
	case rf.OfJSONSchema != nil:
		s := &rf.OfJSONSchema.JSONSchema
		if s.Description.Valid() {
			return b, false
		}
		b = append(b, `"response_format":{"json_schema":{"name":`...)
		b = appendString(b, s.Name)
		if s.Strict.Valid() {
			b = append(b, `,"strict":`...)
			b = strconv.AppendBool(b, s.Strict.Value)
		}
		if s.Schema != nil {
			b = append(b, `,"schema":`...)
			if b, ok = appendAny(b, s.Schema); !ok {
				return b, false
			}
		}
		b = append(b, `},"type":"json_schema"},`...)
	}
	switch tc := &p.ToolChoice; {
	case tc.OfAllowedTools != nil || tc.OfCustomToolChoice != nil:
		return b, false
	case tc.OfAuto.Valid():
		b = append(b, `"tool_choice":`...)
		b = appendString(b, tc.OfAuto.Value)
		b = append(b, ',')
	case tc.OfFunctionToolChoice != nil:
		b = append(b, `"tool_choice":{"function":{"name":`...)
		b = appendString(b, tc.OfFunctionToolChoice.Function.Name)
		b = append(b, `},"type":"function"},`...)
	}
	return b, true
}

// appendMessage appends one message of the shapes [messages] makes.
func appendMessage(b []byte, m *openai.ChatCompletionMessageParamUnion) ([]byte, bool) {
	switch {
	case m.OfDeveloper != nil || m.OfFunction != nil:
		return b, false
	case m.OfSystem != nil:
		s := m.OfSystem
		if !s.Content.OfString.Valid() || s.Name.Valid() {
			return b, false
		}
		b = append(b, `{"content":`...)
		b = appendString(b, s.Content.OfString.Value)
		return append(b, `,"role":"system"}`...), true
	case m.OfUser != nil:
		u := m.OfUser
		if u.Name.Valid() {
			return b, false
		}
		b = append(b, `{"content":`...)
		switch {
		case u.Content.OfString.Valid():
			b = appendString(b, u.Content.OfString.Value)
		case u.Content.OfArrayOfContentParts != nil:
			b = append(b, '[')
			for i := range u.Content.OfArrayOfContentParts {
				if i > 0 {
					b = append(b, ',')
				}
				var ok bool
				if b, ok = appendContentPart(b, &u.Content.OfArrayOfContentParts[i]); !ok {
					return b, false
				}
			}
			b = append(b, ']')
		default:
			return b, false
		}
		return append(b, `,"role":"user"}`...), true
	case m.OfAssistant != nil:
		a := m.OfAssistant
		if a.Refusal.Valid() || a.Name.Valid() || !param.IsOmitted(a.Audio) || !param.IsOmitted(a.FunctionCall) ||
			a.Content.OfArrayOfContentParts != nil {
			return b, false
		}
		b = append(b, '{')
		if a.Content.OfString.Valid() {
			b = append(b, `"content":`...)
			b = appendString(b, a.Content.OfString.Value)
			b = append(b, ',')
		}
		if a.ToolCalls != nil {
			b = append(b, `"tool_calls":[`...)
			for i, c := range a.ToolCalls {
				if c.OfFunction == nil || c.OfCustom != nil {
					return b, false
				}
				if i > 0 {
					b = append(b, ',')
				}
				b = append(b, `{"id":`...)
				b = appendString(b, c.OfFunction.ID)
				b = append(b, `,"function":{"arguments":`...)
				b = appendString(b, c.OfFunction.Function.Arguments)
				b = append(b, `,"name":`...)
				b = appendString(b, c.OfFunction.Function.Name)
				b = append(b, `},"type":"function"}`...)
			}
			b = append(b, "],"...)
		}
		return append(b, `"role":"assistant"}`...), true
	case m.OfTool != nil:
		t := m.OfTool
		if !t.Content.OfString.Valid() {
			return b, false
		}
		b = append(b, `{"content":`...)
		b = appendString(b, t.Content.OfString.Value)
		b = append(b, `,"tool_call_id":`...)
		b = appendString(b, t.ToolCallID)
		return append(b, `,"role":"tool"}`...), true
	}
	return b, false
}

// appendContentPart appends one content part of a user message of the
// shapes [messages] and [mediaPart] make: text, image_url, file (inline
// data and a file name) and input_audio.
func appendContentPart(b []byte, part *openai.ChatCompletionContentPartUnionParam) ([]byte, bool) {
	set := 0
	for _, p := range []bool{part.OfText != nil, part.OfImageURL != nil, part.OfInputAudio != nil, part.OfFile != nil} {
		if p {
			set++
		}
	}
	if set != 1 {
		return b, false
	}
	switch {
	case part.OfText != nil:
		if !param.IsOmitted(part.OfText.PromptCacheBreakpoint) {
			return b, false
		}
		b = append(b, `{"text":`...)
		b = appendString(b, part.OfText.Text)
		return append(b, `,"type":"text"}`...), true
	case part.OfImageURL != nil:
		img := part.OfImageURL
		if !param.IsOmitted(img.PromptCacheBreakpoint) || img.ImageURL.Detail != "" {
			return b, false
		}
		b = append(b, `{"image_url":{"url":`...)
		b = appendString(b, img.ImageURL.URL)
		return append(b, `},"type":"image_url"}`...), true
	case part.OfFile != nil:
		f := &part.OfFile.File
		if !param.IsOmitted(part.OfFile.PromptCacheBreakpoint) || f.FileID.Valid() || !f.FileData.Valid() {
			return b, false
		}
		b = append(b, `{"file":{"file_data":`...)
		b = appendString(b, f.FileData.Value)
		if f.Filename.Valid() {
			b = append(b, `,"filename":`...)
			b = appendString(b, f.Filename.Value)
		}
		return append(b, `},"type":"file"}`...), true
	default:
		a := part.OfInputAudio
		if !param.IsOmitted(a.PromptCacheBreakpoint) || a.InputAudio.Format == "" {
			return b, false
		}
		b = append(b, `{"input_audio":{"data":`...)
		b = appendString(b, a.InputAudio.Data)
		b = append(b, `,"format":`...)
		b = appendString(b, a.InputAudio.Format)
		return append(b, `},"type":"input_audio"}`...), true
	}
}

// appendAny appends v, a tool schema decoded by encoding/json, as the SDK
// encodes it: with encoding/json's rules (keys sorted), without escaping
// HTML.
func appendAny(b []byte, v any) ([]byte, bool) {
	buf := bytes.NewBuffer(b)
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if enc.Encode(v) != nil {
		return b, false
	}
	out := buf.Bytes()
	return out[:len(out)-1], true // Encode's newline
}

// appendFloat appends f as encoding/json does; false for NaN and the
// infinities, which JSON cannot hold.
func appendFloat(b []byte, f float64) ([]byte, bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return b, false
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// e-09 becomes e-9, as encoding/json writes it.
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, true
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string with encoding/json's escaping,
// HTML characters left as they are (the SDK's setting): invalid UTF-8
// becomes U+FFFD, and U+2028 and U+2029 are escaped.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
