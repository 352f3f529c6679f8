package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"

	"github.com/turnstile-dev/turnstile/config"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/runtime"
)

// upstream is a fake provider API that answers each call with the next
// scripted SSE body (the last one repeats) and records request bodies.
type upstream struct {
	*httptest.Server
	mu     sync.Mutex
	bodies []string
}

func newUpstream(t *testing.T, replies ...string) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		n := len(u.bodies)
		u.bodies = append(u.bodies, string(b))
		u.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		for _, event := range strings.SplitAfter(replies[min(n, len(replies)-1)], "\n\n") {
			io.WriteString(w, event)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) requests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.bodies...)
}

func readFixture(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// providerCase is one real provider adapter behind a fake API.
type providerCase struct {
	typ, model, keyEnv string
	// toolCall answers with a call of current_time {"zone":"UTC"}.
	toolCall string
	// answer answers with text; answerText with the text given.
	answer     string
	answerText func(text string) string
	// midStream streams some text, then fails inside the stream with an
	// overloaded error.
	midStream string
	// midKind is the class of the mid-stream failure; midText the text it
	// streams first.
	midKind turnstilev1.ErrorCode
	midText string
	// prefill reports that the API continues a trailing assistant message.
	prefill bool
	// toolEvents and midEvents are the expected event sequences.
	toolEvents, midEvents string
	// sawToolResult reports whether a request body carries the tool result.
	sawToolResult func(body string) bool
}

func providerCases(t *testing.T) []providerCase {
	cases := providerCaseList(t)
	for i := range cases {
		cases[i].answer = cases[i].answerText("It is late.")
	}
	return cases
}

// openaiAnswer is a Chat Completions stream answering text.
func openaiAnswer(text string) string {
	return `data: {"id":"c2","object":"chat.completion.chunk","model":"gpt-4.1-mini","choices":[{"index":0,"delta":{"role":"assistant","content":` + jsonString(text) + `},"finish_reason":null}]}` + "\n\n" +
		`data: {"id":"c2","object":"chat.completion.chunk","model":"gpt-4.1-mini","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n" +
		`data: {"id":"c2","object":"chat.completion.chunk","model":"gpt-4.1-mini","choices":[],"usage":{"prompt_tokens":30,"completion_tokens":4,"total_tokens":34}}` + "\n\n" +
		"data: [DONE]\n\n"
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func providerCaseList(t *testing.T) []providerCase {
	const (
		toolTail = " MessageCompleted ToolStarted ToolFinished MessageCompleted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
		midTail  = " Retry LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
	)
	return []providerCase{{
		typ: "openai", model: "gpt-4.1-mini", keyEnv: "TEST_OPENAI_KEY",
		toolCall: `data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4.1-mini","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"current_time","arguments":""}}]},"finish_reason":null}]}` + "\n\n" +
			`data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4.1-mini","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"zone\":\"UTC\"}"}}]},"finish_reason":null}]}` + "\n\n" +
			`data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4.1-mini","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}` + "\n\n" +
			`data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4.1-mini","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":5,"total_tokens":25}}` + "\n\n" +
			"data: [DONE]\n\n",
		answerText: openaiAnswer,
		midStream:  readFixture(t, "../../providers/openai/testdata/openai_midstream_error.sse"),
		midKind:    turnstilev1.ErrorCode_ERROR_CODE_SERVER_ERROR,
		midText:    "Let me",
		toolEvents: "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage" + toolTail,
		midEvents:  "TurnStarted LlmCallStarted TextDelta LlmCallFinished" + midTail,
		sawToolResult: func(b string) bool {
			return strings.Contains(b, `"role":"tool"`) && strings.Contains(b, `"tool_call_id":"call_1"`)
		},
	}, {
		typ: "anthropic", model: "claude-sonnet-4-5", keyEnv: "TEST_ANTHROPIC_KEY",
		toolCall: "event: message_start\ndata: " + `{"type":"message_start","message":{"model":"claude-sonnet-4-5","id":"msg_1","type":"message","role":"assistant","content":[],"stop_reason":null,"usage":{"input_tokens":20,"output_tokens":1}}}` + "\n\n" +
			"event: content_block_start\ndata: " + `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"current_time","input":{}}}` + "\n\n" +
			"event: content_block_delta\ndata: " + `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"zone\": \"UTC\"}"}}` + "\n\n" +
			"event: content_block_stop\ndata: " + `{"type":"content_block_stop","index":0}` + "\n\n" +
			"event: message_delta\ndata: " + `{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":9}}` + "\n\n" +
			"event: message_stop\ndata: " + `{"type":"message_stop"}` + "\n\n",
		answerText: func(text string) string {
			return "event: message_start\ndata: " + `{"type":"message_start","message":{"model":"claude-sonnet-4-5","id":"msg_2","type":"message","role":"assistant","content":[],"stop_reason":null,"usage":{"input_tokens":30,"output_tokens":1}}}` + "\n\n" +
				"event: content_block_start\ndata: " + `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\n\n" +
				"event: content_block_delta\ndata: " + `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":` + jsonString(text) + `}}` + "\n\n" +
				"event: content_block_stop\ndata: " + `{"type":"content_block_stop","index":0}` + "\n\n" +
				"event: message_delta\ndata: " + `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":4}}` + "\n\n" +
				"event: message_stop\ndata: " + `{"type":"message_stop"}` + "\n\n"
		},
		midStream:  readFixture(t, "../../providers/anthropic/testdata/anthropic_midstream_error.sse"),
		midKind:    turnstilev1.ErrorCode_ERROR_CODE_OVERLOADED,
		midText:    "I'd be",
		prefill:    true,
		toolEvents: "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage" + toolTail,
		midEvents:  "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage" + midTail,
		sawToolResult: func(b string) bool {
			return strings.Contains(b, `"tool_result"`) && strings.Contains(b, `"tool_use_id":"toolu_1"`)
		},
	}, {
		typ: "gemini", model: "gemini-2.5-flash", keyEnv: "TEST_GEMINI_KEY",
		toolCall: `data: {"candidates":[{"content":{"parts":[{"functionCall":{"name":"current_time","args":{"zone":"UTC"}},"thoughtSignature":"c2lnbmF0dXJl"}],"role":"model"},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":20,"candidatesTokenCount":5}}` + "\n\n",
		answerText: func(text string) string {
			return `data: {"candidates":[{"content":{"parts":[{"text":` + jsonString(text) + `}],"role":"model"},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":30,"candidatesTokenCount":4}}` + "\n\n"
		},
		midStream:  readFixture(t, "../../providers/gemini/testdata/gemini_midstream_error.sse"),
		midKind:    turnstilev1.ErrorCode_ERROR_CODE_OVERLOADED,
		midText:    "The weather",
		toolEvents: "TurnStarted LlmCallStarted ThinkingDelta ToolCallDelta LlmCallFinished Usage" + toolTail,
		midEvents:  "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage" + midTail,
		sawToolResult: func(b string) bool {
			return strings.Contains(b, `"functionResponse"`) && strings.Contains(b, `"thoughtSignature":"c2lnbmF0dXJl"`)
		},
	}}
}

