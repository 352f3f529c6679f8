package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/telemetry"
)

// logLines decodes the JSON lines in b, dropping the time.
func logLines(t *testing.T, b *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not JSON: %s", line)
		}
		delete(m, "time")
		out = append(out, m)
	}
	return out
}

// TestTurnLogCompleted asserts the one line a completed turn with
// retries, a fallback and a tool ends with: every field, numbers as
// numbers, durations in milliseconds, the trace id of the turn's span.
func TestTurnLogCompleted(t *testing.T) {
	p := newPipeline(t)
	var buf bytes.Buffer
	log := telemetry.NewTurnLog(slog.New(slog.NewJSONHandler(&buf, nil)))
	req := userTurn("a secret question")
	req.Client = "team-a"
	req.Metadata = map[string]string{"session": "s-1", "end_user": "u-9"}
	scenario(t, runtime.Observers(observer(t, p, telemetry.ObserverOptions{}), log), req)

	lines := logLines(t, &buf)
	if len(lines) != 1 {
		t.Fatalf("%d lines, want 1:\n%s", len(lines), buf.String())
	}
	line := lines[0]
	for _, k := range []string{"ttft_ms", "wait_ms", "duration_ms"} {
		v, ok := line[k].(float64)
		if !ok || v <= 0 {
			t.Errorf("%s = %#v, want a positive number of milliseconds", k, line[k])
		}
		delete(line, k)
	}
	traceID := p.spans.Ended()[len(p.spans.Ended())-1].SpanContext().TraceID().String()
	want := map[string]any{
		"level": "INFO", "msg": "turn ended", "turn_id": "t1", "trace_id": traceID, "client": "team-a", "model": "a",
		"metadata": map[string]any{"end_user": "u-9", "session": "s-1"},
		"attempts": map[string]any{"a": 3.0, "b": 2.0}, "served_by": "b",
		"model_calls": 5.0, "retries": 2.0, "fallbacks": 1.0, "hedges": 0.0, "compactions": 0.0, "tool_calls": 1.0,
		"input_tokens": 27.0, "output_tokens": 11.0, "cache_read_tokens": 30.0, "cache_write_tokens": 0.0,
		"end_reason": "end_turn",
	}
	if diff := cmp.Diff(want, line); diff != "" {
		t.Errorf("line (-want +got):\n%s", diff)
	}
	if strings.Contains(buf.String(), "secret") || strings.Contains(buf.String(), "done") {
		t.Errorf("the line holds conversation text: %s", buf.String())
	}
}

// TestTurnLogFailed asserts a failed turn's line: its error code, advice,
// the client's message and the root cause, at WARN; an INTERNAL failure at
// ERROR; no trace_id when the turn is not traced.
func TestTurnLogFailed(t *testing.T) {
	for _, tt := range []struct {
		kind  llm.Kind
		level string
	}{
		{llm.KindAuth, "WARN"},
		{llm.KindInternal, "ERROR"},
	} {
		t.Run(tt.kind.String(), func(t *testing.T) {
			var buf bytes.Buffer
			cause := errors.New("dial tcp 10.0.0.1:443: connection refused")
			a := fake.NewProvider(fake.Reply{Err: &llm.Error{Kind: tt.kind, Message: "upstream said no", Err: cause}})
			r, err := runtime.New([]*runtime.Model{{Alias: "a", ProviderName: "oai", Provider: a, ID: "a-id", Retry: fastRetry()}}, "a", nil,
				runtime.WithObserver(telemetry.NewTurnLog(slog.New(slog.NewJSONHandler(&buf, nil)))),
				runtime.WithIDs(func() string { return "t2" }))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.Run(t.Context(), userTurn("hi"), runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil })); err == nil {
				t.Fatal("the turn did not fail")
			}
			lines := logLines(t, &buf)
			if len(lines) != 1 {
				t.Fatalf("%d lines, want 1:\n%s", len(lines), buf.String())
			}
			line := lines[0]
			delete(line, "wait_ms")
			delete(line, "duration_ms")
			want := map[string]any{
				"level": tt.level, "msg": "turn ended", "turn_id": "t2", "model": "a", "attempts": map[string]any{"a": 1.0},
				"model_calls": 1.0, "retries": 0.0, "fallbacks": 0.0, "hedges": 0.0, "compactions": 0.0, "tool_calls": 0.0,
				"input_tokens": 0.0, "output_tokens": 0.0, "cache_read_tokens": 0.0, "cache_write_tokens": 0.0,
				"error_code": tt.kind.String(), "retryable": false, "error": "upstream said no", "cause": "oai: " + tt.kind.String() + ": upstream said no: " + cause.Error(),
			}
			if diff := cmp.Diff(want, line); diff != "" {
				t.Errorf("line (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTurnLogLevel asserts nothing is built when the level is off.
func TestTurnLogLevel(t *testing.T) {
	var buf bytes.Buffer
	log := telemetry.NewTurnLog(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	scenario(t, log, nil)
	if buf.Len() != 0 {
		t.Errorf("a completed turn logged at WARN level: %s", buf.String())
	}
}

// TestTurnLogClipsTheCause: a root cause longer than 4 KiB is cut on the
// line, saying how much was left out.
func TestTurnLogClipsTheCause(t *testing.T) {
	var buf bytes.Buffer
	long := errors.New(strings.Repeat("é", 3000)) // 6000 bytes
	a := fake.NewProvider(fake.Reply{Err: &llm.Error{Kind: llm.KindInternal, Message: "boom", Err: long}})
	r, err := runtime.New([]*runtime.Model{{Alias: "a", ProviderName: "oai", Provider: a, ID: "a-id", Retry: fastRetry()}}, "a", nil,
		runtime.WithObserver(telemetry.NewTurnLog(slog.New(slog.NewJSONHandler(&buf, nil)))))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = r.Run(t.Context(), userTurn("hi"), runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil }))
	cause, _ := logLines(t, &buf)[0]["cause"].(string)
	if len(cause) > 4096+40 || !strings.HasSuffix(cause, "more bytes)") || !utf8.ValidString(cause) {
		t.Errorf("cause of %d bytes, ending %q", len(cause), cause[max(0, len(cause)-30):])
	}
}
