package telemetry

import (
	"net/http"
	"net/http/pprof"
)

// OpsHandler returns the handler of the ops listener: metrics, when not
// nil, at /metrics, and with withPProf Go's profiles at /debug/pprof/.
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
	}
	return mux
}
