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
	"strings"
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
	// (default: discard). Health checks and reflection are logged at
	// DEBUG, and so is a RunTurn call that ran a turn: the turn's own line,
	// written by the runner's observer when it ends, is the one to read
	// (cmd/turnstile installs telemetry.TurnLog). A RunTurn refused
	// before its turn started (invalid, or the server draining) keeps its
	// INFO or WARN line.
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
	if opts.MaxConcurrentStreams == 0 {
		opts.MaxConcurrentStreams = 256
	}
	logger := opts.Logger
	logFn := logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		logger.Log(ctx, rpcLevel(slog.Level(lvl), fields), msg, fields...)
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
		service: newService(runner, logger),
		opts:    opts,
	}
	turnstilev1.RegisterAgentServiceServer(s.grpc, s.service)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	if err := registerReflection(s.grpc); err != nil {
		// Only a broken build gets here (the contract is embedded); serve
		// the generated descriptors, without their documentation.
		logger.Error("reflection without documentation", "error", err)
		reflection.Register(s.grpc)
	}
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(turnstilev1.AgentService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	return s
}

// rpcLevel is the level of an RPC's log line, lvl by its status code but
// for DEBUG for health checks and reflection, which load balancers and
// tools call all the time, and for a RunTurn that ran a turn, whose end
// has a line of its own.
func rpcLevel(lvl slog.Level, fields []any) slog.Level {
	for i := 0; i+1 < len(fields); i += 2 {
		switch fields[i] {
		case logging.ServiceFieldKey:
			if s, _ := fields[i+1].(string); s == healthpb.Health_ServiceDesc.ServiceName || strings.HasPrefix(s, "grpc.reflection.") {
				return slog.LevelDebug
			}
		case turnRanField:
			return slog.LevelDebug
		}
	}
	return lvl
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

// Stop closes every connection at once.
func (s *Server) Stop() { s.grpc.Stop() }

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
