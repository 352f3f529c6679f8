package openai

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

// sent is what a loopback server received for one request.
type sent struct {
	body   []byte
	header http.Header
	path   string
}

// sendBoth sends req through p twice, directly (p.Stream) and through the
// SDK's own pipeline (p.viaSDK), to f, and returns what f received each
// time. f answers with a stream; both must succeed.
func sendBoth(tb testing.TB, p *Provider, f *providertest.Server, paths *pathLog, req *llm.Request) (direct, sdk sent) {
	tb.Helper()
	params, err := buildParams(req)
	if err != nil {
		tb.Fatalf("buildParams: %v", err)
	}
	before := f.Requests()
	if _, err := providertest.Collect(tb, tb.Context(), p, req); err != nil {
		tb.Fatalf("direct: %v", err)
	}
	yield, end := providertest.CheckYield(tb)
	p.viaSDK(tb.Context(), params, yield)
	end()
	bodies, headers := f.Bodies(), f.Headers()
	if len(bodies) != before+2 {
		tb.Fatalf("server got %d requests, want 2", len(bodies)-before)
	}
	ps := paths.last(2)
	return sent{bodies[before], headers[before], ps[0]}, sent{bodies[before+1], headers[before+1], ps[1]}
}

// pathLog records the paths a server is asked for.
type pathLog struct {
	mu    sync.Mutex
	paths []string
}

func (l *pathLog) add(path string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.paths = append(l.paths, path)
}

func (l *pathLog) last(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.paths[len(l.paths)-n:])
}

// conformanceServer is a loopback server that answers every request with
// the OK fixture and logs its path.
func conformanceServer(tb testing.TB) (*providertest.Server, *pathLog) {
	body := providertest.Fixture(tb, "openai_ok.sse")
	var log pathLog
	f := providertest.NewServer(tb, func(w http.ResponseWriter, r *http.Request) {
		log.add(r.URL.RequestURI())
		providertest.WriteSSE(w, body)
	})
	return f, &log
}

