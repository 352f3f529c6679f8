package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigCheck: config check prints what serve prints for the same
// file, byte for byte, and exits as it does, without serving; a good file
// is ok, exit 0.
func TestConfigCheck(t *testing.T) {
	tests := []struct {
		name, yaml  string
		args        []string
		code        int
		stdout      string
		stderr      string
		sameAsServe bool
	}{{
		name: "two mistakes, sorted by line",
		yaml: `providers:
  openai: {type: openai, base_url: api.openai.com/v1, api_key: sk-proj-4f9Qx2LmZ8}
models:
  fast: {provider: openai, model: gpt-4.1-mini, fallback: [fast]}
`,
		code: exitPermanent,
		stderr: `config.yaml:2: providers.openai.api_key: unknown key; did you mean api_key_env?
config.yaml:2: providers.openai.base_url: has no scheme: start it with https:// (or http:// for a server without TLS)
config.yaml:4: models.fast.fallback: unknown key; did you mean fallbacks?
`,
		sameAsServe: true,
	}, {
		name: "missing variables",
		yaml: `providers:
  openai: {type: openai, api_key_env: TURNSTILE_TEST_OPENAI_KEY}
  gemini: {type: gemini, api_key_env: TURNSTILE_TEST_GEMINI_KEY}
models:
  fast: {provider: openai, model: gpt-4.1-mini, fallbacks: [flash]}
  flash: {provider: gemini, model: gemini-2.5-flash}
default_model: fast
auth:
  keys: [{name: ci, token_env: TURNSTILE_TEST_CLIENT_KEY}]
`,
		code: exitPermanent,
		stderr: `config.yaml:2: providers.openai.api_key_env: the environment variable TURNSTILE_TEST_OPENAI_KEY is not set
config.yaml:3: providers.gemini.api_key_env: the environment variable TURNSTILE_TEST_GEMINI_KEY is empty
config.yaml:9: auth.keys[0].token_env: the environment variable TURNSTILE_TEST_CLIENT_KEY is not set
`,
		sameAsServe: true,
	}, {
		name: "missing variables not checked with --env=false",
		yaml: `providers:
  openai: {type: openai, api_key_env: TURNSTILE_TEST_OPENAI_KEY}
models:
  fast: {provider: openai, model: gpt-4.1-mini}
`,
		args:   []string{"--env=false"},
		code:   exitOK,
		stdout: "config.yaml: ok\n",
	}, {
		name:   "good file",
		yaml:   "providers: {sim: {type: simulator}}\nmodels: {sim: {provider: sim, model: turnstile-sim-1}}\n",
		code:   exitOK,
		stdout: "config.yaml: ok\n",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("TURNSTILE_TEST_OPENAI_KEY", "")
			os.Unsetenv("TURNSTILE_TEST_OPENAI_KEY")
			t.Setenv("TURNSTILE_TEST_CLIENT_KEY", "")
			os.Unsetenv("TURNSTILE_TEST_CLIENT_KEY")
			t.Setenv("TURNSTILE_TEST_GEMINI_KEY", "")
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			t.Chdir(dir)
			var stdout, stderr bytes.Buffer
			code := cli(append(append([]string{"config", "check"}, tt.args...), "config.yaml"), &stdout, &stderr)
			if code != tt.code || stdout.String() != tt.stdout || stderr.String() != tt.stderr {
				t.Errorf("config check = %d, stdout:\n%s\nstderr:\n%s\nwant %d, stdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String(), tt.code, tt.stdout, tt.stderr)
			}
			if strings.Contains(stderr.String(), "sk-proj") {
				t.Error("config check printed a key")
			}
			if !tt.sameAsServe {
				return
			}
			var serveErr bytes.Buffer
			if code := serve([]string{"--config", "config.yaml", "--listen", "127.0.0.1:0"}, &serveErr); code != tt.code || serveErr.String() != stderr.String() {
				t.Errorf("serve = %d, printed:\n%s\nconfig check = %d, printed:\n%s", code, serveErr.String(), tt.code, stderr.String())
			}
		})
	}
}

// TestConfigCheckUsage: a missing file is exit 1 with the error; a wrong
// command line is exit 2.
func TestConfigCheckUsage(t *testing.T) {
	tests := []struct {
		args      []string
		code      int
		stderrHas string
	}{
		{[]string{"config", "check", "no-such.yaml"}, exitPermanent, "turnstile config check: config: open no-such.yaml: no such file or directory\n"},
		{[]string{"config", "check"}, exitUsage, "Usage: turnstile config check"},
		{[]string{"config", "check", "a.yaml", "b.yaml"}, exitUsage, "Usage: turnstile config check"},
		{[]string{"config"}, exitUsage, "turnstile config check"},
		{[]string{"config", "lint"}, exitUsage, `unknown command "lint"`},
		{[]string{"config", "schema", "extra"}, exitUsage, `unexpected argument "extra"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Chdir(t.TempDir())
			var stdout, stderr bytes.Buffer
			code := cli(tt.args, &stdout, &stderr)
			if code != tt.code || !strings.Contains(stderr.String(), tt.stderrHas) || stdout.Len() > 0 {
				t.Errorf("%v = %d, stdout %q, stderr %q; want %d and stderr holding %q", tt.args, code, stdout.String(), stderr.String(), tt.code, tt.stderrHas)
			}
		})
	}
}

// TestRepoConfigsCheck runs config check on every configuration file of
// the repository, as CI would (without their environment variables).
func TestRepoConfigsCheck(t *testing.T) {
	files, err := filepath.Glob("../../clients/conformance/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../deploy/turnstile.yaml")
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := cli([]string{"config", "check", "--env=false", f}, &stdout, &stderr); code != exitOK || stdout.String() != f+": ok\n" {
				t.Errorf("config check %s = %d, stdout %q, stderr %q", f, code, stdout.String(), stderr.String())
			}
		})
	}
}

// TestConfigSchemaAndReference: config schema and config reference print
// the committed files (which config's tests hold fresh).
func TestConfigSchemaAndReference(t *testing.T) {
	for cmd, file := range map[string]string{"schema": "../../config/turnstile.schema.json", "reference": "../../docs/config-reference.md"} {
		var stdout, stderr bytes.Buffer
		if code := cli([]string{"config", cmd}, &stdout, &stderr); code != exitOK || stderr.Len() > 0 {
			t.Fatalf("config %s = %d, stderr %q", cmd, code, stderr.String())
		}
		want, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(stdout.Bytes(), want) {
			t.Errorf("config %s differs from %s", cmd, file)
		}
	}
}
