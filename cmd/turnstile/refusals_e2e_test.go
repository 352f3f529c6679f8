package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
)

// The tests of this file hold each row of issue 33 to a fake provider API
// that refuses what the real one refuses, status and body as the provider
// sends them, and answers any other request with the next scripted reply:
// each shows the turn now completes, through the real adapter and server,
// and logs the body sent (go test -run TestProviderRefusals -v prints
// them).

// refusal is a provider's answer to a request it refuses.
type refusal struct {
	status int
	body   string
}

// strictUpstream is a fake provider API that holds each request body to
// refuse, answering what it refuses as the provider does and any other
// request with the next of its replies (the last repeats).
type strictUpstream struct {
	*httptest.Server
	mu      sync.Mutex
	bodies  []string
	refused int
}

func newStrictUpstream(t *testing.T, refuse func(body map[string]any) *refusal, replies ...string) *strictUpstream {
	t.Helper()
	u := &strictUpstream{}
	accepted := 0
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var body map[string]any
		if err := json.Unmarshal(b, &body); err != nil {
			http.Error(w, "not JSON", http.StatusBadRequest)
			return
		}
		u.mu.Lock()
		u.bodies = append(u.bodies, string(b))
		no := refuse(body)
		n := accepted
		if no == nil {
			accepted++
		} else {
			u.refused++
		}
		u.mu.Unlock()
		if no != nil {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("request-id", "req_011CVrefused")
			w.WriteHeader(no.status)
			_, _ = io.WriteString(w, no.body)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, event := range strings.SplitAfter(replies[min(n, len(replies)-1)], "\n\n") {
			_, _ = io.WriteString(w, event)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *strictUpstream) requests() ([]string, int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.bodies...), u.refused
}

// The providers' refusals, as their APIs send them.
func anthropicRefusal(msg string) *refusal {
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]any{"type": "invalid_request_error", "message": msg}, "request_id": "req_011CVrefused"})
	return &refusal{http.StatusBadRequest, string(b)}
}

func openaiRefusal(msg, param, code string) *refusal {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "param": param, "code": code}})
	return &refusal{http.StatusBadRequest, string(b)}
}

func geminiRefusal(msg string) *refusal {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"code": 400, "message": msg, "status": "INVALID_ARGUMENT"}})
	return &refusal{http.StatusBadRequest, string(b)}
}

// The providers' replies.
func anthropicSSE(blocks []string, stop string) string {
	out := "event: message_start\ndata: " + `{"type":"message_start","message":{"model":"claude","id":"msg_1","type":"message","role":"assistant","content":[],"stop_reason":null,"usage":{"input_tokens":30,"output_tokens":1}}}` + "\n\n"
	for i, b := range blocks {
		out += b + "event: content_block_stop\ndata: " + fmt.Sprintf(`{"type":"content_block_stop","index":%d}`, i) + "\n\n"
	}
	return out + "event: message_delta\ndata: " + `{"type":"message_delta","delta":{"stop_reason":"` + stop + `"},"usage":{"output_tokens":9}}` + "\n\n" +
		"event: message_stop\ndata: " + `{"type":"message_stop"}` + "\n\n"
}

func anthropicTextBlock(i int, text string) string {
	return "event: content_block_start\ndata: " + fmt.Sprintf(`{"type":"content_block_start","index":%d,"content_block":{"type":"text","text":""}}`, i) + "\n\n" +
		"event: content_block_delta\ndata: " + fmt.Sprintf(`{"type":"content_block_delta","index":%d,"delta":{"type":"text_delta","text":%s}}`, i, jsonString(text)) + "\n\n"
}

func anthropicThinkingBlock(i int, thinking, signature string) string {
	return "event: content_block_start\ndata: " + fmt.Sprintf(`{"type":"content_block_start","index":%d,"content_block":{"type":"thinking","thinking":"","signature":""}}`, i) + "\n\n" +
		"event: content_block_delta\ndata: " + fmt.Sprintf(`{"type":"content_block_delta","index":%d,"delta":{"type":"thinking_delta","thinking":%s}}`, i, jsonString(thinking)) + "\n\n" +
		"event: content_block_delta\ndata: " + fmt.Sprintf(`{"type":"content_block_delta","index":%d,"delta":{"type":"signature_delta","signature":%s}}`, i, jsonString(signature)) + "\n\n"
}

