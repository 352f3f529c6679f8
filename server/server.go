// Package server serves turnstile.v1.AgentService over gRPC: it maps
// requests and events between the wire and the runtime, maps terminal
// errors to gRPC statuses with google.rpc error details, and owns the
// gRPC server's lifecycle (health, reflection, logging, panic recovery,
// keepalive, graceful drain). It never names a provider.
package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/server/admission"
	"github.com/turnstile-dev/turnstile/server/durable"
	"github.com/turnstile-dev/turnstile/server/guard"
	"github.com/turnstile-dev/turnstile/server/wire"
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
	// called before they are cancelled with a retryable error, or, with a
	// Store, handed to other replicas (default 30s).
	ShutdownGrace time.Duration
	// DrainDelay is how long health reports NOT_SERVING before new turns
	// are refused, so load balancers move traffic away (default 0).
	DrainDelay time.Duration
	// KeepaliveTime is the ping interval on idle connections (default 30s).
	KeepaliveTime time.Duration
	// MaxConcurrentStreams bounds the streams of one connection (default 256).
	MaxConcurrentStreams uint32

	// TLS, when not nil, serves over TLS with this configuration (see
	// [LoadTLS]); nil serves plaintext.
	TLS *tls.Config
	// Keys, when not empty, are the client keys: every RPC but the health
	// service's must carry one as "authorization: Bearer <token>", or it
	// fails with UNAUTHENTICATED. Reflection needs a key too. Default:
	// none, every caller is served.
	Keys []Key
	// NoReflection turns the server reflection service off (default on).
	NoReflection bool

	// MaxConcurrentTurns bounds the turns running at once; a turn beyond it
	// fails at once with RESOURCE_EXHAUSTED and RetryInfo (default 512).
	MaxConcurrentTurns int
	// MemoryLimit, when positive, bounds the turns the server starts by
	// its memory, in bytes (see [admission.Memory]): past 60% of it, a
	// new turn of a client key that runs at least its share of the
	// running turns fails at once with RESOURCE_EXHAUSTED, ErrorInfo
	// LIMIT_EXCEEDED (limit memory_limit) and RetryInfo; past 85%, every
	// new turn does, and when the memory the process holds (the floor of
	// TurnMemory a turn not counted) is past 85%, the durable turns
	// nobody reads of the key that runs the most are ended first, each
	// with a stored retryable UNAVAILABLE. 0: no bound (serve sets it
	// from GOMEMLIMIT, which it sets from a container's limit).
	MemoryLimit int64
	// TurnMemory is what a running turn is counted to hold at least when
	// the server projects its memory against MemoryLimit (default
	// [admission.DefaultTurnMemory], with a Store or without).
	TurnMemory int64
	// MemoryInUse reads what the process holds, for MemoryLimit (default
	// [admission.RuntimeMemory]: the live heap as of the last collection
	// and what the Go runtime holds beside its heap).
	MemoryInUse func() uint64
	// MaxConnections bounds the connections open at once; more wait in the
	// listen backlog until one closes (default 1024).
	MaxConnections int
	// MaxConnectionIdle closes a connection that had no RPC for this long
	// (default 5m).
	MaxConnectionIdle time.Duration
	// MaxConnectionAge, when positive, closes a connection this old
	// gracefully: its clients open a new one, and its RPCs may run for
	// MaxConnectionAgeGrace more (default 0: connections are not aged).
	MaxConnectionAge time.Duration
	// MaxConnectionAgeGrace is how long RPCs may run on a connection
	// closed for its age before it is closed hard (default 0: until
	// they end).
	MaxConnectionAgeGrace time.Duration
	// MaxConnectionsPerPeer bounds the connections open at once from one
	// IP address; a connection beyond it is closed at once, so one
	// address cannot hold every slot of MaxConnections (default 64;
	// behind a proxy or load balancer that does not keep client
	// addresses, raise it to MaxConnections).
	MaxConnectionsPerPeer int
	// MaxHandshakes bounds the connections whose TLS and HTTP/2 handshakes
	// are under way at once, from every address together: one beyond it
	// closes the oldest handshake of the address with the most under way
	// (counted: metric turnstile.server.refusals, reason
	// handshake_limit), so silent connections from many addresses hold at
	// most this many of the MaxConnections slots, and a client that
	// completes its handshake in milliseconds gets through (default 256,
	// or a quarter of MaxConnections when that is smaller).
	MaxHandshakes int
	// HandshakeTimeout closes a connection that has not completed its TLS
	// and HTTP/2 handshake in this time (default 10s). Each one closed is
	// counted (metric turnstile.server.refusals, reason
	// handshake_timeout) and logged at DEBUG.
	HandshakeTimeout time.Duration
	// MaxHeaderBytes bounds the header list of a request, as HTTP/2
	// counts it (each field's name and value plus 32 bytes): a stream
	// over it is refused at once (RST_STREAM), or its connection closed
	// when one field alone is over it; counted, and logged once per
	// connection (default 32 KiB).
	MaxHeaderBytes int
	// MaxRequestBytes bounds a request; a larger one fails with
	// RESOURCE_EXHAUSTED and ErrorInfo REQUEST_TOO_LARGE. One up to twice
	// as large (at most 1 MiB more) is read first; a larger one is refused
	// by gRPC as soon as its length is read, without ErrorInfo (default
	// 4 MiB).
	MaxRequestBytes int
	// MaxMediaBytes bounds one media part of a request, its data or URI
	// (default [DefaultMaxMediaBytes]); one over it is INVALID_ARGUMENT.
	MaxMediaBytes int
	// MaxRequestMediaBytes bounds the media of one request, all parts
	// together (default [DefaultMaxRequestMediaBytes]).
	MaxRequestMediaBytes int
	// MaxEventBytes bounds every event the server sends (default 2 MiB;
	// clients must accept messages this large: gRPC's default is 4 MiB).
	MaxEventBytes int
	// SendTimeout cancels a turn whose client accepted no event for this
	// long (default 30s).
	SendTimeout time.Duration
	// CheckToolSchemas, when not nil, checks the JSON Schemas of the tools
	// a request declares, all at once, and returns one error per schema,
	// nil for each that passes; an error rejects the request with
	// INVALID_ARGUMENT naming the tool's input_schema (default: schemas
	// are not compiled). ctx is the request's: the check stops once the
	// client has left.
	CheckToolSchemas func(ctx context.Context, schemas [][]byte) []error

	// Store keeps the log of every turn, which makes turns durable:
	// RunTurn becomes idempotent per (turn_id, attempt), and WatchTurn,
	// CancelTurn, ApproveToolCall and SteerTurn work from any replica
	// sharing the store. Nil keeps no log: a turn lives in the stream that
	// runs it, WatchTurn and CancelTurn answer FAILED_PRECONDITION, and
	// ApproveToolCall and SteerTurn work only on the server running the
	// turn.
	Store TurnStore
	// StorePace is, with a Store, the least time between two deltas of
	// one text, reasoning block or tool call's arguments that a turn
	// stores: what the model streams meanwhile is stored, and sent, as one
	// event (runtime.PacedSink). The first delta of each, and every other
	// event, is stored at once (default 0: each delta as soon as the
	// previous write is acknowledged).
	StorePace time.Duration
	// DetachGrace is how long a turn with a store keeps running after its
	// last watcher left; then it is cancelled (default 30s).
	DetachGrace time.Duration
	// MaxRunningTurns bounds the turns a server with a store runs at once,
	// those whose clients left included; beyond it RunTurn answers a
	// retryable UNAVAILABLE (default 1024).
	MaxRunningTurns int

	// MeterProvider records the server's own metrics: refusals below the
	// RPC layer and RPCs that ended before any work (default: none).
	MeterProvider metric.MeterProvider

	// Clock is the clock of the client keys' limits and budgets (their
	// buckets, UTC days and months), of the sampling of the log lines of
	// refused connections and RPCs, and of the deadlines of the orphaned
	// turns the server adopts (default time.Now). Tests set it to hold
	// time still or to move past a deadline.
	Clock func() time.Time

	// GRPCOptions are appended to the server's options (stats handlers,
	// more interceptors).
	GRPCOptions []grpc.ServerOption
}

