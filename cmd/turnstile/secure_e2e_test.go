package main

import (
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"

	"github.com/turnstile-dev/turnstile/config"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
)

// TestSecureServeAndRun serves a production-like configuration (TLS with
// client certificates, client keys) built by serve's own code, and runs
// turns on it with turnstile run: with the CA, a client certificate and
// the key a turn completes; without any of them it fails.
func TestSecureServeAndRun(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA := wiretest.NewCA(t, "server CA"), wiretest.NewCA(t, "client CA")
	c, k := serverCA.Issue(t, "turnstile", true)
	cc, ck := clientCA.Issue(t, "cli", false)
	files := map[string]string{
		"cert":     wiretest.WriteFile(t, dir, "cert.pem", c),
		"key":      wiretest.WriteFile(t, dir, "key.pem", k),
		"clients":  wiretest.WriteFile(t, dir, "clients.pem", clientCA.PEM),
		"ca":       wiretest.WriteFile(t, dir, "ca.pem", serverCA.PEM),
		"ccert":    wiretest.WriteFile(t, dir, "client-cert.pem", cc),
		"ckey":     wiretest.WriteFile(t, dir, "client-key.pem", ck),
		"stranger": wiretest.WriteFile(t, dir, "stranger.pem", wiretest.NewCA(t, "stranger").PEM),
	}
	t.Setenv("TEST_CLIENT_TOKEN", "cli-token-0123456789")
	cfg, err := config.Parse("config.yaml", []byte(fmt.Sprintf(`
providers: {sim: {type: simulator, token_delay: 0}}
models: {sim: {provider: sim, model: turnstile-sim-1}}
server:
  tls: {cert_file: %s, key_file: %s, client_ca_file: %s}
  reflection: false
auth:
  keys: [{name: cli, token_env: TEST_CLIENT_TOKEN, limits: {concurrent_turns: 2}}]
`, files["cert"], files["key"], files["clients"])))
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serveAsServe(t, cfg, slog.New(slog.DiscardHandler))

	full := []string{"--addr", addr, "--ca", files["ca"], "--cert", files["ccert"], "--key", files["ckey"], "--retries", "0"}
	tests := []struct {
		name  string
		args  []string
		token string
		code  int
	}{
		{"everything", full, "cli-token-0123456789", exitOK},
		{"no client key", full, "", exitPermanent},
		{"wrong client key", full, "cli-token-0123456780", exitPermanent},
		{"no client certificate", []string{"--addr", addr, "--ca", files["ca"], "--retries", "0"}, "cli-token-0123456789", exitRetryable},
		{"server not trusted", []string{"--addr", addr, "--ca", files["stranger"], "--cert", files["ccert"], "--key", files["ckey"], "--retries", "0"}, "cli-token-0123456789", exitRetryable},
		{"plaintext", []string{"--addr", addr, "--retries", "0"}, "cli-token-0123456789", exitRetryable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("TURNSTILE_TOKEN", tt.token)
			code, stdout, _ := runCLI(t, append(tt.args, "[sim reply=\"secured\"] hi")...)
			if code != tt.code || tt.code == exitOK && stdout != "secured\n" {
				t.Errorf("exit %d, output %q; want %d", code, stdout, tt.code)
			}
		})
	}
}

// serveAsServe builds what serve builds from cfg (the runner, the server's
// options) and serves it on a loopback port; stop, also run at cleanup,
// stops it and waits for it.
func serveAsServe(t *testing.T, cfg *config.Config, logger *slog.Logger, runnerOpts ...runtime.Option) (addr string, stop func()) {
	t.Helper()
	runner, closeAll, err := buildRunner(t.Context(), cfg, logger, runnerOpts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeAll)
	opts, err := serverOptions(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(runner, opts)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	var once sync.Once
	stop = func() { once.Do(func() { srv.Stop(); <-done }) }
	t.Cleanup(stop)
	return lis.Addr().String(), stop
}