func TestDirectRequestMatchesSDK(t *testing.T) {
	t.Parallel()
	f, paths := conformanceServer(t)
	client := providertest.Client(t, f.Server)
	temp, zero, tiny, big := 0.2, 0.0, 1e-7, 1e22
	user := func(texts ...string) llm.Message {
		m := llm.Message{Role: llm.RoleUser}
		for _, s := range texts {
			m.Parts = append(m.Parts, llm.TextPart(s))
		}
		return m
	}
	call := func(id, name, args string) llm.Part {
		return llm.Part{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: id, Name: name, Arguments: args}}
	}
	result := func(id, content string) llm.Part {
		return llm.Part{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: id, Name: "f", Content: content}}
	}
	cases := []struct {
		name string
		cfg  Config
		req  *llm.Request
	}{
		{name: "text", req: simpleRequest},
		{name: "empty request", req: &llm.Request{}},
		{name: "system", req: &llm.Request{Model: "gpt-4o", System: "Be brief.", Messages: []llm.Message{user("hi")}}},
		{name: "escaping", req: &llm.Request{Model: "m\"\\", System: "<b>&</b>\u2028\u2029\x00\x1f\b\f\n\r\t\x7f",
			Messages: []llm.Message{user("bad utf-8 \xff\xfe, é, 😀, \u2028")}}},
		{name: "several texts", req: &llm.Request{Model: "m", Messages: []llm.Message{user("a", "", "c")}}},
		{name: "empty text", req: &llm.Request{Model: "m", Messages: []llm.Message{user("")}}},
		{name: "tools with schemas", req: &llm.Request{Model: "m", Messages: []llm.Message{user("go")}, Tools: []llm.ToolSpec{
			{Name: "get_weather", Description: "Current <weather>", Schema: json.RawMessage(
				`{"type":"object","properties":{"city":{"type":"string","enum":["a<b","é"]},"n":{"type":"number","maximum":1.50,"minimum":-2e-7}},"required":["city"],"additionalProperties":false}`)},
			{Name: "now"},
			{Name: "empty", Schema: json.RawMessage(`{}`)},
			{Name: "null schema", Schema: json.RawMessage(`null`)},
			{Name: "duplicate keys", Schema: json.RawMessage(`{"b":1,"a":2,"b":3}`)},
		}}},
		{name: "tool calls and results", req: &llm.Request{Model: "m", Messages: []llm.Message{
			user("Weather in SF and LA?"),
			{Role: llm.RoleAssistant, Parts: []llm.Part{
				{Kind: llm.PartThinking, Text: "two calls", Signature: "sig"},
				llm.TextPart("Checking."),
				call("call_1", "get_weather", `{"city":"SF"}`),
				call("call_2", "get_weather", ""),
			}},
			{Role: llm.RoleTool, Parts: []llm.Part{result("call_1", "18C"), result("call_2", "")}},
			{Role: llm.RoleAssistant, Parts: []llm.Part{call("", "", "{}")}},
			{Role: llm.RoleUser, Parts: []llm.Part{result("", "x"), llm.TextPart("and?")}},
			{Role: llm.RoleAssistant, Parts: []llm.Part{llm.TextPart("a"), llm.TextPart("b")}},
			{Role: llm.RoleAssistant, Parts: []llm.Part{{Kind: llm.PartThinking, Text: "only thinking"}}},
		}}},
		{name: "media", req: &llm.Request{Model: "gpt-4o-audio-preview", Messages: []llm.Message{
			{Role: llm.RoleUser, Parts: []llm.Part{
				llm.TextPart("What are these?"),
				llm.MediaPart(llm.Media{MIMEType: "image/jpeg", URI: "https://example.com/a.jpg?x=<1>&y=\u2028"}),
				llm.MediaPart(llm.Media{MIMEType: "image/png", Data: []byte("\x89PNG\xff\xfe")}),
				llm.MediaPart(llm.Media{MIMEType: "application/pdf", Data: []byte("%PDF-1.7"), Name: "é \"q\".pdf"}),
				llm.MediaPart(llm.Media{MIMEType: "application/pdf", Data: []byte("%PDF-1.7")}),
				llm.MediaPart(llm.Media{MIMEType: "audio/wav", Data: []byte("RIFF")}),
				llm.MediaPart(llm.Media{MIMEType: "audio/mpeg", Data: []byte("ID3")}),
			}},
			{Role: llm.RoleAssistant, Parts: []llm.Part{call("call_1", "shot", "{}")}},
			{Role: llm.RoleTool, Parts: []llm.Part{{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{
				CallID: "call_1", Name: "shot", Content: "screen", Media: []llm.Media{{MIMEType: "image/webp", Data: []byte("RIFF")}},
			}}}},
		}}},
		{name: "every option", req: &llm.Request{Model: "m", Messages: []llm.Message{user("x")},
			MaxOutputTokens: 256, Temperature: &temp, TopP: &temp, StopSequences: []string{"END", "", "\n"}}},
		{name: "top_p alone", req: &llm.Request{Model: "m", TopP: &tiny}},
		{name: "prompt cache key", req: &llm.Request{Model: "m", Messages: []llm.Message{user("x")},
			MaxOutputTokens: 256, Temperature: &temp, PromptCacheKey: "ts-3f9a\"<k>"}},
		{name: "generation options", req: &llm.Request{Model: "m", Messages: []llm.Message{user("x")},
			MaxOutputTokens: 64, Temperature: &temp, StopSequences: []string{"END"}, EndUser: "u-<42>",
			Tools:        []llm.ToolSpec{{Name: "lookup"}},
			OutputSchema: &llm.OutputSchema{Name: "place", Strict: true, Schema: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string","description":"a<b"}},"required":["city"],"additionalProperties":false}`)},
			ToolChoice:   &llm.ToolChoice{Mode: llm.ToolChoiceTool, Name: "lookup"},
			Reasoning:    &llm.Reasoning{Effort: llm.EffortHigh}}},
		{name: "cache key and end user", req: &llm.Request{Model: "m", Messages: []llm.Message{user("x")},
			PromptCacheKey: "ts-1", EndUser: "u-1"}},
		{name: "tool choice modes and budgets", req: &llm.Request{Model: "m", Tools: []llm.ToolSpec{{Name: "a"}},
			ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceRequired}, Reasoning: &llm.Reasoning{BudgetTokens: 5000},
			OutputSchema: &llm.OutputSchema{Name: "any", Schema: json.RawMessage(`{"type":"array","items":{"type":"integer"}}`)}}},
		{name: "zero temperature", req: &llm.Request{Model: "m", Temperature: &zero}},
		{name: "tiny temperature", req: &llm.Request{Model: "m", Temperature: &tiny}},
		{name: "huge temperature", req: &llm.Request{Model: "m", Temperature: &big}},
		{name: "no key", cfg: Config{}, req: simpleRequest},
		{name: "headers", cfg: Config{APIKey: testKey, Headers: map[string]string{
			"X-Extra": "yes", "OpenAI-Organization": "org", "User-Agent": "mine", "Accept": "text/event-stream"}}, req: simpleRequest},
		{name: "authorization header without key", cfg: Config{Headers: map[string]string{"Authorization": "Bearer other"}}, req: simpleRequest},
		{name: "authorization header with key", cfg: Config{APIKey: testKey, Headers: map[string]string{"Authorization": "Bearer other"}}, req: simpleRequest},
		{name: "base URL with a trailing slash and a query", cfg: Config{BaseURL: "/v1/?api-version=1"}, req: simpleRequest},
		{name: "base URL without /v1", cfg: Config{BaseURL: "/openai"}, req: simpleRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg.BaseURL == "" {
				cfg.BaseURL = "/v1"
			}
			cfg.BaseURL = f.URL + cfg.BaseURL
			cfg.Name, cfg.HTTPClient = "oa", client
			p, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if p.direct == nil {
				t.Fatal("no direct sender: the SDK built no request at New")
			}
			params, err := buildParams(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := appendParams(nil, &params); !ok {
				t.Fatal("appendParams refused the request: it would go through the SDK")
			}
			direct, sdk := sendBoth(t, p, f, paths, tc.req)
			if !bytes.Equal(direct.body, sdk.body) {
				t.Errorf("body differs\ndirect: %s\n   sdk: %s", direct.body, sdk.body)
			}
			if diff := cmp.Diff(sdk.header, direct.header); diff != "" {
				t.Errorf("headers differ (-sdk +direct):\n%s", diff)
			}
			if direct.path != sdk.path {
				t.Errorf("path = %q, SDK's %q", direct.path, sdk.path)
			}
		})
	}
}

