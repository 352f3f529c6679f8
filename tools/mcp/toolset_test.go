package mcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/tools/argcheck"
	"github.com/turnstile-dev/turnstile/tools/mcp"
)

// stdioServer returns a config for the test server that appends to a file in
// a temporary directory, and that file's path.
func stdioServer(t *testing.T, name string) (mcp.ServerConfig, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "appended.txt")
	return mcp.ServerConfig{
		Name:    name,
		Command: serverBin,
		Env:     map[string]string{"APPEND_FILE": file},
	}, file
}

// newToolset starts a toolset and closes it when the test ends.
func newToolset(t *testing.T, servers ...mcp.ServerConfig) *mcp.Toolset {
	t.Helper()
	ts, err := mcp.New(t.Context(), servers, mcp.WithReconnect(3, 20*time.Millisecond), mcp.WithTerminateGrace(time.Second))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { ts.Close() })
	return ts
}

func toolNamed(t *testing.T, ts *mcp.Toolset, name string) llm.Tool {
	t.Helper()
	tools, err := ts.Select([]string{name})
	if err != nil {
		t.Fatal(err)
	}
	return tools[0]
}

func names(tools []llm.Tool) []string {
	var out []string
	for _, t := range tools {
		out = append(out, t.Spec().Name)
	}
	return out
}

// lines counts the lines of the append tool's file: its executions.
func lines(t *testing.T, file string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

func call(t *testing.T, tool llm.Tool, args string) llm.ToolOutput {
	t.Helper()
	out, err := tool.Call(t.Context(), llm.ToolCall{ID: "c1", Name: tool.Spec().Name, Arguments: args}, nil)
	if err != nil {
		t.Fatalf("%s(%s): %v", tool.Spec().Name, args, err)
	}
	return out
}

func TestSpecs(t *testing.T) {
	cfg, _ := stdioServer(t, "local")
	yes, no := true, false
	overridden := cfg
	overridden.Overrides = map[string]mcp.ToolOverride{
		"append": {Idempotent: &yes},
		"lookup": {ReadOnly: &no, Idempotent: &no},
	}
	tests := []struct {
		name string
		cfg  mcp.ServerConfig
		want map[string]llm.ToolSpec // by tool name, schema left out
	}{
		{
			name: "from annotations",
			cfg:  cfg,
			want: map[string]llm.ToolSpec{
				"lookup":   {Name: "lookup", Description: "Looks a key up.", ReadOnly: true, Idempotent: true},
				"append":   {Name: "append", Description: "Appends a line to a file."},
				"progress": {Name: "progress", Description: "Reports progress three times."},
			},
		},
		{
			name: "overridden",
			cfg:  overridden,
			want: map[string]llm.ToolSpec{
				"lookup": {Name: "lookup", Description: "Looks a key up."},
				"append": {Name: "append", Description: "Appends a line to a file.", Idempotent: true},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := newToolset(t, tt.cfg)
			if got, want := names(ts.Tools()), []string{"append", "fail", "hang", "lookup", "progress", "screenshot", "slow_append", "slow_lookup"}; !slices.Equal(got, want) {
				t.Fatalf("Tools() = %v, want %v", got, want)
			}
			for name, want := range tt.want {
				got := toolNamed(t, ts, name).Spec()
				var schema map[string]any
				if err := json.Unmarshal(got.Schema, &schema); err != nil || schema["type"] != "object" {
					t.Errorf("%s: Schema = %s, want an object schema", name, got.Schema)
				}
				got.Schema = nil
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("%s: Spec() mismatch (-want +got):\n%s", name, diff)
				}
			}
		})
	}
}

func TestLookupSchemaIsTheServers(t *testing.T) {
	cfg, _ := stdioServer(t, "local")
	ts := newToolset(t, cfg)
	got := toolNamed(t, ts, "lookup").Spec().Schema
	var m map[string]any
	if err := json.Unmarshal(got, &m); err != nil {
		t.Fatal(err)
	}
	if m["additionalProperties"] != false || !slices.Equal(m["required"].([]any), []any{"key"}) {
		t.Errorf("lookup schema = %s, want the server's", got)
	}
}

