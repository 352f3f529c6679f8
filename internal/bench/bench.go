// Package bench measures what turnstile adds to a model call: it starts a
// fake OpenAI-compatible upstream on loopback, measures it called directly
// by a Go HTTP client (the floor), then runs the same conversation through
// the real server — the turnstile binary, run as a child process with a
// configuration whose openai provider points at the upstream — with the
// Go gRPC client, sequentially and concurrently. It reports turns per
// second, time to the first text delta and to the end of the turn (p50 and
// p99), the server's CPU time, allocations and memory per turn, its idle
// and peak resident set, and the memory of many slow turns held open. Each
// store mode is a shape of processes: one server with the store on or off,
// or several servers sharing a NATS cluster of three servers the bench
// starts as processes of their own (or one given by URL); the CPU time of
// every process of the shape is reported, and the messages the turn log
// gains per turn.
//
// `turnstile bench` is its command line; BENCHMARKS.md holds the results.
// The processes' CPU time comes from /proc, so the bench runs on Linux
// only.
//
// Of the module, the package imports only the generated contract (gen/):
// it talks to the server over the wire, as any client does. It runs a NATS
// server of the cluster shape with nats-server's package ([RunNATSNode]).
package bench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Config configures a [Run]. Zero fields take the defaults given.
type Config struct {
	// Binary is the turnstile binary to run as the server (required).
	Binary string
	// ServerConfig is the server's YAML configuration, in which
	// [UpstreamPlaceholder] stands for the fake upstream's base URL
	// (default [DefaultConfig]). Its default model is the one measured;
	// a model "slow" on the same upstream with model id [SlowModel]
	// serves the slow turns.
	ServerConfig string
	// Env is added to the server's environment (GOGC=..., for example).
	Env []string
	// Upstream shapes the fake upstream's replies.
	Upstream UpstreamConfig
	// Turns is the number of turns of each sequential phase (default 2000).
	Turns int
	// ConcurrentTurns is the number of turns of the concurrent phase
	// (default 10000).
	ConcurrentTurns int
	// Concurrency is the number of turns in flight in the concurrent
	// phase (default 50).
	Concurrency int
	// Conns is the number of gRPC connections the concurrent phase
	// spreads its turns over (default 1).
	Conns int
	// Warmup is the number of turns run before measuring (default 200).
	Warmup int
	// Slow is the number of slow turns held open at once (default 0: the
	// slow phase is skipped).
	Slow int
	// ProfileDir, when set, receives the server's CPU profiles of the
	// sequential and the concurrent phases of each store mode (on-seq.pprof,
	// on-conc.pprof, off-seq.pprof...; with the cluster shape the first
	// server's, and each NATS server's the bench started:
	// cluster-conc-nats-n0.pprof...), and their allocation profiles
	// before and after the phase (on-seq.allocs.base, on-seq.allocs: `go
	// tool pprof -sample_index=alloc_objects -base on-seq.allocs.base
	// on-seq.allocs`); with Callgrind, callgrind's profiles
	// (on-seq.callgrind...); with Slow, the heap and goroutine profiles
	// taken while the slow turns are held (on-slow.heap,
	// on-slow.goroutines: `go tool pprof -sample_index=inuse_space`).
	ProfileDir string
	// Settle is how long the server is left idle before its idle resident
	// set is read, at start and after the load (default 2s).
	Settle time.Duration
	// Stores are the turn stores the server phases are run with, one
	// shape after the other: "on" (the configuration as it is: by
	// default the embedded store), "off" (the configuration with
	// [StoreOff]) and "cluster" ([Config.Replicas] servers sharing a NATS
	// cluster: three NATS servers the bench starts, the log and leases
	// replicated three times, or the cluster of [Config.NATSURL]).
	// Default: on and off.
	Stores []string
	// NATSURL is, for the cluster shape, the NATS cluster to use (its
	// client URLs, comma separated) instead of three servers the bench
	// starts; the log's replication is then the store's automatic one.
	NATSURL string
	// Replicas is the number of turnstile servers of the cluster shape
	// (default 2). The concurrent phase spreads its turns over them; the
	// sequential and slow phases use the first.
	Replicas int
	// FrameInterval, when set, is the servers' store.frame_interval (a
	// duration, as the configuration writes it) with the store on and in
	// the cluster shape; empty leaves the servers' default.
	FrameInterval string
	// NATSBinary is the executable the bench runs as each NATS server of
	// the cluster shape, with [NATSNodeFlag]: a turnstile binary of this
	// version (default Binary).
	NATSBinary string
	// Callgrind runs the server under valgrind's callgrind tool, which
	// counts the instructions the server executes during each measured
	// phase: a figure that other work on the machine does not change, as
	// it does CPU time. The server runs some 50 times slower, so use it
	// with a few hundred turns per phase; valgrind and callgrind_control
	// must be on the PATH.
	Callgrind bool
	// Log receives progress lines (default: discarded).
	Log io.Writer
}