// Defaults of [Options].
const (
	DefaultMaxConcurrentTurns = 512
	DefaultMaxConnections     = 1024
	DefaultMaxConnectionIdle  = 5 * time.Minute
	DefaultHandshakeTimeout   = 10 * time.Second
	DefaultMaxConnsPerPeer    = 64
	DefaultMaxHandshakes      = 256
	DefaultMaxHeaderBytes     = 32 << 10
	DefaultMaxRequestBytes    = 4 << 20
	DefaultMaxEventBytes      = 2 << 20
	DefaultSendTimeout        = 30 * time.Second
	// DefaultMaxMediaBytes bounds one media part: Anthropic's limit for
	// an image (5 MB), below OpenAI's and Gemini's.
	DefaultMaxMediaBytes = wire.DefaultMaxMediaBytes
	// DefaultMaxRequestMediaBytes bounds the media of one request, all
	// parts together.
	DefaultMaxRequestMediaBytes = wire.DefaultMaxRequestMediaBytes
)

// flowWindow is the HTTP/2 flow-control window the server grants each
// stream and each connection for what clients send: fixed, so it does not
// grow with the bandwidth-delay estimate, since requests are read at once.
const flowWindow = 1 << 20

// bufferPool holds the buffers of messages on their way, in tiers at every
// power of two from 256 B to 4 MiB. gRPC's default pool jumps from 32 KiB
// to 1 MiB: an event of 40 KiB (a long reply's message_completed) would
// hold 1 MiB for as long as a slow client leaves it queued.
var bufferPool = func() mem.BufferPool {
	p, err := mem.NewBinaryTieredBufferPool(8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22)
	if err != nil {
		panic(err)
	}
	return p
}()

