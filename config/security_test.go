package config

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/server"
)

const secureFile = `
listen: 0.0.0.0:7700
providers: {sim: {type: simulator}}
models:
  fast: {provider: sim, model: a}
  big: {provider: sim, model: b}
default_model: fast
server:
  tls: {cert_file: /etc/turnstile/tls/cert.pem, key_file: /etc/turnstile/tls/key.pem, client_ca_file: /etc/turnstile/tls/clients.pem}
  reflection: false
  max_concurrent_turns: 64
  max_connections: 200
  max_connection_idle: 2m
  max_connection_age: 30m
  max_connection_age_grace: 15m
  handshake_timeout: 5s
  max_request_bytes: 1048576
  max_event_bytes: 1572864
  send_timeout: 10s
turn: {max_duration: 15m, max_tool_result_bytes: 524288}
auth:
  keys:
    - name: web
      token_env: WEB_TOKEN
      models: [fast]
      limits: {concurrent_turns: 4, turns_per_minute: 60, tokens_per_minute: 100000, tokens_per_day: 0, stored_bytes: 1048576}
    - name: batch
      token_sha256: %s
`

func TestSecureConfig(t *testing.T) {
	digest := sha256.Sum256([]byte("batch-token"))
	c, err := Parse("config.yaml", []byte(strings.Replace(secureFile, "%s", hex.EncodeToString(digest[:]), 1)))
	if err != nil {
		t.Fatal(err)
	}
	s := c.Server
	if s.TLS == nil || s.TLS.ClientCAFile != "/etc/turnstile/tls/clients.pem" || s.Reflection || s.MaxConcurrentTurns != 64 ||
		s.MaxConnections != 200 || s.MaxConnectionIdle != 2*time.Minute || s.MaxConnectionAge != 30*time.Minute ||
		s.MaxConnectionAgeGrace != 15*time.Minute || s.HandshakeTimeout != 5*time.Second || s.MaxRequestBytes != 1<<20 ||
		s.MaxEventBytes != 1572864 || s.SendTimeout != 10*time.Second {
		t.Errorf("server %+v", s)
	}
	if c.Turn.MaxDuration != 15*time.Minute || c.Turn.MaxToolResultBytes != 512<<10 {
		t.Errorf("turn %+v", c.Turn)
	}
	env := map[string]string{"WEB_TOKEN": "web-token"}
	if err := c.CheckEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatal(err)
	}
	keys := c.Keys(func(k string) string { return env[k] })
	web := keys[0]
	if web.Name != "web" || web.TokenSHA256 != sha256.Sum256([]byte("web-token")) || len(web.Models) != 1 {
		t.Errorf("web key %+v", web)
	}
	l := web.Limits
	if *l.ConcurrentTurns != 4 || *l.TurnsPerMinute != 60 || *l.TokensPerMinute != 100000 || *l.TokensPerDay != 0 || *l.StoredBytes != 1<<20 {
		t.Errorf("web limits %+v", l)
	}
	// A key without limits has but the default stored_bytes: a quarter
	// of store.max_bytes.
	batch := keys[1]
	if stored := batch.Limits.StoredBytes; stored == nil || *stored != 256<<20 {
		t.Errorf("batch key's stored_bytes %v, want a quarter of store.max_bytes", stored)
	}
	batch.Limits.StoredBytes = nil
	if batch.TokenSHA256 != digest || batch.Models != nil || batch.Limits != (server.KeyLimits{}) {
		t.Errorf("batch key %+v", batch)
	}
	if err := c.CheckEnv(func(string) (string, bool) { return "", false }); err == nil || !strings.Contains(err.Error(), "auth.keys[0].token_env: the environment variable WEB_TOKEN is not set") {
		t.Errorf("CheckEnv without WEB_TOKEN = %v", err)
	}
	twice := map[string]string{"WEB_TOKEN": "batch-token"}
	if err := c.CheckEnv(func(k string) (string, bool) { v, ok := twice[k]; return v, ok }); err == nil || !strings.Contains(err.Error(), `auth.keys[1].token_sha256: holds the same token as key "web"`) {
		t.Errorf("CheckEnv with a shared token = %v", err)
	}
}

// TestDefaultStoredBytes: a key that leaves stored_bytes out gets a
// quarter of store.max_bytes; none without a store or a bound on it.
func TestDefaultStoredBytes(t *testing.T) {
	const base = "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m}}\nauth: {keys: [{name: a, token_sha256: %s}]}\n"
	digest := sha256.Sum256([]byte("a-token"))
	for _, tt := range []struct {
		store string
		want  int64 // 0: none
	}{
		{"", 256 << 20},
		{"store: {max_bytes: 4194304}\n", 1 << 20},
		{"store: {max_bytes: -1}\n", 0},
		{"store: {mode: off}\n", 0},
	} {
		c, err := Parse("config.yaml", []byte(strings.Replace(base, "%s", hex.EncodeToString(digest[:]), 1)+tt.store))
		if err != nil {
			t.Fatal(err)
		}
		got := c.Keys(func(string) string { return "" })[0].Limits.StoredBytes
		if tt.want == 0 && got != nil || tt.want != 0 && (got == nil || *got != tt.want) {
			t.Errorf("%q: stored_bytes %v, want %d", tt.store, got, tt.want)
		}
	}
}