func (c *Config) defaults() error {
	if c.Binary == "" {
		return errors.New("bench: no server binary")
	}
	if c.ServerConfig == "" {
		c.ServerConfig = DefaultConfig
	}
	if c.Turns <= 0 {
		c.Turns = 2000
	}
	if c.ConcurrentTurns <= 0 {
		c.ConcurrentTurns = 10000
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 50
	}
	if c.Conns <= 0 {
		c.Conns = 1
	}
	if c.Warmup < 0 {
		c.Warmup = 0
	} else if c.Warmup == 0 {
		c.Warmup = 200
	}
	if c.Settle <= 0 {
		c.Settle = 2 * time.Second
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	if len(c.Stores) == 0 {
		c.Stores = []string{"on", "off"}
	}
	if c.Replicas <= 0 {
		c.Replicas = 2
	}
	if c.NATSBinary == "" {
		c.NATSBinary = c.Binary
	}
	for _, m := range c.Stores {
		switch m {
		case "on":
			if c.FrameInterval != "" && setsStore(c.ServerConfig) {
				return errors.New("bench: the configuration sets store itself: set frame_interval there")
			}
		case "off", "cluster":
			if setsStore(c.ServerConfig) {
				return errors.New("bench: the configuration sets store itself: measure it with the store on only")
			}
			if m == "cluster" && c.Callgrind {
				return errors.New("bench: callgrind counts one server's instructions: not with the cluster shape")
			}
		default:
			return fmt.Errorf("bench: store %q: want on, off or cluster", m)
		}
	}
	c.Upstream.defaults()
	return nil
}

// setsStore reports whether a YAML configuration has a top-level store key.
func setsStore(yaml string) bool {
	for line := range strings.SplitSeq(yaml, "\n") {
		if strings.HasPrefix(line, "store:") {
			return true
		}
	}
	return false
}

// Phase is the measurement of one load phase.
type Phase struct {
	Name        string
	Turns       int
	Errors      int
	FirstErr    string
	Concurrency int
	TurnsPerSec float64
	// FirstDelta and Total are percentiles of the time to the first text
	// delta and to the end of the turn.
	FirstDeltaP50, FirstDeltaP99, FirstDeltaMax time.Duration
	TotalP50, TotalP99                          time.Duration
	// Server-side figures per turn; zero for direct phases. CPUPerTurn is
	// the CPU time of every process of the shape (its turnstile servers
	// and the NATS servers the bench started), Processes each one's;
	// allocations are the turnstile servers'.
	CPUPerTurn    time.Duration
	Processes     []ProcessCPU
	AllocsPerTurn float64
	BytesPerTurn  float64
	GCCycles      uint64
	// InstructionsPerTurn is the server's instructions per turn, counted
	// by callgrind; zero unless [Config.Callgrind].
	InstructionsPerTurn float64
	// BenchCPUPerTurn is the bench's own CPU time per turn: its gRPC or
	// HTTP client and the fake upstream.
	BenchCPUPerTurn time.Duration
	// StoredPerTurn is how many messages the turn log gained per turn
	// (read from the first server's /debug/store); 0 without a store, or
	// when the server does not serve it (an older build).
	StoredPerTurn float64
	// NATSInPerTurn and NATSOutPerTurn are the messages the NATS servers
	// the bench started received and sent per turn, summed over them
	// (their /varz: clients', the cluster's own traffic, JetStream's);
	// zero without them.
	NATSInPerTurn, NATSOutPerTurn float64
}

// ProcessCPU is one process's CPU time per turn in a phase.
type ProcessCPU struct {
	// Name says which process: "turnstile" (and its index with several),
	// or the NATS server's name.
	Name       string
	CPUPerTurn time.Duration
}

// Report is the result of a [Run].
type Report struct {
	Config Config
	// DirectSeq and DirectConc are the sequential and concurrent phases
	// with the upstream called directly.
	DirectSeq, DirectConc Phase
	// Servers are the measurements through turnstile, one per store mode
	// of [Config.Stores], in its order.
	Servers []*ServerReport
	// UpstreamRequests is how many chat completions the upstream answered
	// in the whole run, UpstreamHTTP2 how many of them over HTTP/2.
	UpstreamRequests, UpstreamHTTP2 int64
}

// ServerReport is the measurement of one shape: its servers with one
// store mode.
type ServerReport struct {
	// Store is the store mode: "on", "off" or "cluster".
	Store string
	// ServerSeq and ServerConc are the sequential and concurrent phases
	// through turnstile.
	ServerSeq, ServerConc Phase
	// IdleRSS is the server's resident set after start, before any turn;
	// IdleRSSAfter after the load phases ended; PeakRSS the highest it
	// reached outside the slow phase.
	IdleRSS, IdleRSSAfter, PeakRSS int64
	// Slow is the number of slow turns held open; SlowRSS the server's
	// resident set with them open, SlowPerTurn its growth per slow turn;
	// SlowOpen how many had streamed a delta when it was measured.
	Slow, SlowOpen       int
	SlowRSS, SlowPerTurn int64
	// SlowHeapPerTurn and SlowStackPerTurn are the growth per slow turn
	// of the server's heap spans in use and of its goroutine stacks
	// (runtime.MemStats' HeapInuse and StackInuse): what of SlowPerTurn
	// is the heap and what the stacks; zero when they could not be read.
	SlowHeapPerTurn, SlowStackPerTurn int64
	// SlowErr describes the slow turns that failed, if any.
	SlowErr string
	// FastUnderSlow is a sequential phase run while the slow turns are
	// open.
	FastUnderSlow Phase
}

// Run measures as cfg says and returns the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	rep := &Report{Config: cfg}
	logf := func(format string, args ...any) { fmt.Fprintf(cfg.Log, format+"\n", args...) }
	if cfg.ProfileDir != "" {
		if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
			return nil, err
		}
	}

	up, err := StartUpstream(cfg.Upstream)
	if err != nil {
		return nil, err
	}
	defer up.Close()

	// The floor: the upstream called directly.
	transport := &http.Transport{MaxIdleConnsPerHost: cfg.Concurrency * 2, IdleConnTimeout: time.Minute}
	if up.Roots != nil {
		transport.TLSClientConfig = &tls.Config{RootCAs: up.Roots, MinVersion: tls.VersionTLS12}
		transport.ForceAttemptHTTP2 = true
	}
	defer transport.CloseIdleConnections()
	direct := directTurn(&http.Client{Transport: transport}, up.URL)
	drive(ctx, cfg.Warmup, 1, direct)
	logf("direct, sequential: %d turns", cfg.Turns)
	rep.DirectSeq = phase("direct", drive(ctx, cfg.Turns, 1, direct), 1)
	logf("direct, concurrency %d: %d turns", cfg.Concurrency, cfg.ConcurrentTurns)
	rep.DirectConc = phase("direct", drive(ctx, cfg.ConcurrentTurns, cfg.Concurrency, direct), cfg.Concurrency)

	for _, store := range cfg.Stores {
		srep, err := runServer(ctx, cfg, store, up, logf)
		if err != nil {
			return nil, fmt.Errorf("store %s: %w", store, err)
		}
		rep.Servers = append(rep.Servers, srep)
	}
	rep.UpstreamRequests, rep.UpstreamHTTP2 = up.Requests(), up.HTTP2Requests()
	return rep, nil
}

