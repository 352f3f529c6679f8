package server_test

import (
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/telemetry"
)

// TestOneLinePerTurn runs a completed and a failed turn, without a store
// and with the embedded one (the default), wired as cmd/turnstile wires
// them: each turn writes one line above DEBUG, its own "turn ended" with
// the outcome and, for a failure, the root cause; the RPC's line is at
// DEBUG.
func TestOneLinePerTurn(t *testing.T) {
	t.Parallel()
	cause := errors.New(`Post "api.example.com/v1/chat/completions": unsupported protocol scheme ""`)
	for _, durable := range []bool{false, true} {
		for _, tt := range []struct {
			name  string
			reply fake.Reply
			code  codes.Code
			want  []string
		}{
			{"completed", fake.Reply{Chunks: fake.Text("hi")}, codes.OK, []string{`"level":"INFO"`, `"end_reason":"end_turn"`}},
			{"failed", fake.Reply{Err: cause}, codes.Internal, []string{`"level":"ERROR"`, `"error_code":"INTERNAL"`, "unsupported protocol scheme"}},
		} {
			name := tt.name
			if durable {
				name += " durable"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				var logs syncBuffer
				logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
				r, err := runtime.New([]*runtime.Model{{Alias: "sim", ProviderName: "fake", Provider: fake.NewProvider(tt.reply), ID: "fake-1", Retry: policy.DefaultRetry()}},
					"sim", nil, runtime.WithObserver(telemetry.NewTurnLog(logger)))
				if err != nil {
					t.Fatal(err)
				}
				opts := server.Options{Logger: logger}
				if durable {
					opts.Store = memStore(t)
				}
				ts := start(t, r, opts)
				if _, st := wiretest.Collect(t, t.Context(), ts.client, hello(), nil); st.Code() != tt.code {
					t.Fatalf("status = %v, want %v", st.Code(), tt.code)
				}
				// The interceptor logs after the handler returned.
				logs.awaitLine(t, "finished call")
				var above []string
				for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
					var m map[string]any
					if err := json.Unmarshal([]byte(line), &m); err != nil {
						t.Fatalf("not JSON: %s", line)
					}
					if m["level"] != "DEBUG" && m["turn_id"] == "turn-1" {
						above = append(above, line)
					}
				}
				if len(above) != 1 || !strings.Contains(above[0], `"msg":"turn ended"`) {
					t.Fatalf("want one line of the turn above DEBUG, got:\n%s", strings.Join(above, "\n"))
				}
				for _, w := range tt.want {
					if !strings.Contains(above[0], w) {
						t.Errorf("the turn's line lacks %s: %s", w, above[0])
					}
				}
			})
		}
	}
}
