package main

import (
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	goruntime "runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/turnstile-dev/turnstile/internal/bench"
)

// startDebug serves, when the environment variable bench.DebugAddrEnv
// names a loopback address, the server's allocation counters
// (/debug/alloc), a forced collection (/debug/gc) and pprof
// (/debug/pprof/), for turnstile bench and for profiling. It serves
// nothing otherwise.
func startDebug(logger *slog.Logger) {
	addr := os.Getenv(bench.DebugAddrEnv)
	if addr == "" {
		return
	}
	host, _, err := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		logger.Error("debug endpoint: not a loopback address; not serving it", "address", addr)
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/alloc", func(w http.ResponseWriter, r *http.Request) {
		samples := []metrics.Sample{
			{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/heap/allocs:objects"}, {Name: "/gc/cycles/total:gc-cycles"},
		}
		metrics.Read(samples)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]uint64{
			"alloc_bytes": samples[0].Value.Uint64(), "alloc_objects": samples[1].Value.Uint64(), "gc_cycles": samples[2].Value.Uint64(),
		})
	})
	mux.HandleFunc("POST /debug/gc", func(w http.ResponseWriter, r *http.Request) {
		goruntime.GC()
		debug.FreeOSMemory()
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil {
			logger.Error("debug endpoint", "error", err)
		}
	}()
}
