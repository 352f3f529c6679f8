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

// keyedUpstream is a fake OpenAI API behind which several keys share one
// endpoint: it records which key each call came with, and answers the
// keys in limited with a 429, the others with text.
type keyedUpstream struct {
	*httptest.Server
	mu      sync.Mutex
	keys    []string
	limited map[string]bool
}

func newKeyedUpstream(t *testing.T, limited ...string) *keyedUpstream {
	t.Helper()
	u := &keyedUpstream{limited: map[string]bool{}}
	for _, k := range limited {
		u.limited[k] = true
	}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		u.mu.Lock()
		u.keys = append(u.keys, key)
		limited := u.limited[key]
		u.mu.Unlock()
		if limited {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, openaiAnswer("served by "+key[:5]))
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *keyedUpstream) calls() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.keys...)
}

// deploymentsYAML configures model m over two keys of one endpoint, with
// a fallback on a third key.
func deploymentsYAML(url string) string {
	return fmt.Sprintf(`
providers:
  key-a: {type: openai, base_url: %[1]s, api_key_env: DEPLOY_KEY_A}
  key-b: {type: openai, base_url: %[1]s, api_key_env: DEPLOY_KEY_B}
  key-c: {type: openai, base_url: %[1]s, api_key_env: DEPLOY_KEY_C}
models:
  m:
    deployments:
      - {name: a, provider: key-a, model: gpt-4.1-mini}
      - {name: b, provider: key-b, model: gpt-4.1-mini}
    fallbacks: [other]
    retry: {initial_backoff: 1ms, max_backoff: 2ms}
  other: {provider: key-c, model: gpt-4.1-nano}
default_model: m
`, url)
}

// TestDeploymentsThroughServer runs turns through the real OpenAI adapter
// and gRPC server on a model of two keys: a 429 on one key is served by
// the other deployment, as a retry naming it, with no fallback, and the
// limited key then cools down, so the next turn goes to the other key
// straight away.
func TestDeploymentsThroughServer(t *testing.T) {
	t.Setenv("DEPLOY_KEY_A", "key-aaaaaaaaaaaa")
	t.Setenv("DEPLOY_KEY_B", "key-bbbbbbbbbbbb")
	t.Setenv("DEPLOY_KEY_C", "key-cccccccccccc")
	up := newKeyedUpstream(t, "key-aaaaaaaaaaaa")
	w := serveYAML(t, deploymentsYAML(up.URL))

	evs, st := wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("hi")}, nil)
	if st.Code() != codes.OK {
		t.Fatalf("status %v", st)
	}
	want := "TurnStarted LlmCallStarted LlmCallFinished Retry LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
	if got := wiretest.Names(evs); got != want {
		t.Fatalf("events:\n got %s\nwant %s", got, want)
	}
	var served []string
	for _, ev := range evs {
		if s := ev.GetLlmCallStarted(); s != nil {
			served = append(served, s.GetDeployment()+"/"+s.GetProvider()+"/"+s.GetModel())
		}
		if r := ev.GetRetry(); r != nil {
			if r.GetToDeployment() != "b" || r.GetReason() != turnstilev1.ErrorCode_ERROR_CODE_RATE_LIMITED || r.GetModel() != "m" || r.GetDelay().AsDuration() != 0 || r.GetAttempt() != 2 {
				t.Errorf("retry = %v; want to_deployment b, RATE_LIMITED, model m, no delay, attempt 2", r)
			}
		}
		if ev.GetLlmCallFinished() != nil && ev.GetLlmCallFinished().GetError() == nil && ev.GetSeq() < 4 {
			t.Errorf("the first call finished without its error: %v", ev)
		}
	}
	if got, want := strings.Join(served, " "), "a/key-a/m b/key-b/m"; got != want {
		t.Errorf("llm_call_started deployments %s, want %s", got, want)
	}
	text := evs[len(evs)-1].GetTurnCompleted().GetMessages()[0].GetParts()[0].GetText()
	if text != "served by key-b" {
		t.Errorf("committed %q; want the reply of key b", text)
	}
	if got, want := strings.Join(up.calls(), " "), "key-aaaaaaaaaaaa key-bbbbbbbbbbbb"; got != want {
		t.Errorf("upstream saw keys %s, want %s", got, want)
	}

	// Key a cools down for its Retry-After: the next turns go to b alone.
	for i := range 3 {
		evs, st := wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: wiretest.UserText(fmt.Sprint("again ", i))}, nil)
		if st.Code() != codes.OK {
			t.Fatalf("turn %d: status %v", i, st)
		}
		if got, want := wiretest.Names(evs), "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"; got != want {
			t.Errorf("turn %d events:\n got %s\nwant %s", i, got, want)
		}
		if d := evs[1].GetLlmCallStarted().GetDeployment(); d != "b" {
			t.Errorf("turn %d went to deployment %q during a's cooldown", i, d)
		}
	}
	if n := len(up.calls()); n != 5 {
		t.Errorf("upstream got %d calls, want 5", n)
	}
}