func providerYAML(pc providerCase, url string) string {
	return fmt.Sprintf(`
providers:
  up: {type: %s, base_url: %s, api_key_env: %s}
models:
  m: {provider: up, model: %s, retry: {initial_backoff: 1ms, max_backoff: 2ms}}
`, pc.typ, url, pc.keyEnv, pc.model)
}

// TestProvidersThroughServer runs a turn with a server-side tool call and a
// turn that fails mid-stream through each real adapter and the real gRPC
// server, against a fake API speaking the provider's wire format.
func TestProvidersThroughServer(t *testing.T) {
	for _, pc := range providerCases(t) {
		t.Run(pc.typ+"/tool call", func(t *testing.T) {
			t.Setenv(pc.keyEnv, "test-key-0123456789")
			up := newUpstream(t, pc.toolCall, pc.answer)
			w := serveYAML(t, providerYAML(pc, up.URL))
			evs, st := wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("what time is it?")}, nil)
			if st.Code() != codes.OK {
				t.Fatalf("status %v", st)
			}
			want := pc.toolEvents
			if got := wiretest.Names(evs); got != want {
				t.Errorf("events:\n got %s\nwant %s", got, want)
			}
			reqs := up.requests()
			if len(reqs) != 2 || !pc.sawToolResult(reqs[1]) {
				t.Errorf("second request does not carry the tool result: %v", reqs)
			}
		})
		t.Run(pc.typ+"/mid-stream failure", func(t *testing.T) {
			t.Setenv(pc.keyEnv, "test-key-0123456789")
			up := newUpstream(t, pc.midStream, pc.answer)
			w := serveYAML(t, providerYAML(pc, up.URL))
			evs, st := wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("weather?")}, nil)
			if st.Code() != codes.OK {
				t.Fatalf("status %v", st)
			}
			want := pc.midEvents
			if got := wiretest.Names(evs); got != want {
				t.Errorf("events:\n got %s\nwant %s", got, want)
			}
			for _, ev := range evs {
				if r := ev.GetRetry(); r != nil && (!r.GetDiscardPartial() || r.GetReason() != pc.midKind) {
					t.Errorf("retry = %v, want %v with discard_partial", r, pc.midKind)
				}
			}
			if got := evs[len(evs)-1].GetTurnCompleted().GetMessages()[0].GetParts()[0].GetText(); got != "It is late." {
				t.Errorf("committed %q: the failed attempt's text leaked in", got)
			}
		})
	}
}