// TestDirectRefusesWhatTheSDKRefuses: a temperature JSON cannot hold is
// not encoded directly; the SDK refuses it as before, and nothing is sent.
func TestDirectRefusesWhatTheSDKRefuses(t *testing.T) {
	t.Parallel()
	f, _ := conformanceServer(t)
	p := provider(t, f)
	nan := math.NaN()
	req := &llm.Request{Model: "m", Temperature: &nan}
	params, err := buildParams(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := appendParams(nil, &params); ok {
		t.Fatal("appendParams encoded a NaN temperature")
	}
	_, err = providertest.Collect(t, t.Context(), p, req)
	providertest.AsError(t, err)
	if f.Requests() != 0 {
		t.Errorf("server got %d requests, want none", f.Requests())
	}
}

// TestDirectRefusesOtherOrigins: a redirect to another origin is not
// followed, so the key never leaves the configured origin, as with the SDK.
func TestDirectRefusesOtherOrigins(t *testing.T) {
	t.Parallel()
	other, _ := conformanceServer(t)
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.Path, http.StatusTemporaryRedirect)
	})
	_, err := providertest.Collect(t, t.Context(), provider(t, f), simpleRequest)
	e := providertest.AsError(t, err)
	if other.Requests() != 0 {
		t.Errorf("the other origin got %d requests, want none", other.Requests())
	}
	if bytes.Contains([]byte(e.Error()), []byte(testKey)) {
		t.Errorf("error %q holds the key", e.Error())
	}
}