// Server is a gRPC server for AgentService with health and reflection.
type Server struct {
	grpc    *grpc.Server
	guard   *guard.Guard
	health  *health.Server
	service *service
	opts    Options
}

func (o *Options) setDefaults() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	defInt := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.ShutdownGrace, 30*time.Second)
	def(&o.KeepaliveTime, 30*time.Second)
	def(&o.MaxConnectionIdle, DefaultMaxConnectionIdle)
	def(&o.HandshakeTimeout, DefaultHandshakeTimeout)
	def(&o.SendTimeout, DefaultSendTimeout)
	defInt(&o.MaxConcurrentTurns, DefaultMaxConcurrentTurns)
	defInt(&o.MaxConnections, DefaultMaxConnections)
	defInt(&o.MaxConnectionsPerPeer, min(DefaultMaxConnsPerPeer, o.MaxConnections))
	defInt(&o.MaxHandshakes, min(DefaultMaxHandshakes, max(1, o.MaxConnections/4)))
	defInt(&o.MaxHeaderBytes, DefaultMaxHeaderBytes)
	if o.MeterProvider == nil {
		o.MeterProvider = metricnoop.NewMeterProvider()
	}
	defInt(&o.MaxRequestBytes, DefaultMaxRequestBytes)
	defInt(&o.MaxEventBytes, DefaultMaxEventBytes)
	defInt(&o.MaxMediaBytes, DefaultMaxMediaBytes)
	defInt(&o.MaxRequestMediaBytes, DefaultMaxRequestMediaBytes)
	defInt(&o.MaxRunningTurns, 1024)
	if o.TurnMemory == 0 {
		o.TurnMemory = admission.DefaultTurnMemory
	}
	if o.MemoryInUse == nil {
		o.MemoryInUse = admission.RuntimeMemory()
	}
	def(&o.DetachGrace, 30*time.Second)
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.MaxConcurrentStreams == 0 {
		o.MaxConcurrentStreams = 256
	}
}

