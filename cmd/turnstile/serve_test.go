package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/turnstile-dev/turnstile/config"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/server"
)

var (
	buildOnce sync.Once
	mcpBin    string
	buildErr  error
)

// mcpServerBinary builds the test MCP server of tools/mcp once per run.
func mcpServerBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "turnstile-mcp-")
		if err != nil {
			buildErr = err
			return
		}
		mcpBin = filepath.Join(dir, "testserver")
		out, err := exec.Command("go", "build", "-o", mcpBin, "../../tools/mcp/testdata/testserver").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return mcpBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if mcpBin != "" {
		os.RemoveAll(filepath.Dir(mcpBin))
	}
	os.Exit(code)
}

// wired is the whole server as `turnstile serve` builds it from a config,
// on a loopback port.
type wired struct {
	srv    *server.Server
	client turnstilev1.AgentServiceClient
}

func serveYAML(t testing.TB, yaml string) *wired {
	t.Helper()
	cfg, err := config.Parse("config.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	runner, closeAll, err := buildRunner(t.Context(), cfg, logger)
	if err != nil {
		t.Fatalf("buildRunner: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(runner, server.Options{Logger: logger, ShutdownGrace: 100 * time.Millisecond})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		<-done
		closeAll()
	})
	return &wired{srv: srv, client: turnstilev1.NewAgentServiceClient(conn)}
}

func mcpConfig(t *testing.T, appendFile, extra string) string {
	return fmt.Sprintf(`
providers:
  sim: {type: simulator, token_delay: -1ns}
models:
  sim: {provider: sim, model: turnstile-sim-1}
mcp_servers:
  test:
    command: %s
    env: {APPEND_FILE: %s}
%s`, mcpServerBinary(t), appendFile, extra)
}

func toolFinished(evs []*turnstilev1.AgentEvent) []*turnstilev1.ToolFinished {
	var out []*turnstilev1.ToolFinished
	for _, ev := range evs {
		if f := ev.GetToolFinished(); f != nil {
			out = append(out, f)
		}
	}
	return out
}

const toolTurn = "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted %sToolFinished MessageCompleted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"

func TestMCPToolsOverGRPC(t *testing.T) {
	appendFile := filepath.Join(t.TempDir(), "appended")
	w := serveYAML(t, mcpConfig(t, appendFile, ""))
	tests := []struct {
		name, prompt, progress, result string
		isError                        bool
	}{
		{"progress", `[sim tool=progress] go`, "ToolProgress ToolProgress ToolProgress ", "done", false},
		{"tool error result", `[sim tool=fail] go`, "", "the widget is broken", true},
		{"structured result", `[sim tool=lookup args={"key":"k1"}] go`, "", `found k1`, false},
		{"schema violation is not run", `[sim tool=append args={"line":5}] go`, "", `property "line"`, true},
		{"unknown tool", `[sim tool=nope] go`, "", `unknown tool "nope"`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs, st := wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: wiretest.UserText(tt.prompt)}, nil)
			if st.Code() != codes.OK {
				t.Fatalf("status %v", st)
			}
			want := fmt.Sprintf(toolTurn, tt.progress)
			if tt.name == "unknown tool" {
				// A call to no tool at all never starts; a call with bad
				// arguments starts and is refused by the schema check.
				want = strings.Replace(want, "ToolStarted ", "", 1)
			}
			if got := wiretest.Names(evs); got != want {
				t.Errorf("events:\n got %s\nwant %s", got, want)
			}
			f := toolFinished(evs)
			if len(f) != 1 || !strings.Contains(f[0].GetContent(), tt.result) || f[0].GetIsError() != tt.isError {
				t.Errorf("tool finished = %v, want content with %q, is_error %v", f, tt.result, tt.isError)
			}
		})
	}
	if b, err := os.ReadFile(appendFile); err == nil && len(b) > 0 {
		t.Errorf("append ran despite invalid arguments: %q", b)
	}
}

func TestClientToolRoundTrip(t *testing.T) {
	w := serveYAML(t, mcpConfig(t, filepath.Join(t.TempDir(), "a"), ""))
	tools := []*turnstilev1.ToolDefinition{{Name: "ask_user", Description: "Asks the user a question."}}
	req := &turnstilev1.RunTurnRequest{Messages: wiretest.UserText(`[sim tool=ask_user args={"question":"name?"}] greet me`), Tools: tools}
	evs, st := wiretest.Collect(t, t.Context(), w.client, req, nil)
	done := evs[len(evs)-1].GetTurnCompleted()
	if st.Code() != codes.OK || done.GetEndReason() != turnstilev1.EndReason_END_REASON_TOOL_CALLS_REQUIRED {
		t.Fatalf("first turn: %v %v", st, done)
	}
	call := done.GetMessages()[0].GetParts()[0].GetToolCall()
	if call.GetName() != "ask_user" || call.GetArguments() != `{"question":"name?"}` {
		t.Fatalf("pending call = %v", call)
	}
	// The client runs the tool and sends the result with the conversation.
	convo := append(req.GetMessages(), done.GetMessages()...)
	convo = append(convo, &turnstilev1.Message{Role: turnstilev1.Role_ROLE_TOOL, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_ToolResult{
		ToolResult: &turnstilev1.ToolResult{CallId: call.GetId(), Name: "ask_user", Content: "Ada"},
	}}}})
	evs, st = wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: convo, Tools: tools}, nil)
	done = evs[len(evs)-1].GetTurnCompleted()
	if st.Code() != codes.OK || done.GetEndReason() != turnstilev1.EndReason_END_REASON_END_TURN {
		t.Fatalf("second turn: %v %v", st, done)
	}
	if text := done.GetMessages()[0].GetParts()[0].GetText(); !strings.Contains(text, "Ada") {
		t.Errorf("answer %q does not use the client's result", text)
	}
}

// TestDrainWithSideEffectsIsNotRetryable: a shutdown that interrupts a tool
// with side effects must not invite a blind replay, while an idempotent one
// may be retried.
func TestDrainWithSideEffectsIsNotRetryable(t *testing.T) {
	tests := []struct {
		name      string
		overrides string
		code      codes.Code
		errCode   turnstilev1.ErrorCode
		retryable bool
	}{
		{"not idempotent", "", codes.Aborted, turnstilev1.ErrorCode_ERROR_CODE_TOOLS_UNSAFE, false},
		{"declared idempotent", "    tool_overrides: {hang: {idempotent: true}}\n", codes.Unavailable, turnstilev1.ErrorCode_ERROR_CODE_UNAVAILABLE, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := serveYAML(t, mcpConfig(t, filepath.Join(t.TempDir(), "a"), tt.overrides))
			running := make(chan struct{})
			var once sync.Once
			go func() {
				<-running
				w.srv.Shutdown(context.Background())
			}()
			evs, st := wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: wiretest.UserText(`[sim tool=hang] wait`)}, func(ev *turnstilev1.AgentEvent) {
				if ev.GetToolProgress() != nil {
					once.Do(func() { close(running) })
				}
			})
			if st.Code() != tt.code {
				t.Fatalf("status = %v, want %v", st, tt.code)
			}
			e := evs[len(evs)-1].GetError()
			if e.GetCode() != tt.errCode || e.GetRetryable() != tt.retryable {
				t.Errorf("error = %v", e)
			}
		})
	}
}
