package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// UpstreamPlaceholder is replaced, in a configuration template, by the
// fake upstream's base URL.
const UpstreamPlaceholder = "$UPSTREAM"

// opsBlock is appended to every configuration: the server's ops listener
// on a loopback port (%s), with the runtime's debugging endpoints (the
// allocation counters, a forced collection, CPU profiles) and without
// /metrics, which would turn metrics on. A template must not set ops
// itself.
const opsBlock = "\nops: {listen: %q, metrics: false, pprof: true}\n"

// DefaultConfig is the server configuration the bench uses when none is
// given: one OpenAI-compatible provider at the fake upstream and one
// model, plus the slow model for the slow turns, and room for every slow
// turn (the server runs 512 turns at once, 1024 with a store, by
// default). The turn store is the default one (embedded, its files under
// the server's temporary directory); [StoreOff] is the same with
// `store: {mode: off}`. A build older than these keys refuses them: give
// it --config.
const DefaultConfig = `providers:
  up: {type: openai, base_url: "$UPSTREAM"}
models:
  m: {provider: up, model: bench-model}
  slow: {provider: up, model: bench-slow}
default_model: m
server: {max_concurrent_turns: 50000, max_running_turns: 50000}
`

// StoreOff is the line appended to a configuration to measure it with no
// turn store. A configuration that sets store itself is measured as it is.
const StoreOff = "store: {mode: off}\n"

// ChainConfig is [DefaultConfig] with a chain of three models, each with
// retries, so the cost of a configured chain on the success path shows.
const ChainConfig = `providers:
  up: {type: openai, base_url: "$UPSTREAM"}
  up2: {type: openai, base_url: "$UPSTREAM"}
  up3: {type: openai, base_url: "$UPSTREAM"}
models:
  m: {provider: up, model: bench-model, fallbacks: [m2, m3], retry: {max_retries: 2}}
  m2: {provider: up2, model: bench-model, retry: {max_retries: 2}}
  m3: {provider: up3, model: bench-model, retry: {max_retries: 2}}
  slow: {provider: up, model: bench-slow}
default_model: m
server: {max_concurrent_turns: 50000, max_running_turns: 50000}
`

// child is the server under test, run as a child process.
type child struct {
	cmd    *exec.Cmd
	addr   string // gRPC address
	ops    string // the ops listener's address
	stderr *bytes.Buffer
	dir    string
	done   chan struct{}
	err    error // the process's exit, once done is closed
	// callgrind is the dump file of a server run under callgrind, empty
	// otherwise.
	callgrind string
}

// startChild writes the configuration (template with the upstream's URL)
// to a temporary directory and starts bin serve on free loopback ports,
// under callgrind with its counting off when callgrind is set, waiting
// until its health check answers SERVING.
func startChild(ctx context.Context, bin, template, upstreamURL string, env []string, callgrind bool) (*child, error) {
	dir, err := os.MkdirTemp("", "turnstile-bench-")
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, "config.yaml")
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	ops, err := freePort()
	if err != nil {
		return nil, err
	}
	cfg := strings.ReplaceAll(template, UpstreamPlaceholder, upstreamURL) + fmt.Sprintf(opsBlock, ops)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	c := &child{addr: addr, ops: ops, stderr: &bytes.Buffer{}, dir: dir, done: make(chan struct{})}
	args := []string{bin, "serve", "--config", cfgPath, "--listen", addr}
	// The embedded store's default directory is under XDG_STATE_HOME:
	// this run's own, removed with it.
	env = append(append(os.Environ(), "XDG_STATE_HOME="+dir), env...)
	if callgrind {
		c.callgrind = filepath.Join(dir, "callgrind.out")
		args = append([]string{"valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-instr=no",
			"--callgrind-out-file=" + c.callgrind}, args...)
		// Go's asynchronous preemption signals upset callgrind's signal
		// handling. A GODEBUG of --env keeps its settings.
		godebug := "GODEBUG=asyncpreemptoff=1"
		for _, kv := range env {
			if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok && v != "" {
				godebug = "GODEBUG=" + v + ",asyncpreemptoff=1"
			}
		}
		env = append(env, godebug)
	}
	c.cmd = exec.Command(args[0], args[1:]...)
	c.cmd.Env = env
	c.cmd.Stderr = &limitedWriter{b: c.stderr, n: 1 << 20}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	if err := c.waitServing(ctx); err != nil {
		c.stop()
		return nil, fmt.Errorf("server did not start: %w\n%s", err, c.stderr.String())
	}
	return c, nil
}