// New returns a Server that runs turns on runner.
func New(runner turnRunner, opts Options) *Server {
	opts.setDefaults()
	logger := opts.Logger
	g := guard.New(guard.Options{Logger: opts.Logger, MaxConnectionsPerPeer: opts.MaxConnectionsPerPeer,
		MaxHandshakes: opts.MaxHandshakes, MaxHeaderBytes: opts.MaxHeaderBytes, MeterProvider: opts.MeterProvider,
		Now: opts.Clock})
	logFn := logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		g.LogRPC(ctx, rpcLevel(slog.Level(lvl), fields), msg, fields)
	})
	onPanic := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		logger.ErrorContext(ctx, "panic in RPC handler", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	})
	s := &Server{opts: opts}
	s.service = newService(runner, &s.opts)
	logOpts := []logging.Option{logging.WithLogOnEvents(logging.FinishCall)}
	// Outermost first: the log line sees the final status and the client
	// key's name; keys are checked before a request is read; the turn
	// limits apply to the key found; recovery is innermost.
	unary := []grpc.UnaryServerInterceptor{logging.UnaryServerInterceptor(logFn, logOpts...)}
	stream := []grpc.StreamServerInterceptor{logging.StreamServerInterceptor(logFn, logOpts...), decodeErrors(opts.MaxRequestBytes)}
	if keys := s.service.keys; keys != nil {
		u, s := requireKey(keys)
		unary, stream = append(unary, u), append(stream, s)
	}
	stream = append(stream, admit(s.service.gate, s.service.memory, s.service.shedUnread, s.service.refuse), recovery.StreamServerInterceptor(onPanic))
	unary = append(unary, recovery.UnaryServerInterceptor(onPanic))
	sopts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(stream...),
		grpc.ForceServerCodecV2(newCodec(opts.MaxRequestBytes)),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			// Ping idle connections so long, quiet tool runs survive NATs
			// and load balancers.
			Time:                  opts.KeepaliveTime,
			Timeout:               20 * time.Second,
			MaxConnectionIdle:     opts.MaxConnectionIdle,
			MaxConnectionAge:      opts.MaxConnectionAge,
			MaxConnectionAgeGrace: opts.MaxConnectionAgeGrace,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			// Let clients ping as often as every 10s, even without streams.
			MinTime:             10 * time.Second,
			PermitWithoutStream: true,
		}),
		grpc.MaxConcurrentStreams(opts.MaxConcurrentStreams),
		grpc.MaxRecvMsgSize(hardRequestLimit(opts.MaxRequestBytes)),
		grpc.ConnectionTimeout(opts.HandshakeTimeout),
		grpc.MaxHeaderListSize(uint32(opts.MaxHeaderBytes)),
		grpc.StaticStreamWindowSize(flowWindow),
		grpc.StaticConnWindowSize(flowWindow),
		experimental.BufferPool(bufferPool),
		// Handlers run on goroutines that outlive an RPC, so the stack a
		// turn grows (the SDK's request encoding is deep) is grown once,
		// not copied again at every doubling by every turn: 14% of the
		// server's instructions per turn under callgrind.
		grpc.NumStreamWorkers(streamWorkers),
	}
	// Every connection, TLS or not, through the guard (package guard).
	creds := insecure.NewCredentials()
	if opts.TLS != nil {
		creds = credentials.NewTLS(opts.TLS)
	}
	sopts = append(sopts, grpc.Creds(g.Credentials(creds)))
	sopts = append(sopts, opts.GRPCOptions...)

	s.grpc, s.health, s.guard = grpc.NewServer(sopts...), health.NewServer(), g
	s.service.senders.Start(streamWorkers)
	// Every service through reg: a unary method's malformed request
	// reaches the interceptors (codec.go).
	reg := registrar{Server: s.grpc, maxRequestBytes: opts.MaxRequestBytes}
	turnstilev1.RegisterAgentServiceServer(reg, s.service)
	healthpb.RegisterHealthServer(reg, s.health)
	if !opts.NoReflection {
		registerReflection(reg, func(err error) {
			// Only a broken build gets here (the contract is embedded).
			logger.Error("reflection without documentation", "error", err)
		})
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
		case guard.RanField:
			return slog.LevelDebug
		}
	}
	return lvl
}

