package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/livetest"
)

// The conformance scenarios every client runs against a live server; the
// TypeScript and Python clients run the same file.
const conformanceDir = "../clients/conformance"

type conformance struct {
	// Client holds the client options of every scenario.
	Client    clientOptions `json:"client"`
	Scenarios []struct {
		Name   string `json:"name"`
		Prompt string `json:"prompt"`
		// History holds the messages sent before the prompt.
		History []historyMessage `json:"history"`
		// Media are sent after the prompt, each made with the client's
		// helper from its bytes.
		Media []scenarioMedia `json:"media"`
		// Request holds fields of the request, in protojson.
		Request  json.RawMessage `json:"request"`
		CancelOn string          `json:"cancel_on"`
		// ReadLog reads the run's stored log once the turn ended.
		ReadLog bool `json:"read_log"`
		// Server names the server's configuration: "" is server.yaml,
		// another name NAME.yaml.
		Server string `json:"server"`
		Cut    *struct {
			On   string `json:"on"`
			Then string `json:"then"`
		} `json:"cut"`
		// Client overrides the file's client options.
		Client clientOptions  `json:"client"`
		Expect map[string]any `json:"expect"`
		hitlScenario
	} `json:"scenarios"`
}

// historyMessage is a message of a scenario's history.
type historyMessage struct {
	Role string `json:"role"`
	Text string `json:"text"`
}

// scenarioMedia is one media of a scenario's user message.
type scenarioMedia struct {
	MimeType string `json:"mime_type"`
	Name     string `json:"name"`
	Data     []byte `json:"data_base64"` // encoding/json decodes base64
}

// scenarioRequest is the scenario's history, then the prompt and the media
// as one user message.
func scenarioRequest(history []historyMessage, prompt string, media []scenarioMedia) *turnstilev1.RunTurnRequest {
	req := userRequest(prompt)
	for _, m := range media {
		req.Messages[0].Parts = append(req.Messages[0].Parts, client.MediaPart(m.Data, m.MimeType, m.Name))
	}
	for i := len(history) - 1; i >= 0; i-- {
		h := history[i]
		role := turnstilev1.Role(turnstilev1.Role_value["ROLE_"+h.Role])
		req.Messages = append([]*turnstilev1.Message{{Role: role, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: h.Text}}}}}, req.Messages...)
	}
	return req
}

// clientOptions are a runner's client options, in milliseconds.
type clientOptions map[string]int

