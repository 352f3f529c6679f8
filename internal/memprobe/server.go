package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// server is a running turnstile serve process.
type server struct {
	cmd  *exec.Cmd
	addr string
	dir  string
	// lost counts the server's log lines that say a turn ended without
	// its terminal event.
	lost    atomic.Int64
	logDone chan struct{}
}

func (p probe) start(words int) *server {
	dir, err := os.MkdirTemp("", "memprobe-srv")
	check(err)
	reply := strings.TrimSpace(strings.Repeat("lorem ", words))
	store := "store: {mode: off}"
	if p.store {
		store = fmt.Sprintf("store: {dir: %q}", filepath.Join(dir, "jetstream"))
	}
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
providers:
  sim: {type: simulator, token_delay: 0, script: [%q]}
models:
  sim: {provider: sim, model: sim-1, context_window: 100000000}
log: {level: warn}
%s
%s
`, fmt.Sprintf("reply=%q", reply), store, p.extra)
	path := filepath.Join(dir, "turnstile.yaml")
	check(os.WriteFile(path, []byte(cfg), 0o600))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	addr := lis.Addr().String()
	lis.Close()
	args := append(append([]string(nil), p.wrap...), p.bin, "serve", "--config", path, "--listen", addr)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), p.env...)
	stderr, err := cmd.StderrPipe()
	check(err)
	check(cmd.Start())
	s := &server{cmd: cmd, addr: addr, dir: dir, logDone: make(chan struct{})}
	var copyTo io.Writer = io.Discard
	if p.log != "" {
		f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		check(err)
		copyTo = f
	}
	go s.scanLog(stderr, copyTo)
	s.awaitListening()
	return s
}

// awaitListening waits up to 30 s for the server to accept connections,
// and stops it and fails when it does not.
func (s *server) awaitListening() {
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			s.stop()
			fail("the server did not start: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *server) stop() {
	_ = s.cmd.Process.Kill()
	<-s.logDone
	_ = s.cmd.Wait()
	os.RemoveAll(s.dir)
}

// scanLog copies the server's log to this process's stderr, at most
// maxLogLines lines of it, and all of it to w, and counts the lines that
// say a turn ended without its terminal event.
func (s *server) scanLog(r io.Reader, w io.Writer) {
	defer close(s.logDone)
	const maxLogLines = 20
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	lines := 0
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(w, line)
		if strings.Contains(line, "without its last event") || strings.Contains(line, "without a terminal event") {
			s.lost.Add(1)
		}
		if lines++; lines <= maxLogLines {
			fmt.Fprintln(os.Stderr, "server:", line)
		} else if lines == maxLogLines+1 {
			fmt.Fprintln(os.Stderr, "server: (more log lines not shown)")
		}
	}
	_, _ = io.Copy(io.Discard, r)
}

// mem reads the process's VmRSS and VmHWM in MiB.
func (s *server) mem() (rss, hwm float64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		switch k {
		case "VmRSS":
			rss = kb / 1024
		case "VmHWM":
			hwm = kb / 1024
		}
	}
	return rss, hwm
}

func (s *server) fds() int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", s.cmd.Process.Pid))
	return len(ents)
}

// healthy reports whether the server answers a health check within 5s,
// and how long it took.
func (s *server) healthy() (bool, time.Duration) {
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false, 0
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err == nil, time.Since(start)
}
