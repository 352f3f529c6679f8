package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/signal"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/turnstile-dev/turnstile/config"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/store"
	"github.com/turnstile-dev/turnstile/telemetry"
	"github.com/turnstile-dev/turnstile/tools/argcheck"
	"github.com/turnstile-dev/turnstile/tools/clock"
	"github.com/turnstile-dev/turnstile/tools/mcp"
)

var (
	_ server.TurnStore       = (*store.Store)(nil)
	_ runtime.CooldownSharer = (*store.Shared)(nil)
	_ runtime.BudgetSharer   = (*store.Shared)(nil)
	_ server.LimitSharer     = (*store.Shared)(nil)
)

// limitShareInterval is how often a replica adds what its client keys
// used to the limits the replicas share: with the store's latency, how
// far behind another replica's view of a key's use may be.
const limitShareInterval = 100 * time.Millisecond

// budgetShareInterval is how often a replica merges what its retries did
// to the models' retry budgets into the shared ones: how stale another
// replica's view may be, at most, besides the store's latency.
const budgetShareInterval = 100 * time.Millisecond

func serve(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", os.Getenv("TURNSTILE_CONFIG"), "YAML configuration `file` (env TURNSTILE_CONFIG); none serves the embedded simulator")
	listen := fs.String("listen", "", "listen `address`, overriding the file's listen (default 127.0.0.1:7700)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "turnstile serve: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}

	cfg := config.Default()
	if *configPath != "" {
		c, err := config.Load(*configPath)
		if err != nil {
			printError(stderr, err)
			return exitPermanent
		}
		cfg = c
	}
	if *listen != "" {
		cfg.Listen = *listen
	}
	logger, err := newLogger(stderr, cfg.Log, cfg.Secrets(os.Getenv))
	if err != nil {
		fmt.Fprintf(stderr, "turnstile serve: %v\n", err)
		return exitPermanent
	}
	defer routeStdLog(logger)()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go returnMemory(ctx, memoryCheckInterval, func(held, live uint64) {
		logger.Info("heap returned to the OS after a burst", "held_mib", held>>20, "live_mib", live>>20)
	})
	if err := serveConfig(ctx, cfg, logger); err != nil {
		var cerr *config.Errors
		if errors.As(err, &cerr) {
			printError(stderr, err)
		} else {
			logger.Error("serve failed", "error", err)
		}
		return exitPermanent
	}
	return exitOK
}

// printError prints a configuration error: an [*config.Errors] as its
// list, one problem per line, anything else after the command's name.
func printError(w io.Writer, err error) {
	var cerr *config.Errors
	if errors.As(err, &cerr) {
		fmt.Fprintln(w, cerr)
		return
	}
	fmt.Fprintf(w, "turnstile serve: %v\n", err)
}

// serveConfig builds everything cfg describes and serves until ctx is done,
// then drains.
func serveConfig(ctx context.Context, cfg *config.Config, logger *slog.Logger) error {
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	var ops net.Listener
	if cfg.Ops.Listen != "" {
		if ops, err = net.Listen("tcp", cfg.Ops.Listen); err != nil {
			lis.Close()
			return fmt.Errorf("ops.listen: %w", err)
		}
	}
	return serveOn(ctx, cfg, logger, lis, ops)
}

