package telemetry

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
)

// OpsHandler returns the handler of the ops listener: metrics, when not
// nil, at /metrics, and with withPProf the Go runtime's debugging
// endpoints: profiles at /debug/pprof/, the allocation counters since the
// start at /debug/alloc (JSON: alloc_bytes, alloc_objects and gc_cycles,
// from runtime/metrics), and a collection that returns freed memory to the
// system on POST /debug/gc (turnstile bench reads both to measure a turn).
// Anything else is 404.
func OpsHandler(metrics http.Handler, withPProf bool) http.Handler {
	mux := http.NewServeMux()
	if metrics != nil {
		mux.Handle("GET /metrics", metrics)
	}
	if withPProf {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		mux.HandleFunc("GET /debug/alloc", serveAlloc)
		mux.HandleFunc("POST /debug/gc", func(http.ResponseWriter, *http.Request) {
			runtime.GC()
			debug.FreeOSMemory()
		})
	}
	return mux
}

// serveAlloc writes the runtime's allocation counters.
func serveAlloc(w http.ResponseWriter, _ *http.Request) {
	samples := []metrics.Sample{
		{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/heap/allocs:objects"}, {Name: "/gc/cycles/total:gc-cycles"},
	}
	metrics.Read(samples)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]uint64{
		"alloc_bytes": samples[0].Value.Uint64(), "alloc_objects": samples[1].Value.Uint64(), "gc_cycles": samples[2].Value.Uint64(),
	})
}
