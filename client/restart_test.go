package client_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/livetest"
)

// restartOutage is how long the server stays down in
// TestSurvivesServerRestart: longer than the ten re-attaches of the
// client's former budget (about 6.4s) took.
const restartOutage = 12 * time.Second

// serveProcess runs `turnstile serve --config config` until it logs that
// it serves, and returns a function that stops it with sig and waits.
func serveProcess(t *testing.T, bin, config string) (stop func(sig syscall.Signal)) {
	t.Helper()
	cmd := exec.Command(bin, "serve", "--config", config)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	serving, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stderr)
		once := sync.Once{}
		for sc.Scan() {
			var line struct{ Msg string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "serving" {
				once.Do(func() { close(serving) })
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
	}()
	var stopped bool
	stop = func(sig syscall.Signal) {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(sig)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	t.Cleanup(func() { stop(syscall.SIGTERM) })
	select {
	case <-serving:
	case <-exited:
		t.Fatal("turnstile serve exited before serving")
	case <-time.After(30 * time.Second):
		t.Fatal("turnstile serve did not serve within 30s")
	}
	return stop
}

// TestSurvivesServerRestart: an embedded-mode server is killed (SIGKILL)
// while turns stream and started again on the same address and store directory
// restartOutage later; every client, with its default options,
// re-attaches to its run once the server is back and the turn completes,
// without a step retry.
func TestSurvivesServerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the turnstile binary and waits for a restart")
	}
	bin := livetest.Binary(t, "..")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	dir := t.TempDir()
	config := filepath.Join(dir, "turnstile.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, `listen: %s
log: {format: json, level: info}
providers:
  sim: {type: simulator, token_delay: 20ms}
models:
  sim: {provider: sim, model: turnstile-sim-1, context_window: 32000}
default_model: sim
server: {shutdown_grace: 100ms, drain_delay: 0s}
store: {mode: embedded, dir: %q}
`, addr, filepath.Join(dir, "jetstream")), 0o600); err != nil {
		t.Fatal(err)
	}
	const answer = "A restart is an outage the client waits out, however many tries it takes, until the turn goes on where it stopped."
	prompt := `[sim reply="` + answer + `"] go on`

	stop := serveProcess(t, bin, config)
	const turns = 2
	var wg sync.WaitGroup
	streaming := make(chan struct{}, turns)
	type outcome struct {
		res         *client.Result
		err         error
		text        strings.Builder
		stepRetries int
	}
	outs := make([]*outcome, turns)
	var logs lockedBuffer
	defer func() {
		if t.Failed() {
			t.Logf("the clients' log:\n%s", logs.String())
		}
	}()
	for i := range turns {
		o := &outcome{}
		outs[i] = o
		c := newClient(t, addr, client.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := true
			for ev, err := range c.RunTurn(t.Context(), userRequest(prompt)).Events() {
				if err != nil {
					o.err = err
					return
				}
				if ev.StepRetry != nil {
					o.stepRetries++
				}
				if d := ev.Agent.GetTextDelta(); d != nil {
					o.text.WriteString(d.GetText())
					if first {
						first = false
						streaming <- struct{}{}
					}
				}
				if r := ev.Agent.GetRetry(); r.GetDiscardPartial() {
					o.text.Reset() // the taken-over call streams afresh
				}
				if tc := ev.Agent.GetTurnCompleted(); tc != nil {
					o.res = &client.Result{EndReason: tc.GetEndReason()}
				}
			}
		}()
	}
	for range turns {
		<-streaming
	}
	down := time.Now()
	stop(syscall.SIGKILL)
	time.Sleep(restartOutage - time.Since(down))
	serveProcess(t, bin, config)
	t.Logf("the server was down %v", time.Since(down).Round(time.Millisecond))
	wg.Wait()
	for i, o := range outs {
		if o.err != nil {
			t.Errorf("turn %d failed: %v", i, o.err)
			continue
		}
		if o.res == nil || o.res.EndReason != turnstilev1.EndReason_END_REASON_END_TURN {
			t.Errorf("turn %d: result %v, want END_TURN", i, o.res)
		}
		if o.stepRetries != 0 {
			t.Errorf("turn %d: %d step retries, want the run re-attached", i, o.stepRetries)
		}
		if got := strings.TrimSpace(o.text.String()); got != answer {
			t.Errorf("turn %d: text %q, want %q", i, got, answer)
		}
	}
}
