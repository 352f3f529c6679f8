package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/turnstile-dev/turnstile/config"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
)

// quotingUpstream answers every request with a 400 whose message quotes
// the whole request body, in the error format of the provider typ, as
// OpenAI-compatible servers and proxies do.
func quotingUpstream(t *testing.T, typ string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		msg := "invalid request: " + string(body)
		var reply any
		switch typ {
		case "anthropic":
			reply = map[string]any{"type": "error", "error": map[string]any{"type": "invalid_request_error", "message": msg}}
		case "gemini":
			reply = map[string]any{"error": map[string]any{"code": 400, "message": msg, "status": "INVALID_ARGUMENT"}}
		default:
			reply = map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error"}}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(reply)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// serveLogged runs serveOn with cfg as `turnstile serve` does, its log
// (JSON, at level) written to logs through newLogger. stop ends it; read
// logs only once stop has returned.
func serveLogged(t *testing.T, cfg *config.Config, level string, logs io.Writer) (client turnstilev1.AgentServiceClient, addr string, stop func()) {
	t.Helper()
	logger, err := newLogger(logs, config.Log{Format: "json", Level: level}, nil)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serveOn(ctx, cfg, logger, lis, nil) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		conn.Close()
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	}
	t.Cleanup(stop)
	return turnstilev1.NewAgentServiceClient(conn), lis.Addr().String(), stop
}

// TestBigRequestLogsLittle: a 3 MB request that an upstream quotes whole in
// its 400 (through each real adapter), and a 3 MB malformed simulator
// directive, each add at most a few KiB of log: every attribute is cut at
// maxAttrBytes with its size noted.
func TestBigRequestLogsLittle(t *testing.T) {
	big := strings.Repeat("abcdefghij", 300_000) // 3 MB
	type tc struct {
		name, yaml, prompt string
		code               codes.Code
	}
	var cases []tc
	for _, pc := range providerCaseList(t) {
		t.Setenv(pc.keyEnv, "test-key-0123456789")
		up := quotingUpstream(t, pc.typ)
		cases = append(cases, tc{name: pc.typ, yaml: providerYAML(pc, up.URL) + "default_model: m\n", prompt: big, code: codes.InvalidArgument})
	}
	cases = append(cases, tc{name: "simulator directive", yaml: `
providers:
  sim: {type: simulator, token_delay: -1ns}
models:
  m: {provider: sim, model: turnstile-sim-1}
default_model: m
`, prompt: "[sim fail=" + big + "]", code: codes.InvalidArgument})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := config.Parse("config.yaml", []byte(c.yaml))
			if err != nil {
				t.Fatal(err)
			}
			var logs syncBuffer
			client, _, stop := serveLogged(t, cfg, "debug", &logs)
			_, st := wiretest.Collect(t, t.Context(), client, &turnstilev1.RunTurnRequest{Messages: wiretest.UserText(c.prompt)}, nil)
			if st.Code() != c.code {
				t.Errorf("status %v, want %v", st, c.code)
			}
			stop()
			out := logs.String()
			// Start-up and shut-down lines, the RPC's and the turn's:
			// about 3 KiB without the request; 16 KiB is "a few".
			if len(out) > 16<<10 {
				t.Errorf("the log holds %d bytes for one 3 MB request", len(out))
			}
			sc := bufio.NewScanner(strings.NewReader(out))
			sc.Buffer(nil, 8<<20)
			cut := false
			for sc.Scan() {
				if len(sc.Text()) > 4<<10 {
					t.Errorf("a line of %d bytes: %.300s", len(sc.Text()), sc.Text())
				}
				cut = cut || strings.Contains(sc.Text(), "bytes in all]")
			}
			if !cut {
				t.Errorf("no line notes the size of what it cut:\n%s", out)
			}
			t.Logf("%d bytes of log", len(out))
		})
	}
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestSimulatorBigPrompt: a 3 MB prompt to the simulator (the default
// model) is a valid request: the turn completes, its reply quoting the
// question cut short, and no event goes over max_event_bytes.
func TestSimulatorBigPrompt(t *testing.T) {
	for name, prompt := range map[string]string{
		"one word":  strings.Repeat("x", 3<<20),
		"ten words": strings.Repeat(strings.Repeat("y", 300<<10)+" ", 10),
	} {
		t.Run(name, func(t *testing.T) {
			w := serveYAML(t, "providers:\n  sim: {type: simulator, token_delay: -1ns}\nmodels:\n  m: {provider: sim, model: turnstile-sim-1}\n")
			evs, st := wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: wiretest.UserText(prompt)}, nil)
			if st.Code() != codes.OK {
				t.Fatalf("status %v", st)
			}
			if got := wiretest.Names(evs); !strings.HasSuffix(got, "MessageCompleted TurnCompleted") {
				t.Errorf("events %s", got)
			}
		})
	}
}
