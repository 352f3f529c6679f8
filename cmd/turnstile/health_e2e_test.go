package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/turnstile-dev/turnstile/internal/livetest"
)

// TestWithHealth: /healthz answers 200 whatever readiness says, /readyz
// 200 or 503 as ready says, and every other path goes to the ops
// handler behind.
func TestWithHealth(t *testing.T) {
	behind := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	for _, tc := range []struct {
		ready      bool
		path       string
		wantStatus int
	}{
		{true, livePath, http.StatusOK},
		{false, livePath, http.StatusOK},
		{true, readyPath, http.StatusOK},
		{false, readyPath, http.StatusServiceUnavailable},
		{false, "/metrics", http.StatusTeapot},
	} {
		h := withHealth(behind, func(context.Context) bool { return tc.ready })
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
		if rec.Code != tc.wantStatus {
			t.Errorf("ready %v, GET %s: %d, want %d", tc.ready, tc.path, rec.Code, tc.wantStatus)
		}
	}
}

// TestReadinessFlipsBeforeListenerCloses SIGTERMs a real `turnstile
// serve` and checks what a kubelet and a load balancer see: /readyz turns
// 503 and gRPC health NOT_SERVING while the gRPC port still accepts
// connections (server.drain_delay), and only then does the port close.
func TestReadinessFlipsBeforeListenerCloses(t *testing.T) {
	bin := livetest.Binary(t, "../..")
	cfgFile := filepath.Join(t.TempDir(), "turnstile.yaml")
	if err := os.WriteFile(cfgFile, []byte(`
listen: 127.0.0.1:0
providers: {sim: {type: simulator}}
models: {sim: {provider: sim, model: turnstile-sim-1}}
store: {mode: off}
ops: {listen: "127.0.0.1:0", metrics: false}
server: {drain_delay: 5s}
log: {format: json}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--config", cfgFile)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrs := make(chan [2]string, 1)
	exited := make(chan error, 1)
	go func() {
		var grpcAddr, opsAddr string
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line struct{ Msg, Address string }
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				continue
			}
			switch line.Msg {
			case "serving":
				grpcAddr = line.Address
			case "ops listener":
				opsAddr = line.Address
			}
			if grpcAddr != "" && opsAddr != "" {
				addrs <- [2]string{grpcAddr, opsAddr}
				grpcAddr = ""
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	var grpcAddr, opsAddr string
	select {
	case a := <-addrs:
		grpcAddr, opsAddr = a[0], a[1]
	case err := <-exited:
		t.Fatalf("serve exited: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no serving and ops listener lines")
	}

	status := func(path string) int {
		t.Helper()
		resp, err := http.Get("http://" + opsAddr + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	grpcHealth := func(c *grpc.ClientConn) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("gRPC health: %v", err)
		}
		return r.GetStatus()
	}
	if got := status(livePath); got != http.StatusOK {
		t.Fatalf("before SIGTERM: %s %d", livePath, got)
	}
	if got := status(readyPath); got != http.StatusOK {
		t.Fatalf("before SIGTERM: %s %d", readyPath, got)
	}
	if got := grpcHealth(conn); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("before SIGTERM: gRPC health %v", got)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for status(readyPath) != http.StatusServiceUnavailable {
		if time.Now().After(deadline) {
			t.Fatalf("%s never turned 503 after SIGTERM", readyPath)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Not ready, and the gRPC port still takes new connections, which
	// are told the same.
	fresh, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if got := grpcHealth(fresh); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("draining, a new connection's gRPC health: %v, want NOT_SERVING", got)
	}
	if got := status(livePath); got != http.StatusOK {
		t.Errorf("draining: %s %d, want 200 (alive)", livePath, got)
	}
	// Then the port closes, and the process exits 0.
	for {
		c, err := net.DialTimeout("tcp", grpcAddr, time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the gRPC port never closed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("serve exited: %v, want 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not exit")
	}
}