func anthropicToolBlock(i int, id, name, args string) string {
	return "event: content_block_start\ndata: " + fmt.Sprintf(`{"type":"content_block_start","index":%d,"content_block":{"type":"tool_use","id":%q,"name":%q,"input":{}}}`, i, id, name) + "\n\n" +
		"event: content_block_delta\ndata: " + fmt.Sprintf(`{"type":"content_block_delta","index":%d,"delta":{"type":"input_json_delta","partial_json":%s}}`, i, jsonString(args)) + "\n\n"
}

func geminiSSE(parts, finish string) string {
	return `data: {"candidates":[{"content":{"parts":[` + parts + `],"role":"model"},"finishReason":"` + finish + `","index":0}],"usageMetadata":{"promptTokenCount":30,"candidatesTokenCount":5},"modelVersion":"gemini-2.5-flash","responseId":"r1"}` + "\n\n"
}

// walk calls f on every JSON object in v, depth first.
func walk(v any, f func(map[string]any)) {
	switch v := v.(type) {
	case map[string]any:
		f(v)
		for _, e := range v {
			walk(e, f)
		}
	case []any:
		for _, e := range v {
			walk(e, f)
		}
	}
}

func lastRole(body map[string]any) string {
	msgs, _ := body["messages"].([]any)
	if len(msgs) == 0 {
		return ""
	}
	m, _ := msgs[len(msgs)-1].(map[string]any)
	r, _ := m["role"].(string)
	return r
}

// badRequest returns the field violations of st, "field: description".
func badRequest(st interface{ Details() []any }) []string {
	var out []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				out = append(out, v.GetField()+": "+v.GetDescription())
			}
		}
	}
	return out
}

func modelYAML(typ, url, keyEnv, model, extra string) string {
	return fmt.Sprintf(`
providers:
  up: {type: %s, base_url: %s, api_key_env: %s}
models:
  m: {provider: up, model: %s, retry: {initial_backoff: 1ms, max_backoff: 2ms}%s}
`, typ, url, keyEnv, model, extra)
}