// runServer starts the shape of the store mode given and measures it.
// With the upstream over TLS the servers trust its certificate as any Go
// program is told to trust a private authority: SSL_CERT_FILE, which
// replaces the system's roots (--env can still set it).
func runServer(ctx context.Context, cfg Config, store string, up *Upstream, logf func(string, ...any)) (*ServerReport, error) {
	rep := &ServerReport{Store: store}
	template := cfg.ServerConfig
	replicas := 1
	var nodes []*natsNode
	switch store {
	case "on":
		if cfg.FrameInterval != "" {
			template = strings.TrimRight(template, "\n") + "\n" + fmt.Sprintf("store: {frame_interval: %s}\n", cfg.FrameInterval)
		}
	case "off":
		template = strings.TrimRight(template, "\n") + "\n" + StoreOff
	case "cluster":
		replicas = cfg.Replicas
		url, copies := cfg.NATSURL, 0
		if url == "" {
			dir, err := os.MkdirTemp("", "turnstile-bench-nats-")
			if err != nil {
				return nil, err
			}
			defer os.RemoveAll(dir)
			logf("starting a NATS cluster of three servers (%s %s)", cfg.NATSBinary, NATSNodeFlag)
			if nodes, err = startCluster(ctx, cfg.NATSBinary, dir, 3, cfg.ProfileDir != "" && !cfg.Callgrind); err != nil {
				return nil, err
			}
			defer func() {
				for _, nd := range nodes {
					nd.stop()
				}
			}()
			var urls []string
			for _, nd := range nodes {
				urls = append(urls, nd.url)
			}
			url, copies = strings.Join(urls, ","), 3
		}
		template = clusterConfig(template, url, copies, cfg.FrameInterval)
	}
	env := cfg.Env
	if up.CAFile != "" {
		env = append([]string{"SSL_CERT_FILE=" + up.CAFile}, env...)
	}
	var servers []*child
	defer func() {
		for _, srv := range servers {
			srv.stop()
		}
	}()
	for range replicas {
		logf("starting %s serve, store %s, upstream %s", cfg.Binary, store, cfg.Upstream.Mode())
		srv, err := startChild(ctx, cfg.Binary, template, up.URL, env, cfg.Callgrind)
		if err != nil {
			return nil, err
		}
		servers = append(servers, srv)
	}
	srv := servers[0]
	time.Sleep(cfg.Settle) // let start-up work settle
	idle, err := srv.stats()
	if err != nil {
		return nil, err
	}
	rep.IdleRSS = idle.rss

	var addrs []string
	for _, srv := range servers {
		addrs = append(addrs, srv.addr)
	}
	client, closeConns, err := dial(addrs, max(cfg.Conns, 1))
	if err != nil {
		return nil, err
	}
	defer closeConns()
	one := client()
	turn := grpcTurn(one, "")
	spread := func(ctx context.Context) (sample, error) { return grpcTurn(client(), "")(ctx) }
	drive(ctx, cfg.Warmup, 1, turn)
	drive(ctx, cfg.Warmup, cfg.Concurrency, spread)

	// A CPU profile covers the start of a phase: 3 s, or 10 s of paced
	// turns, which take seconds each.
	seconds := 3
	if cfg.Upstream.Delay > 0 {
		seconds = 10
	}
	measure := func(name string, n, conc int, fn turnFunc, profile string) (Phase, error) {
		var wg sync.WaitGroup
		keep := ""
		switch {
		case cfg.ProfileDir == "" || profile == "":
		case cfg.Callgrind:
			keep = filepath.Join(cfg.ProfileDir, store+"-"+profile+".callgrind")
		default:
			wg.Go(func() { fetchProfile(srv.ops, filepath.Join(cfg.ProfileDir, store+"-"+profile+".pprof"), seconds) })
			for _, nd := range nodes {
				if nd.prof != "" {
					wg.Go(func() {
						fetchProfile(nd.prof, filepath.Join(cfg.ProfileDir, store+"-"+profile+"-nats-"+nd.name+".pprof"), seconds)
					})
				}
			}
			fetchAllocs(srv.ops, filepath.Join(cfg.ProfileDir, store+"-"+profile+".allocs.base"))
			defer fetchAllocs(srv.ops, filepath.Join(cfg.ProfileDir, store+"-"+profile+".allocs"))
		}
		before, err := shapeStats(servers, nodes)
		if err != nil {
			return Phase{}, err
		}
		storedBefore, storedErr := storedMessages(srv.ops)
		if err := srv.countInstructions(); err != nil {
			return Phase{}, err
		}
		res := drive(ctx, n, conc, fn)
		instr, err := srv.instructions(keep)
		if err != nil {
			return Phase{}, err
		}
		after, err := shapeStats(servers, nodes)
		if err != nil {
			return Phase{}, err
		}
		storedAfter, storedErr2 := storedMessages(srv.ops)
		wg.Wait()
		p := phase(name, res, conc)
		if turns := len(res.samples) + res.errors; turns > 0 {
			per := func(d time.Duration) time.Duration { return d / time.Duration(turns) }
			p.BenchCPUPerTurn = per(after.bench - before.bench)
			for i := range before.servers {
				d := after.servers[i].sub(before.servers[i])
				p.CPUPerTurn += per(d.cpu)
				p.AllocsPerTurn += float64(d.allocObjects) / float64(turns)
				p.BytesPerTurn += float64(d.allocBytes) / float64(turns)
				p.GCCycles += d.gcCycles
				name := "turnstile"
				if len(servers) > 1 {
					name = fmt.Sprintf("turnstile %d", i+1)
				}
				p.Processes = append(p.Processes, ProcessCPU{Name: name, CPUPerTurn: per(d.cpu)})
				rep.PeakRSS = max(rep.PeakRSS, after.servers[i].peakRSS)
			}
			for i, nd := range nodes {
				d := per(after.nodes[i] - before.nodes[i])
				p.CPUPerTurn += d
				p.Processes = append(p.Processes, ProcessCPU{Name: "nats " + nd.name, CPUPerTurn: d})
			}
			p.InstructionsPerTurn = float64(instr) / float64(turns)
			p.NATSInPerTurn = float64(after.natsIn-before.natsIn) / float64(turns)
			p.NATSOutPerTurn = float64(after.natsOut-before.natsOut) / float64(turns)
			if storedErr == nil && storedErr2 == nil {
				p.StoredPerTurn = float64(storedAfter-storedBefore) / float64(turns)
			}
		}
		return p, nil
	}
	logf("turnstile, sequential: %d turns", cfg.Turns)
	if rep.ServerSeq, err = measure("turnstile", cfg.Turns, 1, turn, "seq"); err != nil {
		return nil, err
	}
	logf("turnstile, concurrency %d over %d connection(s) to each of %d server(s): %d turns", cfg.Concurrency, cfg.Conns, len(servers), cfg.ConcurrentTurns)
	if rep.ServerConc, err = measure("turnstile", cfg.ConcurrentTurns, cfg.Concurrency, spread, "conc"); err != nil {
		return nil, err
	}
	time.Sleep(cfg.Settle)
	after, err := srv.stats()
	if err != nil {
		return nil, err
	}
	rep.IdleRSSAfter = after.rss

	if cfg.Slow > 0 {
		if err := slowPhase(ctx, cfg, srv, rep, turn, logf); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

func phase(name string, r result, concurrency int) Phase {
	l := summarize(r.samples)
	p := Phase{
		Name: name, Turns: len(r.samples), Errors: r.errors, Concurrency: concurrency,
		FirstDeltaP50: l.firstP50, FirstDeltaP99: l.firstP99, FirstDeltaMax: l.firstMax,
		TotalP50: l.totalP50, TotalP99: l.totalP99,
	}
	if r.firstErr != nil {
		p.FirstErr = r.firstErr.Error()
	}
	if r.wall > 0 {
		p.TurnsPerSec = float64(len(r.samples)) / r.wall.Seconds()
	}
	return p
}