// lastTurns renders the last n messages of a provider request body (the
// messages of OpenAI and Anthropic, the contents of Gemini) as "role:
// text", their text parts joined.
func lastTurns(t *testing.T, body string, n int) []string {
	t.Helper()
	var req struct {
		Messages []map[string]any `json:"messages"`
		Contents []map[string]any `json:"contents"`
	}
	if err := json.Unmarshal([]byte(body), &req); err != nil {
		t.Fatalf("request body: %v", err)
	}
	msgs := append(req.Messages, req.Contents...)
	var out []string
	for _, m := range msgs[max(len(msgs)-n, 0):] {
		var text strings.Builder
		var walk func(v any)
		walk = func(v any) {
			switch v := v.(type) {
			case string:
				text.WriteString(v)
			case []any:
				for _, e := range v {
					walk(e)
				}
			case map[string]any:
				walk(v["text"])
			}
		}
		walk(m["content"])
		walk(m["parts"])
		out = append(out, fmt.Sprint(m["role"])+": "+text.String())
	}
	return out
}

// TestProvidersContinueCutStream: with on_stream_cut: continue, a reply cut
// mid-stream by each real adapter's API is continued, not restarted: the
// retry keeps the text shown, the continuing request carries it (as a
// prefill for Anthropic, else followed by the continuation prompt), and the
// committed reply is the partial text plus the continuation, whole at the
// seam.
func TestProvidersContinueCutStream(t *testing.T) {
	for _, pc := range providerCases(t) {
		t.Run(pc.typ, func(t *testing.T) {
			t.Setenv(pc.keyEnv, "test-key-0123456789")
			const rest = " happy to help with that."
			up := newUpstream(t, pc.midStream, pc.answerText(rest))
			yaml := strings.Replace(providerYAML(pc, up.URL), "retry: {", "on_stream_cut: continue, retry: {", 1)
			w := serveYAML(t, yaml)
			evs, st := wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("weather?")}, nil)
			if st.Code() != codes.OK {
				t.Fatalf("status %v", st)
			}
			if got, want := wiretest.Names(evs), pc.midEvents; got != want {
				t.Errorf("events:\n got %s\nwant %s", got, want)
			}
			for _, ev := range evs {
				if r := ev.GetRetry(); r != nil && (r.GetDiscardPartial() || r.GetDiscardFromSeq() != 0) {
					t.Errorf("retry = %v, want the partial text kept", r)
				}
			}
			want := pc.midText + rest
			if got := evs[len(evs)-1].GetTurnCompleted().GetMessages(); len(got) != 1 || len(got[0].GetParts()) != 1 || got[0].GetParts()[0].GetText() != want {
				t.Errorf("committed %v, want one text part %q", got, want)
			}
			var shown strings.Builder
			for _, ev := range evs {
				shown.WriteString(ev.GetTextDelta().GetText())
			}
			if shown.String() != want {
				t.Errorf("shown %q, want %q", shown.String(), want)
			}
			reqs := up.requests()
			if len(reqs) != 2 {
				t.Fatalf("%d upstream requests, want 2", len(reqs))
			}
			assistant := map[string]string{"openai": "assistant", "anthropic": "assistant", "gemini": "model"}[pc.typ]
			wantTail := []string{"user: weather?", assistant + ": " + pc.midText}
			if !pc.prefill {
				wantTail = []string{assistant + ": " + pc.midText, "user: " + runtime.ContinuationPrompt}
			}
			if diff := cmp.Diff(wantTail, lastTurns(t, reqs[1], 2)); diff != "" {
				t.Errorf("continuing request's last messages (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSimContinueCutStream: the simulator cut mid-reply and continued
// (from a prefill) commits exactly the reply a restart commits.
func TestSimContinueCutStream(t *testing.T) {
	const prompt = "[sim fail=disconnect after=5 times=1] Explain how a turnstile counts the people passing through it."
	committed := map[string]string{}
	for _, cut := range []string{"restart", "continue"} {
		w := serveYAML(t, `
providers:
  sim: {type: simulator, token_delay: 0}
models:
  sim: {provider: sim, model: turnstile-sim-1, on_stream_cut: `+cut+`, retry: {initial_backoff: 1ms, max_backoff: 2ms}}
`)
		evs, st := wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: wiretest.UserText(prompt)}, nil)
		if st.Code() != codes.OK {
			t.Fatalf("%s: status %v", cut, st)
		}
		var shown strings.Builder
		for _, ev := range evs {
			if r := ev.GetRetry(); r != nil && r.GetDiscardPartial() != (cut == "restart") {
				t.Errorf("%s: retry %v", cut, r)
			}
			if r := ev.GetRetry(); r != nil && r.GetDiscardPartial() {
				shown.Reset()
			}
			shown.WriteString(ev.GetTextDelta().GetText())
		}
		msgs := evs[len(evs)-1].GetTurnCompleted().GetMessages()
		if len(msgs) != 1 {
			t.Fatalf("%s: committed %v", cut, msgs)
		}
		committed[cut] = msgs[0].GetParts()[0].GetText()
		if shown.String() != committed[cut] {
			t.Errorf("%s: shown %q, committed %q", cut, shown.String(), committed[cut])
		}
	}
	if committed["continue"] != committed["restart"] {
		t.Errorf("continued reply %q, restarted reply %q", committed["continue"], committed["restart"])
	}
}

// TestProviderKeyMissing: a provider in use whose key variable is empty
// stops serve with the variable's name and the key's place in the file.
func TestProviderKeyMissing(t *testing.T) {
	for _, pc := range providerCases(t) {
		t.Run(pc.typ, func(t *testing.T) {
			t.Setenv(pc.keyEnv, "")
			cfg, err := config.Parse("config.yaml", []byte(providerYAML(pc, "http://127.0.0.1:1")))
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = buildRunner(t.Context(), cfg, slog.New(slog.DiscardHandler))
			want := fmt.Sprintf("config.yaml:3: providers.up.api_key_env: the environment variable %s is empty", pc.keyEnv)
			if err == nil || err.Error() != want {
				t.Errorf("buildRunner error = %v, want %q", err, want)
			}
		})
	}
}