func mustStruct(t *testing.T, js string) *structpb.Struct {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(js), &m); err != nil {
		t.Fatal(err)
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func committedText(evs []*turnstilev1.AgentEvent) string {
	var b strings.Builder
	for _, m := range evs[len(evs)-1].GetTurnCompleted().GetMessages() {
		for _, p := range m.GetParts() {
			b.WriteString(p.GetText())
		}
	}
	return b.String()
}

// TestProviderRefusals: each row of issue 33 against a fake provider API
// that refuses what the provider refuses. The turn completes, with the
// events and the committed reply wanted, and no request was refused.
func TestProviderRefusals(t *testing.T) {
	t.Setenv("TEST_ANTHROPIC_KEY", "test-key-0123456789")
	t.Setenv("TEST_OPENAI_KEY", "test-key-0123456789")
	t.Setenv("TEST_GEMINI_KEY", "test-key-0123456789")
	temp := 0.5
	const cityJSON = `{"city":"Paris"}`
	citySchema := `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`
	tests := []struct {
		row       string
		typ       string
		keyEnv    string
		model     string
		extra     string
		refuse    func(map[string]any) *refusal
		replies   []string
		req       *turnstilev1.RunTurnRequest
		events    string
		committed string
	}{{
		row: "1: output schema on Gemini 2.5, current_time offered", typ: "gemini", keyEnv: "TEST_GEMINI_KEY", model: "gemini-2.5-flash",
		refuse: func(b map[string]any) *refusal {
			cfg, _ := b["generationConfig"].(map[string]any)
			if _, tools := b["tools"]; tools && cfg["responseMimeType"] == "application/json" {
				return geminiRefusal("Function calling with a response mime type: 'application/json' is unsupported")
			}
			return nil
		},
		replies:   []string{geminiSSE(`{"functionCall":{"name":"respond","args":`+cityJSON+`}}`, "STOP")},
		req:       &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("where?"), Generation: &turnstilev1.GenerationOptions{OutputSchema: &turnstilev1.OutputSchema{Schema: mustStruct(t, citySchema)}}},
		events:    "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted",
		committed: cityJSON,
	}, {
		row: "1: output schema on Gemini 3, beside the tools", typ: "gemini", keyEnv: "TEST_GEMINI_KEY", model: "gemini-3-flash-preview",
		refuse: func(b map[string]any) *refusal {
			cfg, _ := b["generationConfig"].(map[string]any)
			if cfg["responseMimeType"] != "application/json" || b["tools"] == nil {
				return geminiRefusal("test: Gemini 3 is sent the schema and the tools as they are")
			}
			return nil
		},
		replies:   []string{geminiSSE(`{"text":`+jsonString(cityJSON)+`}`, "STOP")},
		req:       &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("where?"), Generation: &turnstilev1.GenerationOptions{OutputSchema: &turnstilev1.OutputSchema{Schema: mustStruct(t, citySchema)}}},
		events:    "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted",
		committed: cityJSON,
	}, {
		// The API takes the converted schema; the server still holds the
		// reply to the schema as given: a name under minLength is
		// corrected.
		row: "2: Anthropic schema outside its subset", typ: "anthropic", keyEnv: "TEST_ANTHROPIC_KEY", model: "claude-sonnet-4-5",
		refuse: func(b map[string]any) *refusal {
			oc, _ := b["output_config"].(map[string]any)
			var no *refusal
			walk(oc["format"], func(o map[string]any) {
				switch {
				case no != nil:
				case o["minLength"] != nil:
					no = anthropicRefusal("output_config.format.schema: For 'string' type, property 'minLength' is not supported")
				case o["type"] == "object" && o["additionalProperties"] != false:
					no = anthropicRefusal("output_config.format.schema: For 'object' type, 'additionalProperties' must be explicitly set to false")
				}
			})
			return no
		},
		replies: []string{anthropicSSE([]string{anthropicTextBlock(0, `{"name":"Al"}`)}, "end_turn"), anthropicSSE([]string{anthropicTextBlock(0, `{"name":"Alice"}`)}, "end_turn")},
		req: &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("who?"), Generation: &turnstilev1.GenerationOptions{OutputSchema: &turnstilev1.OutputSchema{
			Schema: mustStruct(t, `{"type":"object","properties":{"name":{"type":"string","minLength":3}},"required":["name"]}`)}}},
		events:    "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage Retry LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted",
		committed: `{"name":"Alice"}`,
	}, {
		row: "3: reasoning and temperature on claude-opus-4-7", typ: "anthropic", keyEnv: "TEST_ANTHROPIC_KEY", model: "claude-opus-4-7",
		refuse: func(b map[string]any) *refusal {
			th, _ := b["thinking"].(map[string]any)
			switch {
			case th["type"] == "enabled":
				return anthropicRefusal(`"thinking.type.enabled" is not supported for this model. Use "thinking.type.adaptive" and "output_config.effort" to control thinking behavior.`)
			case b["temperature"] != nil:
				return anthropicRefusal("`temperature` is deprecated for this model.")
			}
			return nil
		},
		replies: []string{anthropicSSE([]string{anthropicThinkingBlock(0, "Easy.", "EqQBCgIYAhIM"), anthropicTextBlock(1, "Four.")}, "end_turn")},
		req: &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("2+2?"), Generation: &turnstilev1.GenerationOptions{Temperature: &temp,
			Reasoning: &turnstilev1.Reasoning{Effort: turnstilev1.ReasoningEffort_REASONING_EFFORT_HIGH}}},
		events:    "TurnStarted LlmCallStarted ThinkingDelta TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted",
		committed: "Four.",
	}, {
		row: "4: a reply cut at max_tokens on Claude 4.6", typ: "anthropic", keyEnv: "TEST_ANTHROPIC_KEY", model: "claude-sonnet-4-6",
		refuse: func(b map[string]any) *refusal {
			if lastRole(b) == "assistant" {
				return anthropicRefusal("This model does not support assistant message prefill. The conversation must end with a user message.")
			}
			return nil
		},
		replies: []string{
			anthropicSSE([]string{anthropicTextBlock(0, "The quick brown")}, "max_tokens"),
			anthropicSSE([]string{anthropicTextBlock(0, " fox jumps.")}, "end_turn"),
		},
		req: &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("a sentence?")},
		// The second call continues the first after a continuation
		// prompt: the conversation ends with a user message.
		events:    "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted",
		committed: "The quick brown fox jumps.",
	}, {
		row: "5: a tool result without a name to Gemini", typ: "gemini", keyEnv: "TEST_GEMINI_KEY", model: "gemini-2.5-flash",
		refuse: func(b map[string]any) *refusal {
			var no *refusal
			walk(b["contents"], func(o map[string]any) {
				if fr, ok := o["functionResponse"].(map[string]any); ok && fr["name"] == nil && no == nil {
					no = geminiRefusal("* GenerateContentRequest.contents[2].parts[0].function_response.name: Name cannot be empty.\n")
				}
			})
			return no
		},
		replies: []string{geminiSSE(`{"text":"It is noon."}`, "STOP")},
		req: &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{
			{Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "time?"}}}},
			{Role: turnstilev1.Role_ROLE_ASSISTANT, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_ToolCall{ToolCall: &turnstilev1.ToolCall{Id: "call_1", Name: "clock", Arguments: "{}"}}}}},
			{Role: turnstilev1.Role_ROLE_TOOL, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_ToolResult{ToolResult: &turnstilev1.ToolResult{CallId: "call_1", Content: "12:00"}}}}},
		}, Tools: []*turnstilev1.ToolDefinition{{Name: "clock"}}},
		events:    "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted",
		committed: "It is noon.",
	}, {
		row: "8: reasoning effort with temperature on o4-mini", typ: "openai", keyEnv: "TEST_OPENAI_KEY", model: "o4-mini",
		refuse: func(b map[string]any) *refusal {
			if t, ok := b["temperature"].(float64); ok && t != 1 {
				return openaiRefusal(fmt.Sprintf("Unsupported value: 'temperature' does not support %g with this model. Only the default (1) value is supported.", t), "temperature", "unsupported_value")
			}
			return nil
		},
		replies: []string{openaiAnswer("Four.")},
		req: &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("2+2?"), Generation: &turnstilev1.GenerationOptions{Temperature: &temp,
			Reasoning: &turnstilev1.Reasoning{Effort: turnstilev1.ReasoningEffort_REASONING_EFFORT_LOW}}},
		events:    "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted",
		committed: "Four.",
	}, {
		// A model the table does not know, configured: a fine-tuned
		// o-series model takes no temperature either.
		row: "8: a fine-tuned reasoning model, configured", typ: "openai", keyEnv: "TEST_OPENAI_KEY", model: "ft:o4-mini:acme::abc123",
		extra: ", capabilities: {sampling: unless_reasoning}",
		refuse: func(b map[string]any) *refusal {
			if _, ok := b["temperature"]; ok && b["reasoning_effort"] != nil {
				return openaiRefusal("Unsupported value: 'temperature' does not support 0.5 with this model. Only the default (1) value is supported.", "temperature", "unsupported_value")
			}
			return nil
		},
		replies: []string{openaiAnswer("Four.")},
		req: &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("2+2?"), Generation: &turnstilev1.GenerationOptions{Temperature: &temp,
			Reasoning: &turnstilev1.Reasoning{Effort: turnstilev1.ReasoningEffort_REASONING_EFFORT_LOW}}},
		events:    "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted",
		committed: "Four.",
	}, {
		row: "10: Gemini finish OTHER", typ: "gemini", keyEnv: "TEST_GEMINI_KEY", model: "gemini-2.5-flash",
		refuse:  func(map[string]any) *refusal { return nil },
		replies: []string{geminiSSE(`{"text":"Par"}`, "OTHER"), geminiSSE(`{"text":"Paris."}`, "STOP")},
		req:     &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("capital?")},
		// The failed call's usage, in the response that finished it, is
		// reported: Gemini billed it.
		events:    "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage Retry LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted",
		committed: "Paris.",
	}, {
		row: "10: Gemini finish TOO_MANY_TOOL_CALLS", typ: "gemini", keyEnv: "TEST_GEMINI_KEY", model: "gemini-2.5-flash",
		refuse:    func(map[string]any) *refusal { return nil },
		replies:   []string{geminiSSE(`{"functionCall":{"name":"current_time","args":{}}}`, "TOO_MANY_TOOL_CALLS"), geminiSSE(`{"text":"Noon."}`, "STOP")},
		req:       &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("time?")},
		events:    "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage Retry LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted",
		committed: "Noon.",
	}}
	for _, tt := range tests {
		t.Run(tt.row, func(t *testing.T) {
			up := newStrictUpstream(t, tt.refuse, tt.replies...)
			w := serveYAML(t, modelYAML(tt.typ, up.URL, tt.keyEnv, tt.model, tt.extra))
			evs, st := wiretest.Collect(t, t.Context(), w.client, tt.req, nil)
			bodies, refused := up.requests()
			for i, b := range bodies {
				t.Logf("body %d sent to %s: %s", i+1, tt.model, b)
			}
			if st.Code() != codes.OK {
				t.Fatalf("status %v", st)
			}
			if refused != 0 {
				t.Errorf("%d requests refused by the provider", refused)
			}
			if got := wiretest.Names(evs); got != tt.events {
				t.Errorf("events:\n got %s\nwant %s", got, tt.events)
			}
			if got := committedText(evs); got != tt.committed {
				t.Errorf("committed %q, want %q", got, tt.committed)
			}
		})
	}
}

