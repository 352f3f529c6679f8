package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
)

// tripHistory is five exchanges about a trip, then the question: 1 140
// bytes, about 285 tokens by bytes, over 0.8 of a window of 300.
func tripHistory() []*turnstilev1.Message {
	text := func(role turnstilev1.Role, s string) *turnstilev1.Message {
		return &turnstilev1.Message{Role: role, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: s}}}}
	}
	var msgs []*turnstilev1.Message
	for i := range 5 {
		msgs = append(msgs,
			text(turnstilev1.Role_ROLE_USER, fmt.Sprintf("question %d: %s", i, strings.Repeat("q", 100))),
			text(turnstilev1.Role_ROLE_ASSISTANT, fmt.Sprintf("answer %d: %s", i, strings.Repeat("a", 100))))
	}
	return append(msgs, text(turnstilev1.Role_ROLE_USER, "and the last question?"))
}

// TestCompactionBeforeTheCallThroughEachAdapter: a conversation near the
// model's window is compacted before the call, through each real adapter
// and the real gRPC server: the compaction event comes before
// llm_call_started, the one request the fake API receives is the shorter
// conversation, and it carries the adapter's prompt cache marks.
func TestCompactionBeforeTheCallThroughEachAdapter(t *testing.T) {
	cacheMark := map[string]string{
		"openai":    `"prompt_cache_key":"ts-`,
		"anthropic": `"cache_control":{"type":"ephemeral"}`,
		"gemini":    "", // implicit caching: nothing to send
	}
	for _, pc := range providerCases(t) {
		t.Run(pc.typ, func(t *testing.T) {
			t.Setenv(pc.keyEnv, "test-key-0123456789")
			up := newUpstream(t, pc.answer)
			yaml := strings.Replace(providerYAML(pc, up.URL), "retry: {", "context_window: 300, compaction: {at: 0.8}, retry: {", 1)
			w := serveYAML(t, yaml)
			evs, st := wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: tripHistory()}, nil)
			if st.Code() != codes.OK {
				t.Fatalf("status %v", st)
			}
			want := "TurnStarted Compaction LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
			if got := wiretest.Names(evs); got != want {
				t.Fatalf("events:\n got %s\nwant %s", got, want)
			}
			c := evs[1].GetCompaction()
			if c.GetTrigger() != turnstilev1.CompactionTrigger_COMPACTION_TRIGGER_NEAR_WINDOW || c.GetStrategy() != "keep_ends" ||
				c.GetReplacedFrom() != 1 || c.GetMessagesBefore() != 11 || c.GetMessagesAfter() != uint32(11-c.GetReplacedCount()+1) {
				t.Errorf("compaction %v", c)
			}
			reqs := up.requests()
			if len(reqs) != 1 {
				t.Fatalf("%d upstream requests", len(reqs))
			}
			body := reqs[0]
			for _, kept := range []string{"question 0:", "omitted to fit the context window", "and the last question?"} {
				if !strings.Contains(body, kept) {
					t.Errorf("the request lacks %q: %s", kept, body)
				}
			}
			for _, dropped := range []string{"answer 0:", "question 1:", "answer 3:"} {
				if strings.Contains(body, dropped) {
					t.Errorf("the request still holds %q", dropped)
				}
			}
			if mark := cacheMark[pc.typ]; mark != "" && !strings.Contains(body, mark) {
				t.Errorf("the request lacks the cache mark %s", mark)
			}
		})
	}
}

