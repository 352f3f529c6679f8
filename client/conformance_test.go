package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/livetest"
)

// The conformance scenarios every client runs against a live server; the
// TypeScript and Python clients run the same file.
const conformanceDir = "../clients/conformance"

type conformance struct {
	Client struct {
		MaxStepRetries   int `json:"max_step_retries"`
		BackoffInitialMS int `json:"backoff_initial_ms"`
		BackoffMaxMS     int `json:"backoff_max_ms"`
	} `json:"client"`
	Scenarios []struct {
		Name     string         `json:"name"`
		Prompt   string         `json:"prompt"`
		CancelOn string         `json:"cancel_on"`
		Expect   map[string]any `json:"expect"`
	} `json:"scenarios"`
}

// observation is what a runner saw of one scenario, in the scenario
// file's vocabulary.
type observation map[string]any

func enumName[E interface{ String() string }](e E, prefix string) string {
	return strings.TrimPrefix(e.String(), prefix)
}

// statusName spells a gRPC code as the specification does: FAILED_PRECONDITION.
func statusName(c codes.Code) string {
	var b strings.Builder
	for i, r := range c.String() {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String())
}

func roles(msgs []*turnstilev1.Message) []any {
	out := []any{}
	for _, m := range msgs {
		out = append(out, enumName(m.GetRole(), "ROLE_"))
	}
	return out
}

func messageText(m *turnstilev1.Message) string {
	var b strings.Builder
	for _, p := range m.GetParts() {
		b.WriteString(p.GetText())
	}
	return b.String()
}

// keptText follows the discard signals as a consumer must: a server retry
// or fallback drops its attempt's deltas from discard_from_seq on; a step
// retry that discards drops everything since the last message that stands.
type keptText struct {
	deltas []delta
	marks  []int // len(deltas) at each committed message
}

type delta struct {
	attempt int
	seq     uint64
	text    string
}

func (k *keptText) event(ev *client.Event) {
	if sr := ev.StepRetry; sr != nil {
		if sr.DiscardPartial {
			m := len(sr.Messages)
			cut := 0
			if m > 0 && m <= len(k.marks) {
				cut = k.marks[m-1]
			}
			k.deltas, k.marks = k.deltas[:cut], k.marks[:min(m, len(k.marks))]
		}
		return
	}
	a := ev.Agent
	drop := func(from uint64) {
		kept := k.deltas[:0]
		for _, d := range k.deltas {
			if d.attempt != ev.Attempt || d.seq < from {
				kept = append(kept, d)
			}
		}
		k.deltas = kept
	}
	switch {
	case a.GetTextDelta() != nil:
		k.deltas = append(k.deltas, delta{ev.Attempt, a.GetSeq(), a.GetTextDelta().GetText()})
	case a.GetMessageCompleted() != nil:
		k.marks = append(k.marks, len(k.deltas))
	case a.GetRetry().GetDiscardPartial():
		drop(a.GetRetry().GetDiscardFromSeq())
	case a.GetFallback().GetDiscardPartial():
		drop(a.GetFallback().GetDiscardFromSeq())
	}
}

func (k *keptText) String() string {
	var b strings.Builder
	for _, d := range k.deltas {
		b.WriteString(d.text)
	}
	return b.String()
}

func observe(t *testing.T, c *client.Client, prompt, cancelOn string) observation {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	turn := c.RunTurn(ctx, userRequest(prompt))
	obs := observation{"step_retries": []any{}, "tools_started": []any{}}
	var kept keptText
	var turnErr error
	for ev, err := range turn.Events() {
		if err != nil {
			turnErr = err
			break
		}
		kept.event(ev)
		if sr := ev.StepRetry; sr != nil {
			obs["step_retries"] = append(obs["step_retries"].([]any), map[string]any{
				"attempt": float64(sr.Attempt), "code": client.CodeName(sr.Err.Code),
				"discard_partial": sr.DiscardPartial, "messages": float64(len(sr.Messages)),
			})
			continue
		}
		if ts := ev.Agent.GetToolStarted(); ts != nil {
			obs["tools_started"] = append(obs["tools_started"].([]any), ts.GetName())
		}
		if cancelOn == "text_delta" && ev.Agent.GetTextDelta() != nil {
			cancel()
		}
	}
	obs["kept_text"] = kept.String()
	if res := turn.Result(); res != nil {
		obs["outcome"] = "completed"
		obs["end_reason"] = enumName(res.EndReason, "END_REASON_")
		obs["attempts"] = float64(res.Attempts)
		obs["roles"] = roles(res.Messages)
		if n := len(res.Messages); n > 0 {
			obs["final_text"] = messageText(res.Messages[n-1])
		}
		return obs
	}
	var te *client.TurnError
	if !errors.As(turnErr, &te) {
		t.Fatalf("the turn ended with %v, want a result or a *client.TurnError", turnErr)
	}
	obs["outcome"] = "error"
	obs["code"] = client.CodeName(te.Code)
	obs["retryable"] = te.Retryable
	obs["attempts"] = float64(te.Attempts)
	obs["roles"] = roles(te.Messages)
	if te.Status != nil {
		obs["status"] = statusName(te.Status.Code())
	}
	return obs
}

// TestConformance runs the shared scenarios against a live `turnstile
// serve` on the embedded simulator.
func TestConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts the turnstile binary")
	}
	b, err := os.ReadFile(filepath.Join(conformanceDir, "scenarios.json"))
	if err != nil {
		t.Fatal(err)
	}
	var conf conformance
	if err := json.Unmarshal(b, &conf); err != nil {
		t.Fatal(err)
	}
	addr := livetest.Serve(t, "..", filepath.Join(conformanceDir, "server.yaml"))
	c, err := client.New(addr, client.WithInsecure(),
		client.WithMaxStepRetries(conf.Client.MaxStepRetries),
		client.WithBackoff(client.Backoff{
			Initial:    time.Duration(conf.Client.BackoffInitialMS) * time.Millisecond,
			Max:        time.Duration(conf.Client.BackoffMaxMS) * time.Millisecond,
			Multiplier: 2,
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, sc := range conf.Scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			obs := observe(t, c, sc.Prompt, sc.CancelOn)
			for k, want := range sc.Expect {
				if got := obs[k]; !reflect.DeepEqual(got, want) {
					t.Errorf("%s = %#v, want %#v", k, got, want)
				}
			}
		})
	}
}