// TestLimitsBeforeTheCall: options over the model's limits are refused
// before the turn starts, INVALID_ARGUMENT naming the field and the
// model's limit, and nothing reaches the provider (issue 33, row 9: they
// were sent, and refused after the turn started).
func TestLimitsBeforeTheCall(t *testing.T) {
	t.Setenv("TEST_ANTHROPIC_KEY", "test-key-0123456789")
	t.Setenv("TEST_OPENAI_KEY", "test-key-0123456789")
	t.Setenv("TEST_GEMINI_KEY", "test-key-0123456789")
	hot := 1.5
	eight := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	tests := []struct {
		typ, keyEnv, model string
		gen                *turnstilev1.GenerationOptions
		want               string
	}{
		{"openai", "TEST_OPENAI_KEY", "gpt-4.1", &turnstilev1.GenerationOptions{StopSequences: eight},
			`generation.stop_sequences: model "m" takes at most 4 stop sequences, got 8 (models.m.capabilities.max_stop_sequences)`},
		{"openai", "TEST_OPENAI_KEY", "gpt-5-mini", &turnstilev1.GenerationOptions{StopSequences: eight[:1]},
			`generation.stop_sequences: model "m" takes no stop sequences (models.m.capabilities.max_stop_sequences)`},
		{"gemini", "TEST_GEMINI_KEY", "gemini-2.5-pro", &turnstilev1.GenerationOptions{StopSequences: eight},
			`generation.stop_sequences: model "m" takes at most 5 stop sequences, got 8 (models.m.capabilities.max_stop_sequences)`},
		{"anthropic", "TEST_ANTHROPIC_KEY", "claude-sonnet-4-5", &turnstilev1.GenerationOptions{Temperature: &hot},
			`generation.temperature: model "m" takes a temperature from 0 to 1, got 1.5 (models.m.capabilities.max_temperature)`},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			up := newStrictUpstream(t, func(map[string]any) *refusal { return nil }, openaiAnswer("x"))
			w := serveYAML(t, modelYAML(tt.typ, up.URL, tt.keyEnv, tt.model, ""))
			evs, st := wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("hi"), Generation: tt.gen}, nil)
			if st.Code() != codes.InvalidArgument || len(evs) != 0 {
				t.Fatalf("status %v after %d events, want INVALID_ARGUMENT before any", st, len(evs))
			}
			if got := badRequest(st); !slices.Equal(got, []string{tt.want}) {
				t.Errorf("violations %q, want %q", got, tt.want)
			}
			if bodies, _ := up.requests(); len(bodies) != 0 {
				t.Errorf("%d requests reached the provider", len(bodies))
			}
		})
	}
}