func TestSecurityMistakes(t *testing.T) {
	const ok = "providers: {sim: {type: simulator}}\nmodels: {a: {provider: sim, model: m}}\n"
	tests := []struct{ name, yaml, want string }{
		{"tls without key", ok + "server: {tls: {cert_file: c.pem}}\n", "config.yaml:3: server.tls.key_file: required"},
		{"empty tls", ok + "server: {tls: }\n", "server.tls: must hold cert_file and key_file"},
		{"token in token_env", ok + "auth: {keys: [{name: a, token_env: sk-live-0123456789abcdef}]}\n", "auth.keys[0].token_env: must be the name of an environment variable"},
		{"bad digest", ok + "auth: {keys: [{name: a, token_sha256: hunter2hunter2}]}\n", "auth.keys[0].token_sha256: must be the SHA-256 digest"},
		{"no token", ok + "auth: {keys: [{name: a}]}\n", "auth.keys[0]: set token_env"},
		{"both tokens", ok + "auth: {keys: [{name: a, token_env: A, token_sha256: " + strings.Repeat("a", 64) + "}]}\n", "auth.keys[0]: set token_env or token_sha256, not both"},
		{"no name", ok + "auth: {keys: [{token_env: A}]}\n", "auth.keys[0].name: required"},
		{"same name", ok + "auth: {keys: [{name: a, token_env: A}, {name: a, token_env: B}]}\n", `auth.keys[1].name: "a" names another key too`},
		{"same digest", ok + "auth: {keys: [{name: a, token_sha256: " + strings.Repeat("b", 64) + "}, {name: c, token_sha256: " + strings.Repeat("B", 64) + "}]}\n", `auth.keys[1].token_sha256: is also the digest of key "a"`},
		{"unknown model", ok + "auth: {keys: [{name: a, token_env: A, models: [b]}]}\n", `auth.keys[0].models[0]: "b" is not a configured model`},
		{"negative limit", ok + "auth: {keys: [{name: a, token_env: A, limits: {turns_per_minute: -1}}]}\n", "auth.keys[0].limits.turns_per_minute: must not be negative"},
		{"retention within max_duration", ok + "turn: {max_duration: 2h}\nstore: {retention: 1h}\n", "store.retention: must be longer than turn.max_duration"},
		{"negative stored bytes", ok + "auth: {keys: [{name: a, token_env: A, limits: {stored_bytes: -1}}]}\n", "auth.keys[0].limits.stored_bytes: must not be negative"},
		{"zero turns", ok + "server: {max_concurrent_turns: 0}\n", "server.max_concurrent_turns: must be at least 1"},
		{"zero send timeout", ok + "server: {send_timeout: 0}\n", "server.send_timeout: must be positive"},
		{"events smaller than tool results", ok + "server: {max_event_bytes: 100000}\n", "server.max_event_bytes: must be at least turn.max_tool_result_bytes + 65536 (1114112)"},
		{"grace shorter than turns", ok + "server: {max_connection_age: 1h, max_connection_age_grace: 1m}\n", "server.max_connection_age_grace: must be 0 or at least turn.max_duration"},
		{"tiny tool results", ok + "turn: {max_tool_result_bytes: 10}\n", "turn.max_tool_result_bytes: must be at least 1024"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("config.yaml", []byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse error = %v, want it to contain %q", err, tt.want)
			}
			if err != nil && (strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "sk-live")) {
				t.Errorf("Parse error = %q reveals a secret", err)
			}
		})
	}
}

// TestDeployConfig: the configuration the container image serves holds
// TLS and a client key, reflection off, and needs only the key's variable.
func TestDeployConfig(t *testing.T) {
	c, err := Load("../deploy/turnstile.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "0.0.0.0:7700" || c.Server.TLS == nil || c.Server.Reflection || len(c.Auth.Keys) != 1 {
		t.Errorf("listen %s, tls %v, reflection %v, keys %d", c.Listen, c.Server.TLS, c.Server.Reflection, len(c.Auth.Keys))
	}
	err = c.CheckEnv(func(string) (string, bool) { return "", false })
	if err == nil || !strings.Contains(err.Error(), "TURNSTILE_KEY is not set") || strings.Count(err.Error(), "\n") != 0 {
		t.Errorf("CheckEnv without variables = %v, want only TURNSTILE_KEY", err)
	}
}

// TestConnectionAndHeaderBounds: max_connections_per_peer follows a
// smaller max_connections when left out, and max_handshakes a quarter of
// it; both are checked against it when set; max_header_bytes has a floor
// and a ceiling; every problem at once.
func TestConnectionAndHeaderBounds(t *testing.T) {
	const models = "providers: {sim: {type: simulator}}\nmodels: {m: {provider: sim, model: x}}\n"
	c, err := Parse("config.yaml", []byte(models+"server: {max_connections: 10}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Server.MaxConnectionsPerPeer != 10 || c.Server.MaxHandshakes != 2 || c.Server.MaxHeaderBytes != 32<<10 {
		t.Errorf("per peer %d, handshakes %d, header bytes %d; want 10, 2 and 32768", c.Server.MaxConnectionsPerPeer, c.Server.MaxHandshakes, c.Server.MaxHeaderBytes)
	}
	_, err = Parse("config.yaml", []byte(models+"server: {max_connections: 10, max_connections_per_peer: 11, max_handshakes: 11, max_header_bytes: 100}\n"))
	for _, want := range []string{"server.max_connections_per_peer: must be at least 1 and at most server.max_connections (10)",
		"server.max_handshakes: must be at least 1 and at most server.max_connections (10)", "server.max_header_bytes: must be at least 1024"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	if _, err := Parse("config.yaml", []byte(models+"server: {max_connections_per_peer: 0, max_header_bytes: 20000000}\n")); err == nil ||
		!strings.Contains(err.Error(), "max_connections_per_peer") || !strings.Contains(err.Error(), "max_header_bytes") {
		t.Errorf("zero per peer and 20 MB headers: %v", err)
	}
}
