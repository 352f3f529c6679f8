// Package livetest starts `turnstile serve` as a child process for tests
// that talk to a live server over the wire: the clients' conformance runs
// and the examples.
package livetest

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Serve runs `turnstile serve --config config` and returns the address it
// listens on, read from its "serving" log line (the configuration must log
// JSON; listen 127.0.0.1:0 picks a free port). TURNSTILE_BIN names a built
// binary; without it Serve builds one from root, the repository's root,
// once per test.
// The test's cleanup stops the server.
func Serve(tb testing.TB, root, config string) string {
	tb.Helper()
	cmd := exec.Command(Binary(tb, root), "serve", "--config", config)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	exited := make(chan struct{})
	addr := make(chan string, 1)
	var logTail strings.Builder
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line struct{ Msg, Address string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "serving" {
				addr <- line.Address
			} else if logTail.Len() < 1<<14 {
				logTail.WriteString(sc.Text() + "\n")
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
	}()
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	select {
	case a := <-addr:
		return a
	case <-exited:
		tb.Fatalf("turnstile serve exited before serving:\n%s", logTail.String())
	case <-time.After(30 * time.Second):
		tb.Fatal("turnstile serve did not log its address within 30s")
	}
	return ""
}

// Binary returns the turnstile binary the tests run: TURNSTILE_BIN, or one
// built from root once per test.
func Binary(tb testing.TB, root string) string {
	if bin := os.Getenv("TURNSTILE_BIN"); bin != "" {
		return bin
	}
	return binary(tb, root)
}

// built holds the binary each test built, so that a test starting several
// servers builds it once.
var built sync.Map // testing.TB -> string

// binary builds the turnstile binary from root once for tb and returns its
// path.
func binary(tb testing.TB, root string) string {
	if b, ok := built.Load(tb); ok {
		return b.(string)
	}
	bin := filepath.Join(tb.TempDir(), "turnstile")
	build := exec.Command("go", "build", "-o", bin, "./cmd/turnstile")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		tb.Fatalf("go build ./cmd/turnstile: %v\n%s", err, out)
	}
	built.Store(tb, bin)
	tb.Cleanup(func() { built.Delete(tb) })
	return bin
}
