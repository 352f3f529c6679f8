package main

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/config"
	"github.com/turnstile-dev/turnstile/providers/sim"
)

// startSimServer serves what "turnstile serve" serves with no
// configuration file (the embedded simulator as model "sim", the clock
// tool), with fast pacing and backoff, on a loopback port.
func startSimServer(t *testing.T) string {
	t.Helper()
	cfg := config.Default()
	cfg.Providers["sim"].Settings.(*sim.Settings).TokenDelay = 0
	m := cfg.Models["sim"]
	m.Retry.InitialBackoff, m.Retry.MaxBackoff = 5*time.Millisecond, 20*time.Millisecond
	cfg.Models["sim"] = m

	runner, closeAll, err := buildRunner(t.Context(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeAll)
	return serveRunner(t, runner)
}

// The CLI against the real default server: the simulator and the clock tool.
func TestRunEndToEndOnTheSimulator(t *testing.T) {
	tests := []struct {
		name    string
		prompt  string
		args    []string
		code    int
		stdout  []string
		stderr  []string
		without []string
	}{
		{
			name:   "reply",
			prompt: `[sim reply="Hello from the simulator."] say hello`,
			code:   exitOK,
			stdout: []string{"Hello from the simulator.\n"},
			stderr: []string{"end_turn", "1 model call"},
		},
		{
			name:   "thinking and a tool",
			prompt: `[sim think="Which zone?"] [sim tool=current_time args={"zone":"UTC"}] what time is it?`,
			code:   exitOK,
			stdout: []string{"thinking: Which zone?", `⚙ current_time({"zone":"UTC"})`, "↳ "},
			stderr: []string{"2 model calls", "1 tool call"},
		},
		{
			// The server's own retries run out, the turn fails retryable,
			// and the client's step retry succeeds.
			name:   "server retries then a step retry",
			prompt: `[sim fail=server_error times=3] hi`,
			args:   []string{"--retries", "1"},
			code:   exitOK,
			stderr: []string{
				"model sim: SERVER_ERROR", "retrying in", "(retry 1 of 2)", "(retry 2 of 2)",
				"turnstile: SERVER_ERROR: The server had an error while processing your request. Sorry about that!; resuming the turn in", "(resume 1 of 1)",
				"4 model calls · 2 retries · 1 resume",
			},
		},
		{
			name:   "retryable failure",
			prompt: `[sim fail=bad_gateway] hi`,
			args:   []string{"--retries", "0"},
			code:   exitRetryable,
			stderr: []string{"turnstile run: SERVER_ERROR", "it may succeed if run again"},
		},
		{
			name:    "permanent failure",
			prompt:  `[sim fail=auth] hi`,
			code:    exitPermanent,
			stderr:  []string{"turnstile run: AUTH"},
			without: []string{"resuming", "may succeed"},
		},
		{
			// An unknown tool is never started, yet its call is shown.
			name:   "unknown tool",
			prompt: `[sim tool=nope] hi`,
			code:   exitOK,
			stdout: []string{"⚙ nope({})\n", "  ↳ nope error: unknown tool \"nope\""},
		},
		{
			name:   "a reply cut at the token limit is continued",
			prompt: `[sim max_tokens=3] tell me a long story`,
			code:   exitOK,
			stderr: []string{"turnstile: the reply reached the output token limit; model sim continues it\n", "end_turn"},
		},
		{
			name:   "shown output is discarded",
			prompt: `[sim fail=server_error times=1 after=2] hi`,
			code:   exitOK,
			stderr: []string{"(retry 1 of 2); the partial output above is discarded\n"},
		},
		{
			// Step 1 streams only tool call fragments before it fails:
			// nothing was shown. Step 2 streams text before it fails.
			name:   "unshown output is not said to be discarded",
			prompt: `[sim tool=current_time args={"zone":"UTC"}] [sim fail=server_error times=1 after=2] hi`,
			code:   exitOK,
			stderr: []string{
				"Sorry about that!; retrying in", "(retry 1 of 2)\nturnstile: model sim:",
				"(retry 1 of 2); the partial output above is discarded\nend_turn",
			},
		},
		{
			name:   "refusal is an outcome",
			prompt: `[sim refuse="I would rather not."] hi`,
			code:   exitOK,
			stdout: []string{"I would rather not."},
			stderr: []string{"refusal"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := startSimServer(t)
			code, out, errOut := runCLI(t, append(append([]string{"--addr", addr}, tt.args...), tt.prompt)...)
			if code != tt.code {
				t.Errorf("exit code %d, want %d", code, tt.code)
			}
			for _, want := range tt.stdout {
				if !strings.Contains(out, want) {
					t.Errorf("stdout lacks %q", want)
				}
			}
			for _, want := range tt.stderr {
				if !strings.Contains(errOut, want) {
					t.Errorf("stderr lacks %q", want)
				}
			}
			for _, bad := range tt.without {
				if strings.Contains(errOut, bad) {
					t.Errorf("stderr has %q", bad)
				}
			}
		})
	}
}
