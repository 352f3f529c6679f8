package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/turnstile-dev/turnstile/config"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/store"
	"github.com/turnstile-dev/turnstile/telemetry"
)

// observers returns what watches every turn: the turn's log line always,
// and its spans and metrics when tel records anything. health reads the
// models' shared state for the gauges.
func observers(cfg *config.Config, logger *slog.Logger, tel *telemetry.Providers, health func() []policy.ModelHealth) (runtime.Observer, error) {
	log := telemetry.NewTurnLog(logger)
	if !tel.Enabled() {
		return log, nil
	}
	types := make(map[string]string, len(cfg.Providers))
	endpoints := make(map[string]string, len(cfg.Providers))
	for name, p := range cfg.Providers {
		types[name] = p.Type
		if e, ok := p.Settings.(interface{ Endpoint() string }); ok {
			endpoints[name] = e.Endpoint()
		}
	}
	models := make(map[string]string, len(cfg.Models))
	for alias, m := range cfg.Models {
		models[alias] = m.Routes()[0].Provider
	}
	obs, err := telemetry.NewObserver(tel.TracerProvider, tel.MeterProvider, telemetry.ObserverOptions{
		CaptureContent:     cfg.Telemetry.CaptureContent,
		MetadataAttributes: cfg.Telemetry.MetadataAttributes,
		ProviderTypes:      types,
		ModelProviders:     models,
		Endpoints:          endpoints,
		Health:             health,
		Version:            releaseVersion(),
	})
	if err != nil {
		return nil, err
	}
	// The log line comes last, so it sees the turn's span.
	return runtime.Observers(obs, log), nil
}

// serveOps serves the ops listener on lis: the probes' /healthz and
// /readyz (see [withHealth]; ready is the gRPC health's state), /metrics
// when tel serves them, and the Go runtime's debugging endpoints
// (/debug/pprof/, /debug/alloc, /debug/gc) with withPProf, and then, with
// a turn store (st, nil without), /debug/store (see [withStoreDebug]). The
// returned function stops it.
func serveOps(lis net.Listener, tel *telemetry.Providers, withPProf bool, ready func(context.Context) bool, st *store.Store, logger *slog.Logger) (stop func()) {
	handler := telemetry.OpsHandler(tel.MetricsHandler(), withPProf)
	if withPProf && st != nil {
		handler = withStoreDebug(handler, st)
	}
	srv := &http.Server{
		Handler:           withHealth(handler, ready),
		ReadHeaderTimeout: 10 * time.Second,
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("ops listener failed", "error", err)
		}
	}()
	logger.Info("ops listener", "address", lis.Addr().String(), "metrics", tel.MetricsHandler() != nil, "pprof", withPProf)
	if ta, ok := lis.Addr().(*net.TCPAddr); ok && !ta.IP.IsLoopback() {
		// The ops listener has no TLS and no client keys.
		logger.Warn("the ops listener answers anyone who reaches it: keep ops.listen on loopback or a private network",
			"address", lis.Addr().String())
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}
}

// storeDebugTimeout bounds the read of /debug/store.
const storeDebugTimeout = 5 * time.Second

// withStoreDebug serves GET /debug/store in front of next: what the turn
// log holds now, every run's (its messages and bytes, as JetStream
// reports them), as JSON. turnstile bench reads it before and after a
// phase to count the messages a turn stores.
func withStoreDebug(next http.Handler, st *store.Store) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", next)
	mux.HandleFunc("GET /debug/store", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), storeDebugTimeout)
		defer cancel()
		bytes, msgs, err := st.Size(ctx)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]uint64{"messages": msgs, "bytes": bytes})
	})
	return mux
}