// TestGeminiCallIDsAcrossTurns: Gemini 2.5 names no call, and calls the
// same tool every turn; each call gets an id of its own, so the
// conversation the client sends back is taken (issue 33, row 6: it was
// refused by turnstile itself, "ids must be unique").
func TestGeminiCallIDsAcrossTurns(t *testing.T) {
	t.Setenv("TEST_GEMINI_KEY", "test-key-0123456789")
	call := geminiSSE(`{"functionCall":{"name":"current_time","args":{"zone":"UTC"}}}`, "STOP")
	answer := geminiSSE(`{"text":"It is late."}`, "STOP")
	up := newStrictUpstream(t, func(map[string]any) *refusal { return nil }, call, answer, call, answer, answer)
	w := serveYAML(t, modelYAML("gemini", up.URL, "TEST_GEMINI_KEY", "gemini-2.5-flash", ""))
	conv := wiretest.UserText("time?")
	for turn := range 3 {
		evs, st := wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: conv}, nil)
		if st.Code() != codes.OK {
			t.Fatalf("turn %d: status %v", turn+1, st)
		}
		conv = append(conv, evs[len(evs)-1].GetTurnCompleted().GetMessages()...)
		conv = append(conv, wiretest.UserText("and now?")...)
	}
	var ids []string
	for _, m := range conv {
		for _, p := range m.GetParts() {
			if c := p.GetToolCall(); c != nil {
				ids = append(ids, c.GetId())
			}
		}
	}
	if len(ids) != 2 || ids[0] == ids[1] || ids[0] == "" {
		t.Errorf("call ids %q, want two, distinct", ids)
	}
	bodies, _ := up.requests()
	last := bodies[len(bodies)-1]
	for _, id := range ids {
		if !strings.Contains(last, `"functionCall":{"args":{"zone":"UTC"},"id":"`+id+`"`) || !strings.Contains(last, `"functionResponse":{"id":"`+id+`","name":"current_time"`) {
			t.Errorf("the last request does not carry call %s and its named result: %s", id, last)
		}
	}
}