// serveOn serves the gRPC API on lis and, when ops is not nil, the ops
// listener's /metrics (and profiles) on ops, until ctx is done; then it
// drains, and flushes the telemetry. It closes both listeners.
func serveOn(ctx context.Context, cfg *config.Config, logger *slog.Logger, lis, ops net.Listener) (err error) {
	defer lis.Close()
	if ops != nil {
		defer ops.Close()
	}
	tel, err := telemetry.Setup(ctx, telemetry.Options{Prometheus: ops != nil && cfg.Ops.Metrics, Logger: logger, Version: releaseVersion()})
	if err != nil {
		return err
	}
	defer func() {
		flush, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if ferr := tel.Shutdown(flush); ferr != nil {
			logger.Warn("telemetry flush failed", "error", ferr)
		}
	}()

	var built atomic.Pointer[runtime.Runner]
	obs, err := observers(cfg, logger, tel, func() []policy.ModelHealth {
		if r := built.Load(); r != nil {
			return r.Health()
		}
		return nil
	})
	if err != nil {
		return err
	}
	runner, closeAll, err := buildRunner(ctx, cfg, logger, runtime.WithObserver(obs))
	if err != nil {
		return err
	}
	defer closeAll()
	built.Store(runner)

	opts, err := serverOptions(cfg, logger)
	if err != nil {
		return err
	}
	var st *store.Store
	if cfg.Store.Mode != store.ModeOff {
		// A store on a NATS cluster may wait for the cluster to form (a new
		// install's replicas start with it): meanwhile the listener answers
		// health with NOT_SERVING and every RPC with UNAVAILABLE. The
		// embedded store opens at once: a client connecting meanwhile just
		// waits for the server, as before.
		stopStarting := func() net.Listener { return lis }
		if cfg.Store.Mode == store.ModeNATS {
			stopStarting = startingServer(lis, opts.TLS)
		}
		st, err = store.Open(ctx, cfg.Store, logger)
		lis = stopStarting()
		if err != nil {
			return err
		}
		// Closed after the server has stopped and its turns have ended.
		defer st.Close()
		if cfg.Store.Mode == store.ModeNATS {
			// A request or event the NATS servers cannot take would fail
			// each turn that sends one as if the store were unreachable.
			if err := cfg.CheckStoreRecords(st.MaxRecordBytes()); err != nil {
				return err
			}
		}
		opts.Store = st
		opts.StorePace = cfg.Store.FrameInterval
		unregister, err := telemetry.RegisterStoreMetrics(tel.MeterProvider, storeUsage(st), nil)
		if err != nil {
			return err
		}
		defer func() { _ = unregister() }()
		// Cooldowns decided here reach every replica, and theirs reach
		// this one.
		runner.ShareCooldowns(st.Shared())
		// Until the server has drained its turns, not only until the
		// signal.
		wctx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
		watched := make(chan struct{})
		shared := make(chan struct{})
		defer func() { stopWatch(); <-watched; <-shared }()
		go func() {
			defer close(watched)
			if err := st.Shared().WatchCooldowns(wctx, runner.ApplyCooldown); err != nil {
				logger.Error("shared cooldowns are not watched", "error", err)
			}
		}()
		// So are the retry budgets: an outage that spent them here stops
		// the other replicas' retries too.
		go func() {
			defer close(shared)
			if err := runner.ShareBudgets(wctx, st.Shared(), budgetShareInterval); err != nil {
				logger.Error("retry budgets are not shared", "error", err)
			}
		}()
	}

	opts.MeterProvider = tel.MeterProvider
	if h := tel.ServerHandler(); h != nil {
		opts.GRPCOptions = append(opts.GRPCOptions, grpc.StatsHandler(h))
	}
	srv := server.New(runner, opts)
	if st != nil {
		// Health says when the store takes no new turn.
		st.OnRoom(srv.StoreRoom)
		// The client keys' limits hold across the replicas. Until the
		// server has drained its turns, not only until the signal.
		lctx, stopLimits := context.WithCancel(context.WithoutCancel(ctx))
		limitsShared := make(chan struct{})
		defer func() { stopLimits(); <-limitsShared }()
		go func() {
			defer close(limitsShared)
			if err := srv.ShareLimits(lctx, st.Shared(), st.ReplicaID(), limitShareInterval); err != nil {
				logger.Error("client key limits are not shared", "error", err)
			}
		}()
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	logger.Info("serving", "address", lis.Addr().String(), "tls", opts.TLS != nil, "mtls", cfg.Server.TLS != nil && cfg.Server.TLS.ClientCAFile != "",
		"client_keys", len(opts.Keys), "reflection", !opts.NoReflection, "default_model", cfg.DefaultModel, "models", runner.Models(),
		"tracing", tel.Tracing, "metrics", tel.Metrics)
	warnExposed(logger, lis.Addr(), opts)
	if ops != nil {
		stopOps := serveOps(ops, tel, cfg.Ops.PProf, srv.Ready, st, logger)
		defer stopOps()
	}
	held, live := releaseStartup()
	logger.Debug("start-up garbage collected", "held_mib", held>>20, "after_mib", live>>20)

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	logger.Info("shutting down: a second signal stops at once")
	// A second signal ends the drain early.
	second, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv.Shutdown(second)
	return <-served
}

// storeUsage reads the store's size for its metrics.
func storeUsage(st *store.Store) func() telemetry.StoreUsage {
	return func() telemetry.StoreUsage {
		u := st.Usage()
		return telemetry.StoreUsage{Bytes: u.Bytes, Limit: u.Limit, Oldest: u.Oldest, Turns: u.Turns, Evicted: u.Evicted, Full: u.Full != nil}
	}
}

// serverOptions turns the server and auth blocks into the server's
// options: the TLS files loaded (and watched), the client keys' tokens
// read from the environment as digests. Call it after [config.Config.CheckEnv].
func serverOptions(cfg *config.Config, logger *slog.Logger) (server.Options, error) {
	s := cfg.Server
	opts := server.Options{
		Logger:                logger,
		ShutdownGrace:         s.ShutdownGrace,
		DrainDelay:            s.DrainDelay,
		KeepaliveTime:         s.KeepaliveTime,
		MaxConcurrentStreams:  s.MaxConcurrentStreams,
		Keys:                  cfg.Keys(os.Getenv),
		NoReflection:          !s.Reflection,
		MaxConcurrentTurns:    s.MaxConcurrentTurns,
		MaxConnections:        s.MaxConnections,
		MaxConnectionsPerPeer: s.MaxConnectionsPerPeer,
		MaxHandshakes:         s.MaxHandshakes,
		MaxHeaderBytes:        s.MaxHeaderBytes,
		MaxConnectionIdle:     s.MaxConnectionIdle,
		MaxConnectionAge:      s.MaxConnectionAge,
		MaxConnectionAgeGrace: s.MaxConnectionAgeGrace,
		HandshakeTimeout:      s.HandshakeTimeout,
		MaxRequestBytes:       s.MaxRequestBytes,
		MaxEventBytes:         s.MaxEventBytes,
		MaxMediaBytes:         s.MaxMediaBytes,
		MaxRequestMediaBytes:  s.MaxRequestMediaBytes,
		SendTimeout:           s.SendTimeout,
		CheckToolSchemas:      argcheck.CheckSchemas,
		MaxRunningTurns:       s.MaxRunningTurns,
		DetachGrace:           cfg.Turn.DetachGrace,
		MemoryLimit:           memoryLimit(s.MemoryLimit, runtimeMemoryLimit()),
	}
	if s.TLS != nil {
		t, err := server.LoadTLS(*s.TLS, logger)
		if err != nil {
			return server.Options{}, err
		}
		opts.TLS = t
	}
	return opts, nil
}

// warnExposed warns when the server listens beyond loopback without TLS
// or without client keys: anyone who reaches the port can then spend the
// providers' keys (and, without TLS, read the turns).
func warnExposed(logger *slog.Logger, addr net.Addr, opts server.Options) {
	ta, ok := addr.(*net.TCPAddr)
	if !ok || ta.IP.IsLoopback() {
		return
	}
	if opts.TLS == nil {
		logger.Warn("serving plaintext beyond loopback: set server.tls (see docs/security.md)", "address", addr.String())
	}
	if len(opts.Keys) == 0 {
		logger.Warn("serving every caller beyond loopback: set auth.keys (see docs/security.md)", "address", addr.String())
	}
}

// buildRunner turns the configuration into a runner, with the options
// given, and returns a function that releases what it opened (MCP server
// connections and processes).
// Only the providers some model uses are built; the others are named in a
// warning, and their environment variables are not needed. Unset variables
// of the providers in use come back together as a [*config.Errors].
func buildRunner(ctx context.Context, cfg *config.Config, logger *slog.Logger, opts ...runtime.Option) (*runtime.Runner, func(), error) {
	used, unused := cfg.ProvidersInUse()
	if len(unused) > 0 {
		logger.Warn("providers no model uses are not built", "providers", unused)
	}
	if err := cfg.CheckEnv(os.LookupEnv); err != nil {
		return nil, nil, err
	}
	providers := map[string]llm.Provider{}
	for _, name := range used {
		p, err := cfg.Providers[name].Settings.Build(name, os.Getenv)
		if err != nil {
			return nil, nil, fmt.Errorf("providers.%s: %w", name, err)
		}
		providers[name] = p
	}
	var models []*runtime.Model
	for alias, mc := range cfg.Models {
		models = append(models, &runtime.Model{
			Alias:             alias,
			ProviderName:      mc.Provider,
			Provider:          providers[mc.Provider],
			ID:                mc.Model,
			Deployments:       deployments(cfg, mc, providers),
			Fallbacks:         mc.Fallbacks,
			ContextWindow:     mc.ContextWindow,
			MaxOutputTokens:   mc.MaxOutputTokens,
			FirstTokenTimeout: mc.FirstTokenTimeout,
			IdleTimeout:       mc.IdleTimeout,
			Retry:             mc.Retry,
			Hedge:             mc.Hedge,
			OnStreamCut:       mc.OnStreamCut,
			PromptCache:       mc.PromptCache,
			Compaction:        mc.Compaction,
			Tools:             allowedTools(mc.Tools),
			Input:             mc.Input,
			Reasoning:         mc.Reasoning.Reasoning(),
			TopP:              mc.TopP,
			Capabilities:      mc.Capabilities,
			Price:             cfg.ModelPrice(alias),
		})
	}
	tools, rules, closeTools, err := buildTools(ctx, cfg, logger)
	if err != nil {
		return nil, nil, err
	}
	// Checked with the configuration: the entries parse.
	hosts, _ := runtime.ParseHostRules(cfg.Server.RefusedMediaHosts)
	opts = append([]runtime.Option{
		runtime.WithLogger(logger), runtime.WithLimits(cfg.Turn.Limits), runtime.WithToolRules(rules),
		runtime.WithOutputSchemas(argcheck.OutputSchemas{}), runtime.WithRefusedMediaHosts(hosts),
	}, opts...)
	r, err := runtime.New(models, cfg.DefaultModel, tools, opts...)
	if err != nil {
		closeTools()
		return nil, nil, err
	}
	return r, closeTools, nil
}

// deployments returns the deployments of model mc for the runtime; nil
// when it is served by its provider and model alone.
func deployments(cfg *config.Config, mc config.Model, providers map[string]llm.Provider) []runtime.Deployment {
	if len(mc.Deployments) == 0 {
		return nil
	}
	var out []runtime.Deployment
	for _, d := range mc.Routes() {
		out = append(out, runtime.Deployment{
			Name: d.Name, ProviderName: d.Provider, Provider: providers[d.Provider], ID: d.Model, Weight: d.Weight,
			Price: cfg.DeploymentPrice(d),
		})
	}
	return out
}

// allowedTools returns a model's tool allowlist for the runtime: nil (all
// tools) when the configuration lists none.
func allowedTools(names []string) []string {
	if len(names) == 0 {
		return nil
	}
	return append([]string{clock.Name}, names...)
}

// buildTools connects to the configured MCP servers and returns every
// server-side tool, each validating its arguments against its schema, and
// the tools' rules (require_approval, ends_turn) by the names models see.
func buildTools(ctx context.Context, cfg *config.Config, logger *slog.Logger) ([]llm.Tool, runtime.ToolRules, func(), error) {
	tools := []llm.Tool{clock.Tool{}}
	var rules runtime.ToolRules
	if len(cfg.MCPServers) == 0 {
		return tools, rules, func() {}, nil
	}
	var servers []mcp.ServerConfig
	for name, s := range cfg.MCPServers {
		sc := mcp.ServerConfig{
			Name: name, Command: s.Command, Args: s.Args, Env: s.Env, EnvFrom: s.EnvFrom,
			URL: s.URL, Headers: s.Headers, HeadersFromEnv: s.HeadersFromEnv,
			Tools: s.Tools, ToolPrefix: s.ToolPrefix, ConnectTimeout: s.ConnectTimeout,
		}
		if len(s.ToolOverrides) > 0 {
			sc.Overrides = map[string]mcp.ToolOverride{}
			for tool, o := range s.ToolOverrides {
				sc.Overrides[tool] = mcp.ToolOverride{ReadOnly: o.ReadOnly, Idempotent: o.Idempotent, Timeout: o.Timeout}
			}
		}
		servers = append(servers, sc)
	}
	ts, err := mcp.New(ctx, servers, mcp.WithLogger(logger))
	if err != nil {
		return nil, rules, nil, fmt.Errorf("mcp_servers: %w", err)
	}
	for _, t := range ts.Tools() {
		checked, err := argcheck.Wrap(t)
		if err != nil {
			_ = ts.Close()
			return nil, rules, nil, fmt.Errorf("mcp_servers: %w", err)
		}
		tools = append(tools, checked)
	}
	if rules, err = toolRules(cfg, ts); err != nil {
		_ = ts.Close()
		return nil, rules, nil, err
	}
	logger.Info("MCP tools ready", "servers", len(servers), "tools", len(tools)-1,
		"require_approval", len(rules.RequireApproval), "ends_turn", len(rules.EndsTurn))
	return tools, rules, func() { _ = ts.Close() }, nil
}

// toolRules maps the servers' require_approval and ends_turn lists to the
// names models see ("*" to every tool of the server); a name the server
// does not offer is an error naming its key.
func toolRules(cfg *config.Config, ts *mcp.Toolset) (runtime.ToolRules, error) {
	var rules runtime.ToolRules
	for _, name := range slices.Sorted(maps.Keys(cfg.MCPServers)) {
		s := cfg.MCPServers[name]
		offered := ts.ServerTools(name)
		resolve := func(key string, list []string) ([]string, error) {
			var out []string
			for i, tool := range list {
				if tool == config.AllTools {
					out = append(out, offered...)
					continue
				}
				if !slices.Contains(offered, s.ToolPrefix+tool) {
					return nil, fmt.Errorf("mcp_servers.%s.%s[%d]: the server offers no tool %q", name, key, i, tool)
				}
				out = append(out, s.ToolPrefix+tool)
			}
			return out, nil
		}
		approval, err := resolve("require_approval", s.RequireApproval)
		if err != nil {
			return rules, err
		}
		ends, err := resolve("ends_turn", s.EndsTurn)
		if err != nil {
			return rules, err
		}
		rules.RequireApproval = append(rules.RequireApproval, approval...)
		rules.EndsTurn = append(rules.EndsTurn, ends...)
	}
	return rules, nil
}

// newLogger returns the server's logger, writing to w in the configured
// format, with secrets redacted from every line.
func newLogger(w io.Writer, c config.Log, secrets []string) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.Level)); err != nil {
		return nil, fmt.Errorf("log.level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch c.Format {
	case "json":
		// JSON would write a duration as integer nanoseconds; write it as
		// the text format does, a Go duration string ("1.5s").
		opts.ReplaceAttr = func(_ []string, a slog.Attr) slog.Attr {
			if a.Value.Kind() == slog.KindDuration {
				return slog.String(a.Key, a.Value.Duration().String())
			}
			return a
		}
		h = slog.NewJSONHandler(w, opts)
	case "text":
		h = slog.NewTextHandler(w, opts)
	default:
		return nil, errors.New("log.format: must be text or json")
	}
	return slog.New(newRedactHandler(h, secrets)), nil
}