func TestProgress(t *testing.T) {
	cfg, _ := stdioServer(t, "local")
	ts := newToolset(t, cfg)
	var (
		mu  sync.Mutex
		got []llm.ToolProgress
	)
	out, err := toolNamed(t, ts, "progress").Call(t.Context(), llm.ToolCall{Arguments: `{}`}, func(p llm.ToolProgress) {
		mu.Lock()
		got = append(got, p)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if out.Content != "done" || out.IsError {
		t.Errorf("progress() = %+v, want done", out)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []llm.ToolProgress{
		{Message: "step 1", Progress: 1, Total: 3},
		{Message: "step 2", Progress: 2, Total: 3},
		{Message: "step 3", Progress: 3, Total: 3},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("progress events mismatch (-want +got):\n%s", diff)
	}
}

func TestResults(t *testing.T) {
	cfg, _ := stdioServer(t, "local")
	ts := newToolset(t, cfg)
	tests := []struct {
		tool, args string
		want       llm.ToolOutput
	}{
		{tool: "fail", args: `{}`, want: llm.ToolOutput{Content: "the widget is broken", IsError: true}},
		{tool: "lookup", args: `{"key":"a"}`, want: llm.ToolOutput{Content: "found a\n{\"key\":\"a\",\"value\":\"v-a\"}"}},
		{tool: "progress", args: ``, want: llm.ToolOutput{Content: "done"}}, // no progress callback, empty arguments
		{tool: "lookup", args: `{"key":`, want: llm.ToolOutput{Content: `Invalid arguments for tool "lookup": they are not valid JSON.`, IsError: true}},
		{tool: "lookup", args: `["a"]`, want: llm.ToolOutput{Content: `Invalid arguments for tool "lookup": they must be a JSON object.`, IsError: true}},
		// Images, audio and embedded blobs of the types turnstile passes on
		// go to the model as media; an SVG stays a placeholder.
		{tool: "screenshot", args: `{}`, want: llm.ToolOutput{Content: "the screen\n[image image/svg+xml, 6 bytes]", Media: []llm.Media{
			{MIMEType: "image/png", Data: append([]byte("\x89PNG\r\n\x1a\n"), make([]byte, 60)...)},
			{MIMEType: "audio/wav", Data: []byte("RIFF0000WAVE")},
			{MIMEType: "application/pdf", Data: []byte("%PDF-1.7"), Name: "q3.pdf"},
		}}},
	}
	for _, tt := range tests {
		t.Run(tt.tool, func(t *testing.T) {
			got := call(t, toolNamed(t, ts, tt.tool), tt.args)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("%s(%s) mismatch (-want +got):\n%s", tt.tool, tt.args, diff)
			}
		})
	}
}

// startHang calls the hang tool in the background and returns the server's
// pid once the tool runs, and a channel with the call's outcome.
func startHang(t *testing.T, ctx context.Context, tool llm.Tool) (int, <-chan error) {
	t.Helper()
	pids := make(chan int, 1)
	done := make(chan error, 1)
	go func() {
		_, err := tool.Call(ctx, llm.ToolCall{Arguments: `{}`}, func(p llm.ToolProgress) {
			if m := regexp.MustCompile(`pid=(\d+)`).FindStringSubmatch(p.Message); m != nil {
				pid, _ := strconv.Atoi(m[1])
				pids <- pid
			}
		})
		done <- err
	}()
	select {
	case pid := <-pids:
		return pid, done
	case err := <-done:
		t.Fatalf("hang returned before it started: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("hang did not start")
	}
	return 0, nil
}

func waitErr(t *testing.T, done <-chan error, within time.Duration) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(within):
		t.Fatalf("call still running after %s", within)
		return nil
	}
}

func TestCancel(t *testing.T) {
	cfg, _ := stdioServer(t, "local")
	ts := newToolset(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	_, done := startHang(t, ctx, toolNamed(t, ts, "hang"))
	start := time.Now()
	cancel()
	err := waitErr(t, done, 2*time.Second)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("hang() after cancel = %v, want context.Canceled", err)
	}
	t.Logf("returned %s after cancel: %v", time.Since(start), err)
	// The session survives a cancelled call.
	if out := call(t, toolNamed(t, ts, "lookup"), `{"key":"b"}`); !strings.HasPrefix(out.Content, "found b") {
		t.Errorf("lookup after cancel = %+v", out)
	}
}

func TestTimeoutOverride(t *testing.T) {
	cfg, _ := stdioServer(t, "local")
	cfg.Overrides = map[string]mcp.ToolOverride{"hang": {Timeout: 100 * time.Millisecond}}
	ts := newToolset(t, cfg)
	_, err := toolNamed(t, ts, "hang").Call(t.Context(), llm.ToolCall{Arguments: `{}`}, nil)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "timed out after 100ms") {
		t.Fatalf("hang() = %v, want a timeout after 100ms", err)
	}
}