// TestSummarizeThroughTheServer: with strategy summarize, the summary
// model (another provider's adapter behind its own fake API) is called
// with the dropped middle, and its summary reaches the model's request in
// its place; when the summary call fails, the turn goes on compacted by
// keep_ends and the event says why.
func TestSummarizeThroughTheServer(t *testing.T) {
	cases := []struct {
		name       string
		summarizer http.HandlerFunc
		strategy   string
		summaryErr string
		inRequest  string
		// events is the turn's events: a summary call that used tokens
		// is followed by the turn's running totals.
		events string
	}{{
		name: "the summary replaces the middle",
		summarizer: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, openaiAnswer("They asked four questions about q and got answers about a."))
		},
		strategy:  "summarize",
		inRequest: "They asked four questions about q and got answers about a.",
		events:    "TurnStarted Usage Compaction LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted",
	}, {
		name: "a failed summary falls back to keep_ends",
		summarizer: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, `{"error":{"message":"The server had an error while processing your request.","type":"server_error"}}`)
		},
		strategy:   "keep_ends",
		summaryErr: "the summary call to cheap failed: SERVER_ERROR: ",
		inRequest:  "omitted to fit the context window",
		events:     "TurnStarted Compaction LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted",
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("TEST_ANTHROPIC_KEY", "test-key-0123456789")
			t.Setenv("TEST_OPENAI_KEY", "test-key-9876543210")
			var pc providerCase
			for _, c := range providerCases(t) {
				if c.typ == "anthropic" {
					pc = c
				}
			}
			up := newUpstream(t, pc.answer)
			var (
				mu            sync.Mutex
				summaryBodies []string
			)
			cheap := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				summaryBodies = append(summaryBodies, string(b))
				mu.Unlock()
				tc.summarizer(w, r)
			}))
			t.Cleanup(cheap.Close)
			yaml := fmt.Sprintf(`
providers:
  up: {type: anthropic, base_url: %s, api_key_env: TEST_ANTHROPIC_KEY}
  small: {type: openai, base_url: %s, api_key_env: TEST_OPENAI_KEY}
models:
  m: {provider: up, model: claude-sonnet-4-5, context_window: 300, compaction: {strategy: summarize, model: cheap}, retry: {initial_backoff: 1ms, max_backoff: 2ms}}
  cheap: {provider: small, model: gpt-4.1-nano, retry: {max_retries: 0}}
default_model: m
`, up.URL, cheap.URL)
			w := serveYAML(t, yaml)
			evs, st := wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: tripHistory()}, nil)
			if st.Code() != codes.OK {
				t.Fatalf("status %v", st)
			}
			if got := wiretest.Names(evs); got != tc.events {
				t.Fatalf("events:\n got %s\nwant %s", got, tc.events)
			}
			var c *turnstilev1.Compaction
			for _, ev := range evs {
				if ev.GetCompaction() != nil {
					c = ev.GetCompaction()
				}
			}
			if u := evs[1].GetUsage(); u != nil && (u.GetInputTokens() != 30 || u.GetOutputTokens() != 4) {
				t.Errorf("usage after the summary call %v, want its 30/4 tokens", u)
			}
			if c.GetStrategy() != tc.strategy || !strings.HasPrefix(c.GetSummaryError(), tc.summaryErr) || (tc.summaryErr == "") != (c.GetSummaryError() == "") {
				t.Errorf("compaction strategy %q, summary_error %q", c.GetStrategy(), c.GetSummaryError())
			}
			if strings.Contains(c.GetSummaryError(), "test-key") || strings.Contains(c.GetSummaryError(), cheap.URL) {
				t.Errorf("summary_error %q holds a key or the provider's URL", c.GetSummaryError())
			}
			t.Logf("summary_error: %q", c.GetSummaryError())
			mu.Lock()
			defer mu.Unlock()
			if len(summaryBodies) != 1 || !strings.Contains(summaryBodies[0], "answer 0:") || strings.Contains(summaryBodies[0], "question 0:") {
				t.Errorf("the summary model got %d calls: %v; want one with the dropped middle only", len(summaryBodies), summaryBodies)
			}
			reqs := up.requests()
			if len(reqs) != 1 || !strings.Contains(reqs[0], tc.inRequest) || strings.Contains(reqs[0], "answer 0:") {
				t.Errorf("the model's request lacks %q or still holds the middle: %v", tc.inRequest, reqs)
			}
			if got := c.GetReplacement(); len(got) != 1 || !strings.Contains(got[0].GetParts()[0].GetText(), tc.inRequest) {
				t.Errorf("replacement %v", got)
			}
		})
	}
}
