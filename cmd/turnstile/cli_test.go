package main

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestVersion(t *testing.T) {
	for _, arg := range []string{"version", "--version"} {
		var out, errOut bytes.Buffer
		if code := cli([]string{arg}, &out, &errOut); code != exitOK {
			t.Errorf("turnstile %s = %d", arg, code)
		}
		if got := out.String(); !strings.HasPrefix(got, "turnstile ") || !strings.Contains(got, runtime.Version()) {
			t.Errorf("turnstile %s printed %q", arg, got)
		}
	}
	version = "v9.9.9"
	defer func() { version = "" }()
	if got := versionString(); !strings.HasPrefix(got, "turnstile v9.9.9 ") {
		t.Errorf("with -X main.version: %q", got)
	}
}

func TestParseInterspersed(t *testing.T) {
	for _, tt := range []struct {
		args []string
		json bool
		addr string
		rest []string
	}{
		{[]string{"hello", "--json"}, true, "", []string{"hello"}},
		{[]string{"--json", "hello"}, true, "", []string{"hello"}},
		{[]string{"what", "time", "--addr", "h:1", "is", "it"}, false, "h:1", []string{"what", "time", "is", "it"}},
		{[]string{"say", "--", "--json", "literally"}, false, "", []string{"say", "--json", "literally"}},
		{[]string{"-", "--json"}, true, "", []string{"-"}},
		{nil, false, "", nil},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		j := fs.Bool("json", false, "")
		a := fs.String("addr", "", "")
		rest, err := parseInterspersed(fs, tt.args)
		if err != nil || *j != tt.json || *a != tt.addr || !slices.Equal(rest, tt.rest) {
			t.Errorf("parse %q = %q, json %v, addr %q, err %v; want %q, %v, %q", tt.args, rest, *j, *a, err, tt.rest, tt.json, tt.addr)
		}
	}
}

// buildTurnstile builds the command (or takes TURNSTILE_BIN) for tests
// that run it as a process.
func buildTurnstile(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("TURNSTILE_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "turnstile")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// Ctrl-C during a turn cancels it and exits 130, as a shell expects of a
// command stopped by SIGINT.
func TestRunInterruptExits130(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the command")
	}
	bin := buildTurnstile(t)
	addr := startSimServer(t)
	cmd := exec.Command(bin, "run", "--addr", addr, "[sim fail=timeout after=1] a story that never ends")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The first token has been rendered: the turn is under way.
	if _, err := stdout.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Errorf("exit code %d (%v), want 130; stderr:\n%s", code, err, stderr.String())
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("exited %v after SIGINT", d)
	}
	if !strings.Contains(stderr.String(), "turnstile run: interrupted") {
		t.Errorf("stderr = %q, want it to say interrupted", stderr.String())
	}
}
