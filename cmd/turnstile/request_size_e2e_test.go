package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/turnstile-dev/turnstile/config"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/natstest"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
)

// requestOf returns a request of one user text whose wire form is exactly
// size bytes.
func requestOf(t *testing.T, size int) *turnstilev1.RunTurnRequest {
	t.Helper()
	n := size
	for range 4 {
		req := &turnstilev1.RunTurnRequest{Messages: wiretest.UserText(strings.Repeat("a", n))}
		got := proto.Size(req)
		if got == size {
			return req
		}
		n += size - got
	}
	t.Fatalf("no request of %d bytes", size)
	return nil
}

// TestRequestTheStoreCannotHold: a request larger than one record of the
// turn store is refused when the configuration is read, not when a turn
// starts. Before, `server.max_request_bytes: 16777216` with the store on
// served, and a 10 MiB request (anything over what one record holds) got
// UNAVAILABLE "the turn log is unreachable" with
// RetryInfo (cause store_unreachable), and an ERROR log line "turn store
// unreachable". Now `turnstile serve` refuses that configuration, naming
// the key; at the bound the largest request goes through the store, and
// a larger one is RESOURCE_EXHAUSTED (REQUEST_TOO_LARGE when read; gRPC's
// own refusal, without ErrorInfo, beyond the limit and 1 MiB); with the
// store off, 16 MiB serves a 10 MiB request.
func TestRequestTheStoreCannotHold(t *testing.T) {
	yaml := func(limit int, store string) string {
		return fmt.Sprintf(`
providers:
  sim: {type: simulator, token_delay: -1ns}
models:
  m: {provider: sim, model: turnstile-sim-1}
server: {max_request_bytes: %d, drain_delay: 0s, shutdown_grace: 1s}
store: %s
`, limit, store)
	}

	t.Run("refused at start", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "turnstile.yaml")
		if err := os.WriteFile(path, []byte(yaml(16<<20, fmt.Sprintf("{mode: embedded, dir: %q}", t.TempDir()))), 0o600); err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		code := serve([]string{"--config", path, "--listen", "127.0.0.1:0"}, &stderr)
		want := path + ":6: server.max_request_bytes: must be at most 8323072 with the turn store on (store.mode embedded): " +
			"a turn's request is stored whole in one record of at most 8388608 bytes; or set store.mode off\n"
		if code != exitPermanent || stderr.String() != want {
			t.Errorf("serve => %d, stderr:\n%s\nwant %d, stderr:\n%s", code, stderr.String(), exitPermanent, want)
		}
	})

	t.Run("refused by the NATS servers' max_payload", func(t *testing.T) {
		// A cluster's servers take records of their own max_payload, which
		// only the connection tells: 1 MiB here, NATS' default.
		url := natstest.StartWith(t, func(o *natsserver.Options) { o.MaxPayload = 1 << 20 })
		path := filepath.Join(t.TempDir(), "turnstile.yaml")
		if err := os.WriteFile(path, []byte(yaml(4<<20, fmt.Sprintf("{mode: nats, nats: {url: %q}}", url))), 0o600); err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		code := serve([]string{"--config", path, "--listen", "127.0.0.1:0"}, &stderr)
		// After the store's own log lines, both bounds at once (the
		// default max_event_bytes, 4 MiB, is over it too).
		want := path + ":6: server.max_event_bytes: must be at most 983040 with the NATS servers of store.nats, which take records of at most 1048576 bytes (their max_payload): " +
			"each event is stored in one record of at most 1048576 bytes; or raise max_payload on the NATS servers\n" +
			path + ":6: server.max_request_bytes: must be at most 983040 with the NATS servers of store.nats, which take records of at most 1048576 bytes (their max_payload): " +
			"a turn's request is stored whole in one record of at most 1048576 bytes; or raise max_payload on the NATS servers\n"
		if code != exitPermanent || !strings.HasSuffix(stderr.String(), want) {
			t.Errorf("serve => %d, stderr:\n%s\nwant %d, stderr ending:\n%s", code, stderr.String(), exitPermanent, want)
		}
	})

	tests := []struct {
		name   string
		limit  int
		store  string
		size   int
		code   codes.Code
		reason string
	}{
		{name: "the largest request through the store", limit: config.MaxStoredRequestBytes, store: "embedded", size: config.MaxStoredRequestBytes, code: codes.OK},
		{name: "over the bound, read", limit: config.MaxStoredRequestBytes, store: "embedded", size: config.MaxStoredRequestBytes + 1, code: codes.ResourceExhausted, reason: "REQUEST_TOO_LARGE"},
		{name: "10 MiB, refused by gRPC", limit: config.MaxStoredRequestBytes, store: "embedded", size: 10 << 20, code: codes.ResourceExhausted},
		{name: "10 MiB, store off", limit: 16 << 20, store: "off", size: 10 << 20, code: codes.OK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			store := "{mode: off}"
			if tc.store == "embedded" {
				store = fmt.Sprintf("{mode: embedded, dir: %q}", t.TempDir())
			}
			cfg, err := config.Parse("config.yaml", []byte(yaml(tc.limit, store)))
			if err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			c, _, stop := serveLogged(t, cfg, "info", &logs)
			evs, st := wiretest.Collect(t, t.Context(), c, requestOf(t, tc.size), nil)
			stop()
			want := "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"
			if tc.code != codes.OK {
				want = ""
			}
			if st.Code() != tc.code || reasonOfStatus(st) != tc.reason || wiretest.Names(evs) != want {
				t.Errorf("status %v %q (%s), events %q; want %v %q, events %q", st.Code(), st.Message(), reasonOfStatus(st), wiretest.Names(evs), tc.code, tc.reason, want)
			}
			if strings.Contains(logs.String(), "turn store unreachable") {
				t.Errorf("the store was called unreachable:\n%.2000s", logs.String())
			}
		})
	}
}
