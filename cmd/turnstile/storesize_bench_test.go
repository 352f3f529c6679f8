package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/turnstile-dev/turnstile/config"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
)

// BenchmarkStoredBytesPerTurn measures what one turn costs the turn store,
// for the sizing guidance of docs/durable-turns.md: the log's bytes (what
// store.max_bytes counts, from turnstile_store_bytes) and the file store's
// bytes on disk per turn, for a simulator turn as `turnstile serve` runs it
// with no file (its default reply) and for long replies. Run it with a
// fixed count, as the figures are per turn:
//
//	go test -run '^$' -bench StoredBytesPerTurn -benchtime 50x ./cmd/turnstile
func BenchmarkStoredBytesPerTurn(b *testing.B) {
	for _, tt := range []struct {
		name  string
		words int // 0: the simulator's default reply
	}{
		{"default", 0},
		{"reply=2000words", 2000},
		{"reply=20000words", 20000},
	} {
		b.Run(tt.name, func(b *testing.B) {
			for _, v := range []string{"OTEL_SDK_DISABLED", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"} {
				b.Setenv(v, "")
			}
			dir := b.TempDir()
			script := ""
			if tt.words > 0 {
				script = fmt.Sprintf(", script: [%q]", fmt.Sprintf("reply=%q", strings.TrimSpace(strings.Repeat("lorem ", tt.words))))
			}
			cfg, err := config.Parse("config.yaml", []byte(fmt.Sprintf(`
providers: {sim: {type: simulator, token_delay: 0%s}}
models: {sim: {provider: sim, model: turnstile-sim-1, context_window: 100000000}}
ops: {listen: "127.0.0.1:0"}
log: {level: warn}
store: {dir: %q, max_bytes: -1}
`, script, dir)))
			if err != nil {
				b.Fatal(err)
			}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			ops, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			served := make(chan error, 1)
			go func() { served <- serveOn(ctx, cfg, slog.New(slog.DiscardHandler), lis, ops) }()
			defer func() { cancel(); <-served }()
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			client := turnstilev1.NewAgentServiceClient(conn)
			before := storeBytes(b, ops.Addr().String(), 0)
			diskBefore := du(dir)
			b.ResetTimer()
			for i := range b.N {
				_, st := wiretest.Collect(b, context.Background(), client, &turnstilev1.RunTurnRequest{TurnId: fmt.Sprintf("t-%d", i), Messages: wiretest.UserText("tell me about the weather")}, nil)
				if st.Code() != codes.OK {
					b.Fatal(st)
				}
			}
			b.StopTimer()
			after := storeBytes(b, ops.Addr().String(), before)
			b.ReportMetric(float64(after-before)/float64(b.N), "log-B/turn")
			b.ReportMetric(float64(du(dir)-diskBefore)/float64(b.N), "disk-B/turn")
		})
	}
}

// storeBytes reads turnstile_store_bytes from the ops listener at addr,
// once it differs from not (the keeper reads the size every second).
func storeBytes(b *testing.B, addr string, not int64) int64 {
	b.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, l := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(l, "turnstile_store_bytes{") {
				v, err := strconv.ParseFloat(l[strings.LastIndex(l, " ")+1:], 64)
				if err == nil && (int64(v) != not || time.Now().After(deadline)) {
					return int64(v)
				}
			}
		}
		if time.Now().After(deadline) {
			b.Fatal("no turnstile_store_bytes on /metrics")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// du returns the bytes of the files under dir.
func du(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
