package main

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/turnstile-dev/turnstile/config"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// serveYAMLAddr serves the configuration yaml as "turnstile serve" builds
// it, without a store, on a loopback port, and returns its address.
func serveYAMLAddr(t *testing.T, yaml string) string {
	t.Helper()
	cfg, err := config.Parse("config.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	runner, closeAll, err := buildRunner(t.Context(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeAll)
	return serveRunner(t, runner)
}

// TestRunShowsTheCost: the usage line of "turnstile run" carries the turn's
// cost at the configured prices, from real adapters behind fake provider
// APIs; partial when a call of a model without a price used tokens, and
// absent (never zero) when no model has a price.
func TestRunShowsTheCost(t *testing.T) {
	t.Setenv("TEST_OPENAI_KEY", "test-key-9876543210")
	t.Setenv("TEST_ANTHROPIC_KEY", "test-key-0123456789")
	// 30 prompt and 4 completion tokens.
	answer := newUpstream(t, openaiAnswer("It is late."))
	// 394 input and 1 output tokens, then an overloaded error mid-stream.
	overloaded := newUpstream(t, readFixture(t, "../../providers/anthropic/testdata/anthropic_midstream_error.sse"))
	tests := []struct {
		name   string
		models string
		usage  string
	}{{
		// 30×3 + 4×15 = 150 millionths of a USD.
		name:   "priced",
		models: `m: {provider: oai, model: gpt-4.1-mini, price: {input: 3, output: 15}}`,
		usage:  "end_turn · 30 tokens in, 4 tokens out · cost USD 0.00015 · 1 model call\n",
	}, {
		name:   "no price",
		models: `m: {provider: oai, model: gpt-4.1-mini}`,
		usage:  "end_turn · 30 tokens in, 4 tokens out · 1 model call\n",
	}, {
		// The priced model's call used 394×3 + 1×15 = 1197 millionths
		// before it failed; its fallback has no price.
		name: "partial",
		models: `m: {provider: ant, model: claude-sonnet-4-5, price: {input: 3, output: 15}, retry: {max_retries: 0}, fallbacks: [n]}
  n: {provider: oai, model: gpt-4.1-mini}`,
		usage: "end_turn · 424 tokens in, 5 tokens out · cost USD 0.001197 (partial: a model without a price was called) · 2 model calls · 1 fallback\n",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr := serveYAMLAddr(t, fmt.Sprintf(`
providers:
  oai: {type: openai, base_url: %s, api_key_env: TEST_OPENAI_KEY}
  ant: {type: anthropic, base_url: %s, api_key_env: TEST_ANTHROPIC_KEY}
pricing: {currency: USD}
models:
  %s
default_model: m
`, answer.URL, overloaded.URL, tc.models))
			code, out, errOut := runCLIBeside(t, "--addr", addr, "what time is it?")
			if code != exitOK {
				t.Fatalf("exit code %d, want %d", code, exitOK)
			}
			if !strings.HasSuffix(out, "It is late.\n") {
				t.Errorf("stdout %q", out)
			}
			if !strings.HasSuffix(errOut, tc.usage) {
				t.Errorf("usage line:\n got %q\nwant %q", lastLine(errOut), tc.usage)
			}
		})
	}
}

// TestCostText: the cost's units and nanos are written exactly, without
// trailing zeros, and an unknown cost is not shown.
func TestCostText(t *testing.T) {
	tests := []struct {
		usage *turnstilev1.Usage
		want  string
	}{
		{nil, ""},
		{&turnstilev1.Usage{InputTokens: 10}, ""},
		{&turnstilev1.Usage{Cost: &turnstilev1.Cost{Currency: "USD"}}, "cost USD 0"},
		{&turnstilev1.Usage{Cost: &turnstilev1.Cost{Currency: "EUR", Units: 12, Nanos: 500_000_000}}, "cost EUR 12.5"},
		{&turnstilev1.Usage{Cost: &turnstilev1.Cost{Currency: "USD", Nanos: 1}}, "cost USD 0.000000001"},
		{&turnstilev1.Usage{Cost: &turnstilev1.Cost{Currency: "USD", Units: 20_000_000_000, Nanos: 999_999_999}}, "cost USD 20000000000.999999999"},
		{&turnstilev1.Usage{Cost: &turnstilev1.Cost{Currency: "USD", Nanos: 1_234_000}, CostPartial: true}, "cost USD 0.001234 (partial: a model without a price was called)"},
	}
	for _, tc := range tests {
		if got := costText(tc.usage); got != tc.want {
			t.Errorf("costText(%v) = %q, want %q", tc.usage, got, tc.want)
		}
	}
}

// runCLIBeside is runCLI beside an in-process server whose adapters keep
// their connections to the fake provider APIs alive: those goroutines (the
// adapters' and the fake APIs') are not the command's.
func runCLIBeside(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	before := goleak.IgnoreCurrent()
	var stdout, stderr bytes.Buffer
	code := runCommand(t.Context(), args, strings.NewReader(""), &stdout, &stderr, console{})
	goleak.VerifyNone(t, before,
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"))
	t.Logf("turnstile run %s => %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	return code, stdout.String(), stderr.String()
}

// lastLine returns the last line of s.
func lastLine(s string) string {
	s = strings.TrimSuffix(s, "\n")
	return s[strings.LastIndex(s, "\n")+1:]
}
