package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/turnstile-dev/turnstile/config"
	"github.com/turnstile-dev/turnstile/internal/natstest"
)

// TestServePrintsConfigErrors: serve prints every problem of the file, or
// every missing variable, one per line, and exits 1 without serving.
func TestServePrintsConfigErrors(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{{
		name: "two mistakes, sorted by line",
		yaml: `providers:
  openai: {type: openai, base_url: api.openai.com/v1, api_key: sk-proj-4f9Qx2LmZ8}
models:
  fast: {provider: openai, model: gpt-4.1-mini, fallback: [fast]}
`,
		want: `config.yaml:2: providers.openai.api_key: unknown key; did you mean api_key_env?
config.yaml:2: providers.openai.base_url: has no scheme: start it with https:// (or http:// for a server without TLS)
config.yaml:4: models.fast.fallback: unknown key; did you mean fallbacks?
`,
	}, {
		name: "missing variables of two providers",
		yaml: `providers:
  openai: {type: openai, api_key_env: TURNSTILE_TEST_OPENAI_KEY}
  gemini: {type: gemini, api_key_env: TURNSTILE_TEST_GEMINI_KEY}
models:
  fast: {provider: openai, model: gpt-4.1-mini, fallbacks: [flash]}
  flash: {provider: gemini, model: gemini-2.5-flash}
default_model: fast
`,
		want: `config.yaml:2: providers.openai.api_key_env: the environment variable TURNSTILE_TEST_OPENAI_KEY is not set
config.yaml:3: providers.gemini.api_key_env: the environment variable TURNSTILE_TEST_GEMINI_KEY is empty
`,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("TURNSTILE_TEST_OPENAI_KEY", "")
			os.Unsetenv("TURNSTILE_TEST_OPENAI_KEY")
			t.Setenv("TURNSTILE_TEST_GEMINI_KEY", "")
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			t.Chdir(dir)
			var stderr bytes.Buffer
			code := serve([]string{"--config", "config.yaml", "--listen", "127.0.0.1:0"}, &stderr)
			if code != exitPermanent || stderr.String() != tt.want {
				t.Errorf("serve = %d, printed:\n%s\nwant 1 and:\n%s", code, stderr.String(), tt.want)
			}
			if strings.Contains(stderr.String(), "sk-proj") {
				t.Errorf("serve printed a key")
			}
		})
	}
}

// TestUnusedProviderDoesNotStopServe: a provider no model uses is not
// built, so its missing variable is no error; a warning names it.
func TestUnusedProviderDoesNotStopServe(t *testing.T) {
	t.Setenv("TURNSTILE_TEST_ANTHROPIC_KEY", "")
	cfg, err := config.Parse("config.yaml", []byte(`
providers:
  sim: {type: simulator, token_delay: 0}
  claude: {type: anthropic, api_key_env: TURNSTILE_TEST_ANTHROPIC_KEY}
models:
  sim: {provider: sim, model: turnstile-sim-1}
`))
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	runner, closeAll, err := buildRunner(t.Context(), cfg, slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatalf("buildRunner: %v", err)
	}
	t.Cleanup(closeAll)
	if want := `level=WARN msg="providers no model uses are not built" providers=[claude]`; !strings.Contains(log.String(), want) {
		t.Errorf("log:\n%s\nwant a line with %s", log.String(), want)
	}
	w := serveRunner(t, runner)
	code, stdout, _ := runCLI(t, "--addr", w, "hello")
	if code != exitOK || stdout == "" {
		t.Errorf("turn on the server: exit %d, output %q", code, stdout)
	}
}

// TestServeRefusedByNATS: serve with a password NATS refuses exits at
// start, saying which keys to check, and prints neither the password nor
// the URL that holds it.
func TestServeRefusedByNATS(t *testing.T) {
	const password = "pw-73c1e9"
	url := natstest.StartWith(t, func(o *natsserver.Options) {
		o.Users = []*natsserver.User{{Username: "turnstile", Password: password}}
	})
	host := strings.TrimPrefix(url, "nats://")
	dir := t.TempDir()
	yaml := "providers: {sim: {type: simulator}}\nmodels: {sim: {provider: sim, model: turnstile-sim-1}}\n" +
		"store: {mode: nats, nats: {url: \"nats://turnstile:wrong-" + password + "@" + host + "\"}}\n"
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	var stderr bytes.Buffer
	code := serve([]string{"--config", "config.yaml", "--listen", "127.0.0.1:0"}, &stderr)
	out := stderr.String()
	if code == 0 || !strings.Contains(out, "NATS refused this replica's credentials") {
		t.Errorf("serve = %d, printed:\n%s\nwant an error naming the credentials", code, out)
	}
	if strings.Contains(out, password) || strings.Contains(out, host) {
		t.Errorf("serve printed the password or the URL:\n%s", out)
	}
	t.Logf("serve printed: %s", out)
}