// TestSignaturesAcrossProviders: a turn that falls back from Claude to
// Gemini after Claude signed its thinking sends Gemini none of it, and a
// conversation moved back to Claude sends Claude none of Gemini's: each
// API refuses the other's signature (issue 33, row 11). Gemini 3, which
// also refuses a call of the current turn that carries no signature, is
// sent Claude's call with the placeholder Gemini documents.
func TestSignaturesAcrossProviders(t *testing.T) {
	for _, model := range []string{"gemini-2.5-flash", "gemini-3-flash-preview"} {
		t.Run(model, func(t *testing.T) { signaturesAcrossProviders(t, model) })
	}
}

// geminiPlaceholder is the bytes of the thought signature Gemini takes for a
// call it did not make, which its documentation writes as base64url text.
var geminiPlaceholder, _ = base64.URLEncoding.DecodeString("skip_thought_signature_validator")

// unsignedGemini3Call is what Gemini 3 says of a request whose current turn
// (the contents since the last user content that answers no call) has a
// model step whose first function call carries no signature, or a
// signature neither its own nor the placeholder; "" when there is none.
func unsignedGemini3Call(b map[string]any, own string) string {
	contents, _ := b["contents"].([]any)
	start := 0
	for i, c := range contents {
		c, _ := c.(map[string]any)
		parts, _ := c["parts"].([]any)
		answers := false
		for _, p := range parts {
			_, fr := p.(map[string]any)["functionResponse"]
			answers = answers || fr
		}
		if c["role"] == "user" && !answers {
			start = i + 1
		}
	}
	for i, c := range contents[start:] {
		parts, _ := c.(map[string]any)["parts"].([]any)
		for j, p := range parts {
			p := p.(map[string]any)
			if _, call := p["functionCall"]; !call {
				continue
			}
			sig, _ := p["thoughtSignature"].(string)
			if sig == "" {
				return fmt.Sprintf("Function call is missing a thought_signature in functionCall parts. This is required for tools to work correctly, and missing thought_signature may lead to degraded model performance. Additional data, function call `default_api:current_time` , position %d. Please refer to https://ai.google.dev/gemini-api/docs/thought-signatures for more details.", start+i+j+1)
			}
			// The field is bytes: either base64 alphabet reads.
			got, err := base64.StdEncoding.DecodeString(sig)
			if err != nil {
				got, err = base64.URLEncoding.DecodeString(sig)
			}
			if sig != own && (err != nil || !bytes.Equal(got, geminiPlaceholder)) {
				return "Corrupted thought signature."
			}
			break
		}
	}
	return ""
}

