// Package server serves turnstile.v1.AgentService over gRPC: it maps
// requests and events between the wire and the runtime, maps terminal
// errors to gRPC statuses with google.rpc error details, and owns the
// gRPC server's lifecycle (health, reflection, logging, panic recovery,
// keepalive, graceful drain). It never names a provider.
package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// Options tune a [Server]. Zero fields take the defaults given.
type Options struct {
	// Logger receives one line per RPC and lifecycle messages
	// (default: discard).
	Logger *slog.Logger
	// ShutdownGrace is how long running turns may finish once Shutdown is
	// called before they are cancelled with a retryable error (default 30s).
	ShutdownGrace time.Duration
	// DrainDelay is how long health reports NOT_SERVING before new turns
	// are refused, so load balancers move traffic away (default 0).
	DrainDelay time.Duration
	// KeepaliveTime is the ping interval on idle connections (default 30s).
	KeepaliveTime time.Duration
	// MaxConcurrentStreams bounds the streams of one connection (default 256).
	MaxConcurrentStreams uint32
	// Store keeps the log of every turn, which makes turns durable:
	// RunTurn becomes idempotent per (turn_id, attempt), and WatchTurn and
	// CancelTurn work from any replica sharing the store. Nil keeps no
	// log: a turn lives in the stream that runs it, and WatchTurn and
	// CancelTurn answer FAILED_PRECONDITION.
	Store TurnStore
	// DetachGrace is how long a turn with a store keeps running after its
	// last watcher left; then it is cancelled (default 30s).
	DetachGrace time.Duration
	// MaxRunningTurns bounds the turns a server with a store runs at once,
	// those whose clients left included; beyond it RunTurn answers a
	// retryable UNAVAILABLE (default 1024).
	MaxRunningTurns int
	// GRPCOptions are appended to the server's options (TLS credentials,
	// stats handlers, more interceptors).
	GRPCOptions []grpc.ServerOption
}

// Server is a gRPC server for AgentService with health and reflection.
type Server struct {
	grpc    *grpc.Server
	health  *health.Server
	service *service
	opts    Options
}

// New returns a Server that runs turns on runner.
func New(runner turnRunner, opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.ShutdownGrace == 0 {
		opts.ShutdownGrace = 30 * time.Second
	}
	if opts.KeepaliveTime == 0 {
		opts.KeepaliveTime = 30 * time.Second
	}
	if opts.MaxRunningTurns == 0 {
		opts.MaxRunningTurns = 1024
	}
	if opts.DetachGrace == 0 {
		opts.DetachGrace = 30 * time.Second
	}
	if opts.MaxConcurrentStreams == 0 {
		opts.MaxConcurrentStreams = 256
	}
	logger := opts.Logger
	logFn := logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		logger.Log(ctx, slog.Level(lvl), msg, fields...)
	})
	onPanic := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		logger.ErrorContext(ctx, "panic in RPC handler", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	})
	logOpts := []logging.Option{logging.WithLogOnEvents(logging.FinishCall)}
	sopts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(
			logging.UnaryServerInterceptor(logFn, logOpts...),
			recovery.UnaryServerInterceptor(onPanic),
		),
		grpc.ChainStreamInterceptor(
			logging.StreamServerInterceptor(logFn, logOpts...),
			recovery.StreamServerInterceptor(onPanic),
		),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			// Ping idle connections so long, quiet tool runs survive NATs
			// and load balancers.
			Time:    opts.KeepaliveTime,
			Timeout: 20 * time.Second,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			// Let clients ping as often as every 10s, even without streams.
			MinTime:             10 * time.Second,
			PermitWithoutStream: true,
		}),
		grpc.MaxConcurrentStreams(opts.MaxConcurrentStreams),
	}
	sopts = append(sopts, opts.GRPCOptions...)

	s := &Server{
		grpc:    grpc.NewServer(sopts...),
		health:  health.NewServer(),
		service: newService(runner, logger, opts.Store, opts.DetachGrace, opts.MaxRunningTurns),
		opts:    opts,
	}
	turnstilev1.RegisterAgentServiceServer(s.grpc, s.service)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(turnstilev1.AgentService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	return s
}

// Serve accepts connections on lis until Shutdown or Stop. It returns nil
// after a shutdown.
func (s *Server) Serve(lis net.Listener) error {
	if err := s.grpc.Serve(lis); err != nil && err != grpc.ErrServerStopped {
		return fmt.Errorf("server: %w", err)
	}
	return nil
}

// Shutdown drains the server: health turns NOT_SERVING, and after
// DrainDelay new turns are refused with UNAVAILABLE while running turns may
// finish for up to ShutdownGrace; then the turns still running end with a
// retryable UNAVAILABLE error. Shutdown returns when every RPC has ended or
// ctx is done, whichever is first; then the server is stopped hard.
func (s *Server) Shutdown(ctx context.Context) {
	log := s.opts.Logger
	s.health.Shutdown()
	log.Info("draining", "drain_delay", s.opts.DrainDelay, "grace", s.opts.ShutdownGrace)
	wait(ctx, s.opts.DrainDelay)
	s.service.drain()

	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		// Turns whose clients left run on: wait for them too.
		s.service.wait(context.Background())
		close(stopped)
	}()
	grace := time.NewTimer(s.opts.ShutdownGrace)
	defer grace.Stop()
	select {
	case <-stopped:
		log.Info("all turns finished")
		return
	case <-grace.C:
	case <-ctx.Done():
	}
	n := s.service.cancelAll()
	log.Warn("grace period over: cancelling running turns", "turns", n)
	// Cancelled turns send their terminal event and end at once.
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		s.grpc.Stop()
		<-stopped
	}
}

// Wait waits until every turn this server runs in the background (with a
// store, turns outlive their streams) has ended, or ctx is done. Call it
// after Stop and before closing the store.
func (s *Server) Wait(ctx context.Context) { s.service.wait(ctx) }

// Stop closes every connection at once, and cancels the turns still
// running in the background (with a store, turns outlive their streams)
// with a retryable UNAVAILABLE error, waiting for them to end.
func (s *Server) Stop() {
	s.service.drain()
	s.grpc.Stop()
	s.service.cancelAll()
	s.service.wait(context.Background())
}

func wait(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
