package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/tools/argcheck"
)

func schemaServer(t *testing.T, p llm.Provider) string {
	t.Helper()
	r, err := runtime.New([]*runtime.Model{{
		Alias: "test", ProviderName: "fake", Provider: p, ID: "fake-1",
		Retry: policy.Retry{MaxRetries: 0, Multiplier: 1, OutputRetries: 1},
	}}, "test", nil, runtime.WithOutputSchemas(argcheck.OutputSchemas{}))
	if err != nil {
		t.Fatal(err)
	}
	return serveRunner(t, r)
}

func TestRunGenerationFlags(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: fake.Text(`{"city":"Oslo"}`)})
	addr := schemaServer(t, p)
	schema := filepath.Join(t.TempDir(), "place.json")
	if err := os.WriteFile(schema, []byte(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, _ := runCLI(t, "--addr", addr, "--schema", schema, "--tool-choice", "none", "--reasoning", "high",
		"--meta", "end_user=u-1", "--meta", "session=s=1", "where?")
	if code != exitOK || !strings.Contains(out, `{"city":"Oslo"}`) {
		t.Fatalf("exit code %d, stdout %q", code, out)
	}
	req := p.Requests()[0]
	if s := req.OutputSchema; s == nil || s.Name != "place" || !s.Strict {
		t.Errorf("output schema %+v", req.OutputSchema)
	}
	if r := req.Reasoning; r == nil || r.Effort != llm.EffortHigh {
		t.Errorf("reasoning %+v", req.Reasoning)
	}
	if req.EndUser != "u-1" {
		t.Errorf("end user %q", req.EndUser)
	}
	// Tool choice reaches the runtime; with no tool offered it is moot.
}

func TestRunGenerationFlagErrors(t *testing.T) {
	addr := schemaServer(t, fake.NewProvider())
	notJSON := filepath.Join(t.TempDir(), "s.json")
	if err := os.WriteFile(notJSON, []byte(`[1]`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--reasoning", "max"}, `--reasoning: "max" is not low, medium or high`},
		{[]string{"--schema", notJSON}, "is not a JSON object"},
		{[]string{"--schema", filepath.Join(t.TempDir(), "missing.json")}, "--schema: open"},
		{[]string{"--meta", "novalue"}, `"novalue" is not KEY=VALUE`},
	} {
		code, _, errOut := runCLI(t, append(append([]string{"--addr", addr}, tt.args...), "hi")...)
		if code != exitUsage || !strings.Contains(errOut, tt.want) {
			t.Errorf("%v: exit code %d, stderr %q; want %d and %q", tt.args, code, errOut, exitUsage, tt.want)
		}
	}
	// A tool the turn does not offer is the server's to refuse.
	code, _, errOut := runCLI(t, "--addr", addr, "--tool-choice", "search", "hi")
	if code != exitPermanent || !strings.Contains(errOut, "generation.tool_choice.tool_name") {
		t.Errorf("exit code %d, stderr %q", code, errOut)
	}
}

func TestRunOutputInvalidExits1(t *testing.T) {
	bad := fake.Reply{Chunks: fake.Text(`{"city":7}`)}
	addr := schemaServer(t, fake.NewProvider(bad, bad))
	schema := filepath.Join(t.TempDir(), "place.json")
	if err := os.WriteFile(schema, []byte(`{"type":"object","properties":{"city":{"type":"string"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCLI(t, "--addr", addr, "--schema", schema, "where?")
	if code != exitPermanent || !strings.Contains(errOut, `OUTPUT_INVALID: the reply does not match the output schema: property "city": got number, want string`) {
		t.Errorf("exit code %d, stderr %q", code, errOut)
	}
}
