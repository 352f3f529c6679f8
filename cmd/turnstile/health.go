package main

import (
	"context"
	"net/http"
	"time"
)

// Paths of the probes on the ops listener: plaintext HTTP, so kubelet's
// httpGet probes work whatever TLS and client keys the gRPC port asks for.
const (
	livePath  = "/healthz"
	readyPath = "/readyz"
)

// readyTimeout bounds one readiness check.
const readyTimeout = time.Second

// withHealth serves /healthz and /readyz in front of next. /healthz
// answers 200 while the process serves HTTP at all (liveness). /readyz
// answers 200 while ready reports true, 503 otherwise: ready is the gRPC
// health service's state (server.Server.Ready), so a probe and a load
// balancer asking over gRPC are told the same (NOT_SERVING while the
// server drains, and whenever else the health service says so).
func withHealth(next http.Handler, ready func(context.Context) bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", next)
	mux.HandleFunc("GET "+livePath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET "+readyPath, func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !ready(ctx) {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	return mux
}