func TestServerKilledMidCall(t *testing.T) {
	cfg, file := stdioServer(t, "local")
	ts := newToolset(t, cfg)
	pid, done := startHang(t, t.Context(), toolNamed(t, ts, "hang"))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := waitErr(t, done, 5*time.Second)
	if err == nil || errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), `mcp server "local"`) {
		t.Fatalf("hang() after kill = %v, want an error naming the server", err)
	}
	t.Logf("error: %v", err)

	// The next call reconnects (a new process) and succeeds.
	pid2, done2 := startHang(t, t.Context(), toolNamed(t, ts, "hang"))
	if pid2 == pid {
		t.Fatalf("same pid %d after reconnect", pid)
	}
	if out := call(t, toolNamed(t, ts, "append"), `{"line":"after"}`); out.IsError {
		t.Fatalf("append after reconnect = %+v", out)
	}
	if n := lines(t, file); n != 1 {
		t.Errorf("append ran %d times, want 1", n)
	}
	ts.Close()
	if err := waitErr(t, done2, 5*time.Second); err == nil {
		t.Error("hang() after Close = nil error, want one")
	}
}

func TestArgumentValidationBeforeTheServer(t *testing.T) {
	cfg, file := stdioServer(t, "local")
	ts := newToolset(t, cfg)
	tool, err := argcheck.Wrap(toolNamed(t, ts, "append"))
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range []string{`{"line":5}`, `{}`, `{"line":"x"`, `["x"]`} {
		out := call(t, tool, args)
		if !out.IsError {
			t.Errorf("append(%s) = %+v, want an error result", args, out)
		}
	}
	if n := lines(t, file); n != 0 {
		t.Fatalf("append ran %d times on invalid arguments, want 0", n)
	}
	if out := call(t, tool, `{"line":"ok"}`); out.IsError || out.Content != "appended" {
		t.Fatalf("append(valid) = %+v", out)
	}
	if n := lines(t, file); n != 1 {
		t.Fatalf("append ran %d times, want 1", n)
	}
	// Every tool of the test server has a schema argcheck accepts.
	for _, tl := range ts.Tools() {
		if _, err := argcheck.Wrap(tl); err != nil {
			t.Errorf("argcheck.Wrap(%s): %v", tl.Spec().Name, err)
		}
	}
}

func TestAllowlist(t *testing.T) {
	cfg, _ := stdioServer(t, "local")
	cfg.Tools = []string{"lookup", "fail"}
	ts := newToolset(t, cfg)
	if got, want := names(ts.Tools()), []string{"fail", "lookup"}; !slices.Equal(got, want) {
		t.Fatalf("Tools() = %v, want %v", got, want)
	}
	if _, err := ts.Select([]string{"append"}); err == nil {
		t.Error(`Select("append") = nil error, want one for a tool left out`)
	}
	sel, err := ts.Select([]string{"lookup"})
	if err != nil || !slices.Equal(names(sel), []string{"lookup"}) {
		t.Errorf("Select(lookup) = %v, %v", names(sel), err)
	}
	all, err := ts.Select(nil)
	if err != nil || len(all) != 2 {
		t.Errorf("Select(nil) = %v, %v; want every tool", names(all), err)
	}
}

