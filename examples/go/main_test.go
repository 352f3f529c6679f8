package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/internal/livetest"
)

// The example, built and run as a program against a live server: a first
// attempt that fails after streaming, the client's step retry, the reply.
func TestExample(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts the turnstile binary")
	}
	addr := livetest.Serve(t, "../..", "../../clients/conformance/server.yaml")
	bin := filepath.Join(t.TempDir(), "example")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, `[sim fail=server_error times=1 after=1] [sim reply="Hello from Go."]`, "hi")
	cmd.Env = append(os.Environ(), "TURNSTILE_ADDR="+addr)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("example: %v\n%s", err, out)
	}
	if want := "Hello \n[retrying: SERVER_ERROR]\nHello from Go.\nEND_REASON_END_TURN\n"; string(out) != want {
		t.Errorf("example printed %q, want %q", out, want)
	}
	cmd = exec.Command(bin, "[sim fail=auth] hi")
	cmd.Env = append(os.Environ(), "TURNSTILE_ADDR="+addr)
	out, err = cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "AUTH: invalid x-api-key") {
		t.Errorf("a failed turn: err %v, output %q; want exit 1 and the AUTH error", err, out)
	}
}