func (c *child) waitServing(ctx context.Context) error {
	// Redial often: a server under callgrind takes a while to listen, and
	// gRPC's default backoff would keep the next attempt minutes away.
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second}}))
	if err != nil {
		return err
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	wait := 30 * time.Second
	if c.callgrind != "" {
		wait = 5 * time.Minute // valgrind translates the binary first
	}
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		select {
		case <-c.done:
			return fmt.Errorf("server exited: %v", c.err)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			if _, err := c.stats(); err == nil {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("timed out waiting for SERVING")
}

// stop ends the server with SIGTERM (SIGKILL after 10s) and removes its
// directory.
func (c *child) stop() {
	defer os.RemoveAll(c.dir)
	if c.cmd.Process == nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// countInstructions zeroes callgrind's counters and starts counting; it
// does nothing unless the server runs under callgrind.
func (c *child) countInstructions() error {
	if c.callgrind == "" {
		return nil
	}
	return c.callgrindControl("--zero", "--instr=on")
}

// instructions stops counting and returns the instructions the server
// executed since countInstructions; 0 unless it runs under callgrind.
// When keep is set, callgrind's profile of them is moved there.
func (c *child) instructions(keep string) (uint64, error) {
	if c.callgrind == "" {
		return 0, nil
	}
	before, _ := filepath.Glob(c.callgrind + ".*")
	if err := c.callgrindControl("--dump", "--instr=off"); err != nil {
		return 0, err
	}
	after, _ := filepath.Glob(c.callgrind + ".*")
	for _, f := range after {
		if slices.Contains(before, f) {
			continue
		}
		n, err := callgrindTotal(f)
		if err == nil && keep != "" {
			err = os.Rename(f, keep)
		}
		return n, err
	}
	return 0, errors.New("callgrind wrote no dump")
}

func (c *child) callgrindControl(args ...string) error {
	for _, a := range args {
		out, err := exec.Command("callgrind_control", a, strconv.Itoa(c.cmd.Process.Pid)).CombinedOutput()
		if err != nil {
			return fmt.Errorf("callgrind_control %s: %w\n%s", a, err, out)
		}
	}
	return nil
}

// callgrindTotal reads the instruction count of a callgrind dump: its
// "summary:" or "totals:" line, whose first figure counts instructions
// (callgrind's default event, Ir).
func callgrindTotal(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		for _, prefix := range []string{"summary:", "totals:"} {
			if rest, ok := strings.CutPrefix(line, prefix); ok {
				if f := strings.Fields(rest); len(f) > 0 {
					return strconv.ParseUint(f[0], 10, 64)
				}
			}
		}
	}
	return 0, fmt.Errorf("%s: no instruction total", path)
}

// procStats are the server process's counters at one moment.
type procStats struct {
	cpu     time.Duration // user + system CPU time
	rss     int64         // resident set, bytes
	peakRSS int64         // peak resident set, bytes
	// From the server's runtime (its ops listener's /debug/alloc).
	allocBytes   uint64
	allocObjects uint64
	gcCycles     uint64
}

// stats reads the process's CPU time and memory from /proc and its
// allocation counters from its ops listener.
func (c *child) stats() (procStats, error) {
	var s procStats
	pid := c.cmd.Process.Pid
	cpu, err := procCPU(pid)
	if err != nil {
		return s, err
	}
	s.cpu = cpu
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return s, err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			s.rss = kb << 10
		case "VmHWM":
			s.peakRSS = kb << 10
		}
	}
	resp, err := http.Get("http://" + c.ops + "/debug/alloc")
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	var a struct {
		AllocBytes   uint64 `json:"alloc_bytes"`
		AllocObjects uint64 `json:"alloc_objects"`
		GCCycles     uint64 `json:"gc_cycles"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		return s, fmt.Errorf("/debug/alloc: %w", err)
	}
	s.allocBytes, s.allocObjects, s.gcCycles = a.AllocBytes, a.AllocObjects, a.GCCycles
	return s, nil
}

// procCPU reads the user and system CPU time of process pid from /proc.
func procCPU(pid int) (time.Duration, error) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(fields) < 13 {
		return 0, errors.New("short /proc stat")
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	const userHZ = 100 // USER_HZ: fixed at 100 on Linux
	return time.Duration(utime+stime) * time.Second / userHZ, nil
}

// sub returns the counters' growth from before to s.
func (s procStats) sub(before procStats) procStats {
	return procStats{
		cpu:          s.cpu - before.cpu,
		rss:          s.rss,
		peakRSS:      s.peakRSS,
		allocBytes:   s.allocBytes - before.allocBytes,
		allocObjects: s.allocObjects - before.allocObjects,
		gcCycles:     s.gcCycles - before.gcCycles,
	}
}

func freePort() (string, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer lis.Close()
	return lis.Addr().String(), nil
}

// limitedWriter keeps the first n bytes written to it.
type limitedWriter struct {
	b *bytes.Buffer
	n int
}

func (w *limitedWriter) Write(p []byte) (int, error) {
	if room := w.n - w.b.Len(); room > 0 {
		w.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
