package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/natstest"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/store"
)

// turnstileBinary builds `turnstile` into dir.
func turnstileBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "turnstile")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// process is one `turnstile serve` replica.
type process struct {
	cmd     *exec.Cmd
	addr    string
	replica string // its store's replica id
	exited  chan struct{}
}

var replicaRE = regexp.MustCompile(`msg="turn store ready" replica=([0-9a-f]+)`)

// startReplica starts `turnstile serve` on addr and waits until it serves;
// owner's cleanup kills it.
func startReplica(t, owner *testing.T, bin, config, addr string) *process {
	t.Helper()
	cmd := exec.Command(bin, "serve", "--config", config, "--listen", addr)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, addr: addr, exited: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			if m := replicaRE.FindStringSubmatch(line); m != nil {
				p.replica = m[1]
			}
			if strings.Contains(line, "msg=serving") {
				close(ready)
			}
			if os.Getenv("TURNSTILE_TEST_VERBOSE") != "" {
				fmt.Fprintf(os.Stderr, "[%s] %s\n", addr, line)
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	go func() { _ = cmd.Wait(); close(p.exited) }()
	owner.Cleanup(func() { p.kill(syscall.SIGKILL) })
	select {
	case <-ready:
	case <-p.exited:
		t.Fatalf("replica on %s exited before serving", addr)
	case <-time.After(30 * time.Second):
		t.Fatalf("replica on %s did not start", addr)
	}
	return p
}

func (p *process) kill(sig syscall.Signal) {
	_ = p.cmd.Process.Signal(sig)
	<-p.exited
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestReplicaDeath runs three `turnstile serve` replicas against a NATS
// server and kills the one running a turn with SIGKILL: mid-delta, and
// mid-tool (between the tool's intent and its result) for a tool with
// side effects and for an idempotent one; then it stops one with SIGTERM
// while its turn is longer than the shutdown grace, which hands the turn
// to another replica. Every turn reaches a terminal event for its client,
// whose events (live, then re-attached on another replica) equal the log,
// gap-free and without duplicates; a tool with side effects never runs
// twice.
func TestReplicaDeath(t *testing.T) {
	bin := turnstileBinary(t)
	url := natstest.Start(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	// TURNSTILE_DEATH_LEASE_TTL measures takeovers with another lease TTL
	// (BENCHMARKS.md uses the default, 2s).
	leaseTTL := cmp.Or(os.Getenv("TURNSTILE_DEATH_LEASE_TTL"), "1s")
	dir := t.TempDir()
	counted := filepath.Join(dir, "executions")
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, `
providers:
  sim: {type: simulator, token_delay: 40ms}
models:
  sim: {provider: sim, model: turnstile-sim-1}
mcp_servers:
  test:
    command: %s
    env: {APPEND_FILE: %s}
store:
  mode: nats
  nats: {url: %s}
  lease_ttl: %s
server: {shutdown_grace: 1s, drain_delay: 0s}
`, mcpServerBinary(t), counted, url, leaseTTL), 0o600); err != nil {
		t.Fatal(err)
	}
	procs := make([]*process, 3)
	var addrs []string
	for i := range procs {
		addrs = append(addrs, freeAddr(t))
		procs[i] = startReplica(t, t, bin, config, addrs[i])
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	leases, err := js.KeyValue(t.Context(), store.LeaseBucket)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(strings.Join(addrs, ","), client.WithInsecure(), client.WithMaxStepRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	tests := []struct {
		name   string
		prompt string
		// killAt says when to kill the owner.
		killAt func(*turnstilev1.AgentEvent) bool
		// sigterm stops the owner with SIGTERM (a shutdown), not SIGKILL.
		sigterm bool
		// wantErr is the terminal error code, unspecified for success.
		wantErr turnstilev1.ErrorCode
		// lines is what the tools appended, in all.
		lines string
	}{{
		name:   "mid-delta",
		prompt: `[sim reply="one two three four five six seven eight nine ten eleven twelve"] count`,
		killAt: func(ev *turnstilev1.AgentEvent) bool { return ev.GetTextDelta() != nil },
	}, {
		name:    "mid-tool with side effects",
		prompt:  `[sim tool=slow_append args={"line":"deployed","ms":4000}] deploy`,
		killAt:  func(ev *turnstilev1.AgentEvent) bool { return ev.GetToolStarted() != nil },
		wantErr: turnstilev1.ErrorCode_ERROR_CODE_TOOLS_UNSAFE,
		lines:   "deployed\n",
	}, {
		name:   "mid-tool, idempotent",
		prompt: `[sim tool=slow_lookup args={"ms":1500}] look it up`,
		killAt: func(ev *turnstilev1.AgentEvent) bool { return ev.GetToolStarted() != nil },
		lines:  "lookup\nlookup\n",
	}, {
		// 80 words at 40ms: longer than the shutdown grace (1s).
		name:    "SIGTERM mid-delta, the turn outlasting the grace",
		prompt:  `[sim reply="` + strings.Repeat("word ", 79) + `end"] talk`,
		killAt:  func(ev *turnstilev1.AgentEvent) bool { return ev.GetTextDelta() != nil },
		sigterm: true,
	}}
	parent := t
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_ = os.Remove(counted)
			id := fmt.Sprintf("death-%d", i)
			req := &turnstilev1.RunTurnRequest{TurnId: id, Messages: []*turnstilev1.Message{{
				Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: tt.prompt}}},
			}}}
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			turn := c.RunTurn(ctx, req)
			var got []*turnstilev1.AgentEvent
			var killed, lastAt time.Time
			var takeover, pause time.Duration
			var turnErr error
			// A replica stopped with SIGTERM: its index and when it exited.
			type exit struct {
				j  int
				at time.Time
			}
			stopped := make(chan exit, 1)
			for ev, err := range turn.Events() {
				if err != nil {
					turnErr = err
					break
				}
				got = append(got, ev.Agent)
				if !killed.IsZero() && takeover == 0 {
					takeover = time.Since(killed)
				}
				if !killed.IsZero() {
					pause = max(pause, time.Since(lastAt))
				}
				lastAt = time.Now()
				if killed.IsZero() && tt.killAt(ev.Agent) {
					if tt.lines != "" {
						waitForFile(t, counted)
					}
					owner := ownerOf(t, leases, id)
					for j, p := range procs {
						switch {
						case p.replica != owner:
						case tt.sigterm:
							// It drains while the turn goes on.
							killed = time.Now()
							go func() { p.kill(syscall.SIGTERM); stopped <- exit{j, time.Now()} }()
						default:
							killed = time.Now()
							p.kill(syscall.SIGKILL)
							// A fresh replica takes the dead one's address.
							procs[j] = startReplica(t, parent, bin, config, p.addr)
						}
					}
					if killed.IsZero() {
						t.Fatalf("no replica %q owns the turn", owner)
					}
				}
			}
			if killed.IsZero() {
				t.Fatal("the owner was never killed")
			}
			if tt.sigterm {
				ended := time.Now()
				var e exit
				select {
				case e = <-stopped:
				case <-time.After(30 * time.Second):
					t.Fatal("the replica stopped with SIGTERM did not exit")
				}
				t.Logf("the replica exited %v after the SIGTERM (shutdown_grace 1s); the turn ended %v after it; the client's longest pause between two events after it: %v",
					e.at.Sub(killed), ended.Sub(killed), pause)
				// It hands the turn off at the end of the grace and exits:
				// the turn, which runs its model call again elsewhere
				// (3.2 s of tokens), ends well after that.
				if e.at.After(ended) {
					t.Errorf("the replica exited %v after the SIGTERM, after the turn it handed off ended (%v)", e.at.Sub(killed), ended.Sub(killed))
				}
				procs[e.j] = startReplica(t, parent, bin, config, procs[e.j].addr)
			} else {
				t.Logf("the client's next event came %v after the SIGKILL", takeover)
			}
			var te *client.TurnError
			switch {
			case tt.wantErr == turnstilev1.ErrorCode_ERROR_CODE_UNSPECIFIED && turnErr != nil:
				t.Fatalf("turn failed: %v\nevents: %s", turnErr, wiretest.Names(got))
			case tt.wantErr != turnstilev1.ErrorCode_ERROR_CODE_UNSPECIFIED && (!errors.As(turnErr, &te) || te.Code != tt.wantErr || te.Retryable):
				t.Fatalf("turn ended with %v, want %v not retryable; events %s", turnErr, tt.wantErr, wiretest.Names(got))
			}
			last := got[len(got)-1]
			if last.GetTurnCompleted() == nil && last.GetError() == nil {
				t.Fatalf("no terminal event: %s", wiretest.Names(got))
			}
			// What the client saw, live then re-attached, is the log.
			log := readLog(t, procs[(i+1)%len(procs)].addr, id)
			if len(got) != len(log) {
				t.Fatalf("client saw %d events, the log holds %d:\n got %s\n log %s", len(got), len(log), wiretest.Names(got), wiretest.Names(log))
			}
			for j := range got {
				if got[j].GetSeq() != uint64(j+1) || !proto.Equal(got[j], log[j]) {
					t.Fatalf("event %d differs from the log:\n got %v\n log %v", j, got[j], log[j])
				}
			}
			if i == 0 || tt.sigterm {
				discarded := false
				for _, ev := range got {
					discarded = discarded || ev.GetRetry().GetDiscardPartial()
				}
				if !discarded {
					t.Errorf("no retry told the client to drop the interrupted output: %s", wiretest.Names(got))
				}
			}
			b, _ := os.ReadFile(counted)
			if string(b) != tt.lines {
				t.Errorf("tool executions %q, want %q", b, tt.lines)
			}
		})
	}
}

// ownerOf returns the replica id holding the lease of turn id's attempt 1.
func ownerOf(t *testing.T, leases jetstream.KeyValue, id string) string {
	t.Helper()
	e, err := leases.Get(t.Context(), base64.RawURLEncoding.EncodeToString([]byte(id))+".1")
	if err != nil {
		t.Fatalf("lease of %s: %v", id, err)
	}
	return string(e.Value())
}

// waitForFile waits until the tool's side effect reached the file: the
// tool runs in another process.
func waitForFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the tool never ran")
}

// readLog returns the stored events of turn id's attempt 1, as the
// replica at addr reads them.
func readLog(t *testing.T, addr, id string) []*turnstilev1.AgentEvent {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	evs, _ := wiretest.Watch(t, t.Context(), turnstilev1.NewAgentServiceClient(conn), &turnstilev1.WatchTurnRequest{TurnId: id, Attempt: 1})
	return evs
}