// FuzzDirectMatchesSDK builds requests from the fuzzer's strings and
// numbers and checks that the direct body is byte for byte the SDK's, as a
// loopback server receives both, with the same headers.
func FuzzDirectMatchesSDK(f *testing.F) {
	f.Add("gpt-4o", "Be brief.", "hi", "there", `{"type":"object"}`, uint16(0xffff), 0.2, 256)
	f.Add("", "", "", "", "", uint16(0), 0.0, 0)
	f.Add("m\u2028", "<&>", "\xff", "\x00\n", `{"a":[1,2.5e-9,"x",null,true,{"b":{}}]}`, uint16(0x5a5a), 1e-7, -1)
	s, paths := conformanceServer(f)
	p := provider(f, s)
	f.Fuzz(func(t *testing.T, model, system, a, b, schema string, shape uint16, temp float64, maxTokens int) {
		bit := func(i int) bool { return shape&(1<<i) != 0 }
		req := &llm.Request{Model: model, System: system, MaxOutputTokens: maxTokens}
		if bit(0) {
			req.Temperature = &temp
		}
		if bit(1) {
			req.StopSequences = []string{a, b}
		}
		if bit(2) {
			req.Tools = append(req.Tools, llm.ToolSpec{Name: a, Description: b, Schema: json.RawMessage(schema)})
		}
		if bit(3) {
			req.Tools = append(req.Tools, llm.ToolSpec{Name: b})
		}
		texts := []llm.Part{llm.TextPart(a)}
		if bit(4) {
			texts = append(texts, llm.TextPart(b))
		}
		req.Messages = append(req.Messages, llm.Message{Role: llm.RoleUser, Parts: texts})
		if bit(5) {
			parts := []llm.Part{{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: a, Name: b, Arguments: schema}}}
			if bit(6) {
				parts = append([]llm.Part{llm.TextPart(b)}, parts...)
			}
			req.Messages = append(req.Messages, llm.Message{Role: llm.RoleAssistant, Parts: parts},
				llm.Message{Role: llm.RoleTool, Parts: []llm.Part{{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: a, Content: b}}}})
		}
		if bit(7) {
			req.Messages = append(req.Messages, llm.Message{Role: llm.RoleAssistant, Parts: texts})
		}
		// The generation options (bits 8 to 13).
		if bit(8) {
			req.OutputSchema = &llm.OutputSchema{Name: a, Schema: json.RawMessage(schema), Strict: bit(9)}
		}
		switch {
		case bit(10):
			req.ToolChoice = &llm.ToolChoice{Mode: llm.ToolChoiceTool, Name: b}
		case bit(11):
			req.ToolChoice = &llm.ToolChoice{Mode: llm.ToolChoiceRequired}
		}
		if bit(12) {
			req.Reasoning = &llm.Reasoning{BudgetTokens: maxTokens}
		}
		if bit(13) {
			req.EndUser = b
		}
		if bit(14) {
			req.TopP = &temp
		}
		params, err := buildParams(req)
		if err != nil {
			return // a request no server could accept: refused before sending, either way
		}
		if _, ok := appendParams(nil, &params); !ok {
			if (req.Temperature != nil || req.TopP != nil) && !math.IsNaN(temp) && !math.IsInf(temp, 0) {
				t.Fatalf("appendParams refused %+v", req)
			}
			return
		}
		direct, sdk := sendBoth(t, p, s, paths, req)
		if !bytes.Equal(direct.body, sdk.body) {
			t.Fatalf("body differs\ndirect: %s\n   sdk: %s", direct.body, sdk.body)
		}
		if diff := cmp.Diff(sdk.header, direct.header); diff != "" {
			t.Fatalf("headers differ (-sdk +direct):\n%s", diff)
		}
	})
}