func signaturesAcrossProviders(t *testing.T, geminiModel string) {
	t.Setenv("TEST_ANTHROPIC_KEY", "test-key-0123456789")
	t.Setenv("TEST_GEMINI_KEY", "test-key-0123456789")
	const claudeSig, geminiSig = "EqQBCgIYAhIMY2xhdWRl", "Z2VtaW5pLXNpZw=="
	claude := newStrictUpstream(t, func(b map[string]any) *refusal {
		var no *refusal
		walk(b["messages"], func(o map[string]any) {
			if o["type"] == "thinking" && o["signature"] != claudeSig && no == nil {
				no = anthropicRefusal("messages.1.content.0: Invalid `signature` in `thinking` block")
			}
		})
		return no
	},
		anthropicSSE([]string{anthropicThinkingBlock(0, "Check the clock.", claudeSig), anthropicToolBlock(1, "toolu_01", "current_time", `{"zone":"UTC"}`)}, "tool_use"),
		`event: error`+"\n"+`data: {"type":"error","error":{"type":"not_found_error","message":"model: claude-sonnet-4-5"}}`+"\n\n",
		anthropicSSE([]string{anthropicTextBlock(0, "Welcome.")}, "end_turn"),
	)
	gemini := newStrictUpstream(t, func(b map[string]any) *refusal {
		var no *refusal
		walk(b["contents"], func(o map[string]any) {
			if s, ok := o["thoughtSignature"].(string); ok && s != geminiSig && no == nil {
				if b, err := base64.StdEncoding.DecodeString(s); err != nil || !bytes.Equal(b, geminiPlaceholder) || !strings.HasPrefix(geminiModel, "gemini-3") {
					no = geminiRefusal("Corrupted thought signature.")
				}
			}
		})
		if msg := unsignedGemini3Call(b, geminiSig); no == nil && msg != "" && strings.HasPrefix(geminiModel, "gemini-3") {
			no = geminiRefusal(msg)
		}
		return no
	}, geminiSSE(`{"text":"It is late.","thoughtSignature":"`+geminiSig+`"}`, "STOP"))
	w := serveYAML(t, fmt.Sprintf(`
providers:
  an: {type: anthropic, base_url: %s, api_key_env: TEST_ANTHROPIC_KEY}
  gm: {type: gemini, base_url: %s, api_key_env: TEST_GEMINI_KEY}
models:
  claude: {provider: an, model: claude-sonnet-4-5, fallbacks: [gemini], retry: {initial_backoff: 1ms, max_backoff: 2ms}}
  gemini: {provider: gm, model: %s, retry: {initial_backoff: 1ms, max_backoff: 2ms}}
  claude2: {provider: an, model: claude-sonnet-4-5}
default_model: claude
`, claude.URL, gemini.URL, geminiModel))
	reasoning := &turnstilev1.GenerationOptions{Reasoning: &turnstilev1.Reasoning{Effort: turnstilev1.ReasoningEffort_REASONING_EFFORT_LOW}}
	conv := wiretest.UserText("time?")
	evs, st := wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: conv, Generation: reasoning}, nil)
	if st.Code() != codes.OK {
		t.Fatalf("status %v", st)
	}
	want := "TurnStarted LlmCallStarted ThinkingDelta ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted ToolFinished MessageCompleted " +
		"LlmCallStarted LlmCallFinished Fallback LlmCallStarted ThinkingDelta TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
	if got := wiretest.Names(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	added := evs[len(evs)-1].GetTurnCompleted().GetMessages()
	signers := map[string]string{}
	for _, m := range added {
		for _, p := range m.GetParts() {
			if th := p.GetThinking(); th != nil {
				signers[th.GetSignature()] = th.GetSigner()
			}
		}
	}
	if signers[claudeSig] != "anthropic" || signers[geminiSig] != "gemini" {
		t.Errorf("signers %v", signers)
	}
	// The conversation, Gemini's signature in it, goes back to Claude (an
	// alias of its own: claude cools down after its failure).
	conv = append(append(conv, added...), wiretest.UserText("thanks")...)
	evs, st = wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Model: "claude2", Messages: conv, Generation: reasoning}, nil)
	if st.Code() != codes.OK || committedText(evs) != "Welcome." {
		t.Fatalf("status %v, committed %q", st, committedText(evs))
	}
	bodies, refused := claude.requests()
	if refused != 0 {
		t.Errorf("Claude refused %d requests", refused)
	}
	if last := bodies[len(bodies)-1]; strings.Contains(last, geminiSig) || !strings.Contains(last, claudeSig) {
		t.Errorf("Claude was sent %s", last)
	}
	gbodies, grefused := gemini.requests()
	if grefused != 0 || strings.Contains(gbodies[0], claudeSig) {
		t.Errorf("Gemini refused %d requests; was sent %s", grefused, gbodies[0])
	}
	for i, b := range append(bodies, gbodies...) {
		t.Logf("body %d: %s", i+1, b)
	}
}