// newConformanceClient returns a plaintext client for addr with opts,
// logging to logger; the test's cleanup closes it.
func newConformanceClient(t *testing.T, addr string, opts clientOptions, logger *slog.Logger) *client.Client {
	t.Helper()
	ms := func(k string) time.Duration { return time.Duration(opts[k]) * time.Millisecond }
	copts := []client.Option{client.WithInsecure(), client.WithLogger(logger),
		client.WithMaxStepRetries(opts["max_step_retries"]),
		client.WithBackoff(client.Backoff{Initial: ms("backoff_initial_ms"), Max: ms("backoff_max_ms"), Multiplier: 2}),
		client.WithReattachTimeout(ms("reattach_timeout_ms")),
		client.WithReattachBackoff(client.Backoff{Initial: ms("reattach_backoff_initial_ms"), Max: ms("reattach_backoff_max_ms"), Multiplier: 2})}
	if n, ok := opts["max_reattaches"]; ok {
		copts = append(copts, client.WithMaxReattaches(n))
	}
	c, err := client.New(addr, copts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// reattachCounter is a slog.Handler that counts the client's re-attaches.
type reattachCounter struct{ n atomic.Int32 }

func (h *reattachCounter) Enabled(context.Context, slog.Level) bool { return true }

func (h *reattachCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "turnstile: re-attaching to the turn" {
		h.n.Add(1)
	}
	return nil
}

func (h *reattachCounter) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h *reattachCounter) WithGroup(string) slog.Handler { return h }

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

func observe(t *testing.T, c *client.Client, req *turnstilev1.RunTurnRequest, cancelOn string, readLog bool, h *hitlRun) observation {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	turn := c.RunTurn(ctx, req, h.turnOptions()...)
	obs := observation{"step_retries": []any{}, "tools_started": []any{}, "seq_gapless": true, "terminal_events": float64(0), "compactions": float64(0)}
	if readLog {
		defer func() { observeLog(t, c, turn.ID(), obs) }()
	}
	var kept keptText
	var turnErr error
	next := map[int]uint64{} // the seq each attempt's next event must have
	for ev, err := range turn.Events() {
		if err != nil {
			turnErr = err
			break
		}
		kept.event(ev)
		h.event(t, turn, ev, obs)
		if ev.Agent != nil {
			if ev.Agent.GetSeq() != next[ev.Attempt]+1 {
				obs["seq_gapless"] = false
			}
			next[ev.Attempt] = ev.Agent.GetSeq()
		}
		if sr := ev.StepRetry; sr != nil {
			obs["step_retries"] = append(obs["step_retries"].([]any), map[string]any{
				"attempt": float64(sr.Attempt), "code": client.CodeName(sr.Err.Code),
				"discard_partial": sr.DiscardPartial, "messages": float64(len(sr.Messages)),
			})
			continue
		}
		if ev.Agent.GetError() != nil || ev.Agent.GetTurnCompleted() != nil {
			obs["terminal_events"] = obs["terminal_events"].(float64) + 1
		}
		if ev.Agent.GetCompaction() != nil {
			obs["compactions"] = obs["compactions"].(float64) + 1
		}
		if ts := ev.Agent.GetToolStarted(); ts != nil {
			obs["tools_started"] = append(obs["tools_started"].([]any), ts.GetName())
		}
		if cancelOn == "text_delta" && ev.Agent.GetTextDelta() != nil {
			cancel()
		}
	}
	obs["kept_text"] = kept.String()
	h.done(turn.Result(), obs)
	if res := turn.Result(); res != nil {
		obs["outcome"] = "completed"
		obs["end_reason"] = enumName(res.EndReason, "END_REASON_")
		obs["attempts"] = float64(res.Attempts)
		obs["reattaches"] = float64(res.Reattaches)
		obs["roles"] = roles(res.Messages)
		obs["conversation_roles"] = roles(res.Conversation)
		if n := len(res.Messages); n > 0 {
			obs["final_text"] = messageText(res.Messages[n-1])
		}
		obs["cost"], obs["cost_partial"] = "none", res.Usage.GetCostPartial()
		if c := res.Usage.GetCost(); c != nil {
			obs["cost"] = fmt.Sprintf("%s %d.%09d", c.GetCurrency(), c.GetUnits(), c.GetNanos())
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
	obs["reattaches"] = float64(te.Reattaches)
	obs["roles"] = roles(te.Messages)
	obs["conversation_roles"] = roles(te.Conversation)
	if te.Status != nil {
		obs["status"] = statusName(te.Status.Code())
	}
	return obs
}

// observeLog reads the run's stored log and notes its model calls and
// how it ends.
func observeLog(t *testing.T, c *client.Client, turnID string, obs observation) {
	log := storedLog(t, c, turnID)
	calls := 0
	for _, ev := range log {
		if ev.GetLlmCallStarted() != nil {
			calls++
		}
	}
	obs["log_model_calls"] = float64(calls)
	if len(log) > 0 {
		switch last := log[len(log)-1]; {
		case last.GetTurnCompleted() != nil:
			obs["log_end"] = "COMPLETED"
		case last.GetError() != nil:
			obs["log_end"] = client.CodeName(last.GetError().GetCode())
		}
	}
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
	servers := map[string]string{}
	for _, sc := range conf.Scenarios {
		if _, ok := servers[sc.Server]; !ok {
			config := "server.yaml"
			if sc.Server != "" {
				config = sc.Server + ".yaml"
			}
			servers[sc.Server] = livetest.Serve(t, "..", filepath.Join(conformanceDir, config))
		}
	}
	for _, sc := range conf.Scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			opts := maps.Clone(conf.Client)
			maps.Copy(opts, sc.Client)
			addr := servers[sc.Server]
			if sc.Cut != nil {
				addr = newCutProxy(t, addr, sc.Cut.On, sc.Cut.Then == "refuse").addr()
			}
			var reattaches reattachCounter
			c := newConformanceClient(t, addr, opts, slog.New(&reattaches))
			req := scenarioRequest(sc.History, sc.Prompt, sc.Media)
			if sc.Request != nil {
				msgs := req.Messages
				if err := protojson.Unmarshal(sc.Request, req); err != nil {
					t.Fatalf("request: %v", err)
				}
				req.Messages = msgs
			}
			obs := observe(t, c, req, sc.CancelOn, sc.ReadLog, &hitlRun{sc: sc.hitlScenario})
			// The count the turn reports is the count the client logged.
			if got, logged := obs["reattaches"], float64(reattaches.n.Load()); got != logged {
				t.Errorf("reattaches = %v, but the client logged %v re-attaches", got, logged)
			}
			for k, want := range sc.Expect {
				if got := obs[k]; !reflect.DeepEqual(got, want) {
					t.Errorf("%s = %#v, want %#v", k, got, want)
				}
			}
		})
	}
}