// Ready reports whether the health service answers SERVING, for the
// server as a whole ("") and for AgentService: what a load balancer asking
// over gRPC is told, for probes that cannot speak gRPC (the ops
// listener's /readyz).
func (s *Server) Ready(ctx context.Context) bool {
	for _, name := range []string{"", turnstilev1.AgentService_ServiceDesc.ServiceName} {
		r, err := s.health.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return false
		}
	}
	return true
}

// Serve accepts connections on lis until Shutdown or Stop, at most
// MaxConnections at once and MaxConnectionsPerPeer from one address. It
// returns nil after a shutdown.
func (s *Server) Serve(lis net.Listener) error {
	lis = s.guard.Listener(netutil.LimitListener(lis, s.opts.MaxConnections))
	if err := s.grpc.Serve(lis); err != nil && err != grpc.ErrServerStopped {
		return fmt.Errorf("server: %w", err)
	}
	return nil
}

// Shutdown drains the server: health turns NOT_SERVING, and after
// DrainDelay new turns are refused with UNAVAILABLE while running turns may
// finish for up to ShutdownGrace; then the turns still running end with a
// retryable UNAVAILABLE error, or, with a Store, stop here without ending:
// their leases are released once their log is acknowledged, so another
// replica takes each over at once, and their streams here end with a
// retryable UNAVAILABLE that says to watch the turn again. ctx done ends
// the grace early. Shutdown returns when every RPC and owned turn has
// ended (after at most five more seconds, the server is stopped hard).
func (s *Server) Shutdown(ctx context.Context) {
	defer s.service.close()
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
	// With a store, the turns still running go to other replicas, which
	// take them over at once from their log; without one, they end.
	h := s.service.handOff()
	if h > 0 {
		log.Info("grace period over: handing running turns to other servers", "turns", h)
	}
	if n := s.service.cancelAll() - h; n > 0 {
		log.Warn("grace period over: cancelling running turns", "turns", n)
	}
	// Cancelled turns send their terminal event and end at once; handed
	// off ones once their log is acknowledged.
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
	s.service.close()
}

// streamWorkers is how many goroutines run RPC handlers and how many
// goroutines wait to run the streams' Sends (see [delivery.Workers]): when more run at
// once, the others get goroutines of their own.
const streamWorkers = 64

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

// StoreRoom tells the server whether its turn store can take new turns:
// full is nil when it can, else why not. While it cannot, the health of
// the AgentService is NOT_SERVING (the server's own, "", stays SERVING:
// watches and cancels work); a draining server ignores it. When full says
// the turns running must end too (the disk under the embedded store filled
// past its reserve), the durable turns running here end with a stored
// STORE_FULL error; when room returns, the turns whose last event did not
// fit get it stored (see [durable.Runs.StoreRoom]). Package store's
// Store.OnRoom calls it.
func (s *Server) StoreRoom(full error) {
	st := healthpb.HealthCheckResponse_SERVING
	if full != nil {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	s.health.SetServingStatus(turnstilev1.AgentService_ServiceDesc.ServiceName, st)
	if s.service.runs != nil {
		s.service.runs.StoreRoom(full)
	}
}

// Key is a client key (see [Options].Keys).
type Key = admission.Key

// KeyLimits bound what one client key may use (see [admission.KeyLimits]).
type KeyLimits = admission.KeyLimits

// LimitSharer keeps the counters the replicas of a deployment share (see
// [admission.LimitSharer]); package store's Shared implements it.
type LimitSharer = admission.LimitSharer

// ShareLimits shares the client keys' limits with the other replicas
// through sh until ctx is done (see [admission.Keys.Share]); replica names
// this replica among them. Without keys it returns at once.
func (s *Server) ShareLimits(ctx context.Context, sh LimitSharer, replica string, interval time.Duration) error {
	return s.service.keys.Share(ctx, sh, replica, interval)
}

// TurnStore is the durable log of runs the server needs (see
// [durable.TurnStore]); package store implements it.
type TurnStore = durable.TurnStore