func TestStartErrors(t *testing.T) {
	a, _ := stdioServer(t, "alpha")
	b, _ := stdioServer(t, "beta")
	withTools := func(c mcp.ServerConfig, tools ...string) mcp.ServerConfig { c.Tools = tools; return c }
	withOverride := func(c mcp.ServerConfig, tool string) mcp.ServerConfig {
		c.Overrides = map[string]mcp.ToolOverride{tool: {Timeout: time.Second}}
		return c
	}
	tests := []struct {
		name    string
		servers []mcp.ServerConfig
		want    []string // fragments of the error
	}{
		{name: "collision", servers: []mcp.ServerConfig{a, b}, want: []string{`server "alpha"`, `server "beta"`, "tool_prefix"}},
		{name: "allowlisted tool missing", servers: []mcp.ServerConfig{withTools(a, "lookup", "nope")}, want: []string{`"alpha"`, `"nope"`}},
		{name: "override of a missing tool", servers: []mcp.ServerConfig{withOverride(a, "nope")}, want: []string{"tool_overrides", `"nope"`}},
		{name: "command not found", servers: []mcp.ServerConfig{{Name: "ghost", Command: filepath.Join(t.TempDir(), "missing")}}, want: []string{`server "ghost"`}},
		{name: "no command or url", servers: []mcp.ServerConfig{{Name: "empty"}}, want: []string{`"empty"`, "command or url"}},
		{name: "duplicate name", servers: []mcp.ServerConfig{a, a}, want: []string{`"alpha"`, "twice"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts, err := mcp.New(t.Context(), tt.servers, mcp.WithTerminateGrace(time.Second))
			if err == nil {
				ts.Close()
				t.Fatal("New succeeded, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("New error = %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

func TestPrefixAvoidsCollision(t *testing.T) {
	a, _ := stdioServer(t, "alpha")
	b, fileB := stdioServer(t, "beta")
	b.ToolPrefix = "beta_"
	b.Tools = []string{"append", "lookup"}
	ts := newToolset(t, a, b)
	want := []string{"append", "beta_append", "beta_lookup", "fail", "hang", "lookup", "progress", "screenshot", "slow_append", "slow_lookup"}
	if got := names(ts.Tools()); !slices.Equal(got, want) {
		t.Fatalf("Tools() = %v, want %v", got, want)
	}
	if out := call(t, toolNamed(t, ts, "beta_append"), `{"line":"b"}`); out.IsError {
		t.Fatalf("beta_append = %+v", out)
	}
	if n := lines(t, fileB); n != 1 {
		t.Errorf("beta's append ran %d times, want 1", n)
	}
}

func TestCloseStopsCalls(t *testing.T) {
	cfg, _ := stdioServer(t, "local")
	ts, err := mcp.New(t.Context(), []mcp.ServerConfig{cfg}, mcp.WithTerminateGrace(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	hang := toolNamed(t, ts, "hang")
	_, done := startHang(t, t.Context(), hang)
	start := time.Now()
	ts.Close()
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Close took %s", d)
	}
	if err := waitErr(t, done, time.Second); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("hang() during Close = %v, want a closed error", err)
	}
	if _, err := toolNamed(t, ts, "lookup").Call(t.Context(), llm.ToolCall{Arguments: `{"key":"a"}`}, nil); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("lookup after Close = %v, want a closed error", err)
	}
	ts.Close() // idempotent
}

func TestEnvironmentIsNotInherited(t *testing.T) {
	// The append tool writes where $APPEND_FILE says; set in turnstile's own
	// environment only, it must not reach the server unless named in EnvFrom.
	file := filepath.Join(t.TempDir(), "from-env.txt")
	t.Setenv("APPEND_FILE", file)
	cfg := mcp.ServerConfig{Name: "local", Command: serverBin}
	ts := newToolset(t, cfg)
	out, err := toolNamed(t, ts, "append").Call(t.Context(), llm.ToolCall{Arguments: `{"line":"x"}`}, nil)
	if err == nil && !out.IsError {
		t.Fatalf("append without APPEND_FILE = %+v, want a failure", out)
	}
	if n := lines(t, file); n != 0 {
		t.Fatalf("the server saw APPEND_FILE without env_from")
	}

	cfg.EnvFrom = []string{"APPEND_FILE"}
	ts2 := newToolset(t, cfg)
	if out := call(t, toolNamed(t, ts2, "append"), `{"line":"x"}`); out.IsError {
		t.Fatalf("append with EnvFrom = %+v", out)
	}
	if n := lines(t, file); n != 1 {
		t.Fatalf("append ran %d times, want 1", n)
	}
}

func TestConcurrentCalls(t *testing.T) {
	cfg, file := stdioServer(t, "local")
	ts := newToolset(t, cfg)

	// Kill the server first: the concurrent calls below must share one
	// reconnect.
	pid, done := startHang(t, t.Context(), toolNamed(t, ts, "hang"))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, done, 5*time.Second); err == nil {
		t.Fatal("hang() after kill = nil error")
	}

	const n = 8
	lookup, progress, appendTool := toolNamed(t, ts, "lookup"), toolNamed(t, ts, "progress"), toolNamed(t, ts, "append")
	var wg sync.WaitGroup
	errs := make(chan error, 3*n)
	for i := range n {
		wg.Go(func() {
			key := strconv.Itoa(i)
			out, err := lookup.Call(t.Context(), llm.ToolCall{Arguments: `{"key":"` + key + `"}`}, nil)
			if err != nil || !strings.HasPrefix(out.Content, "found "+key+"\n") {
				errs <- fmt.Errorf("lookup(%s) = %+v, %v", key, out, err)
			}
		})
		wg.Go(func() {
			var got []llm.ToolProgress
			var mu sync.Mutex
			_, err := progress.Call(t.Context(), llm.ToolCall{Arguments: `{}`}, func(p llm.ToolProgress) {
				mu.Lock()
				got = append(got, p)
				mu.Unlock()
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil || len(got) != 3 || got[2].Message != "step 3" {
				errs <- fmt.Errorf("progress() = %v, events %+v", err, got)
			}
		})
		wg.Go(func() {
			if _, err := appendTool.Call(t.Context(), llm.ToolCall{Arguments: `{"line":"l"}`}, nil); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := lines(t, file); got != n {
		t.Errorf("append ran %d times, want %d", got, n)
	}
}
