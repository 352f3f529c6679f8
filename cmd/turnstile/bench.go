package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/turnstile-dev/turnstile/internal/bench"
)

// benchCmd runs the benchmark of internal/bench: a fake OpenAI-compatible
// upstream, measured directly and through this binary run as a server.
func benchCmd(args []string) int {
	if len(args) == 2 && args[0] == bench.NATSNodeFlag {
		// One NATS server of the cluster shape, which the bench starts so.
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := bench.RunNATSNode(ctx, args[1]); err != nil {
			fmt.Fprintf(os.Stderr, "turnstile bench: %v\n", err)
			return exitPermanent
		}
		return exitOK
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var cfg bench.Config
	self, _ := os.Executable()
	fs.StringVar(&cfg.Binary, "bin", self, "turnstile `binary` to run as the server")
	// The NATS servers of the cluster shape are this executable, whatever
	// --bin runs as turnstile.
	cfg.NATSBinary = self
	configPath := fs.String("config", "", "server configuration `file`; "+bench.UpstreamPlaceholder+" stands for the fake upstream's base URL; no ops block: the bench adds its own (default: one openai provider and model)")
	chain := fs.Bool("chain", false, "configure a chain of three models with retries (ignored with --config)")
	fs.IntVar(&cfg.Upstream.Chunks, "chunks", 20, "content chunks per reply")
	fs.IntVar(&cfg.Upstream.ChunkSize, "chunk-size", 8, "content bytes per chunk")
	fs.DurationVar(&cfg.Upstream.Delay, "delay", 0, "pause before each content chunk: the model's pace (a real model streams a chunk every 10–50ms)")
	upstream := fs.String("upstream", "h1", "the fake upstream's protocol: `h1` (cleartext HTTP/1.1, a connection per reply in flight) or h2 (HTTPS with HTTP/2, as real providers are reached: replies share connections; the server trusts its self-signed certificate through SSL_CERT_FILE)")
	fs.IntVar(&cfg.Turns, "turns", 2000, "turns of each sequential phase")
	fs.IntVar(&cfg.ConcurrentTurns, "concurrent-turns", 10000, "turns of the concurrent phase")
	fs.IntVar(&cfg.Concurrency, "c", 50, "turns in flight in the concurrent phase")
	fs.IntVar(&cfg.Conns, "conns", 1, "gRPC connections of the concurrent phase")
	fs.IntVar(&cfg.Warmup, "warmup", 200, "turns run before measuring")
	fs.IntVar(&cfg.Slow, "slow", 0, "slow turns (one chunk per second) to hold open; 0 skips the slow phase")
	fs.StringVar(&cfg.ProfileDir, "profile", "", "`directory` for the server's CPU and allocation profiles of the sequential and concurrent phases, per store mode, and its heap and goroutine profiles with the slow turns held")
	fs.BoolVar(&cfg.Callgrind, "callgrind", false, "run the server under valgrind's callgrind and report its instructions per turn (use a few hundred turns)")
	stores := fs.String("store", "on,off", "turn stores to measure, one shape after the other, in this order: `on` (the configuration as it is; by default the embedded store), off (store: {mode: off}), cluster (--replicas servers on a NATS cluster: three NATS servers, each this executable run with "+bench.NATSNodeFlag+", the log replicated three times; or the cluster of --nats)")
	fs.StringVar(&cfg.NATSURL, "nats", "", "the cluster shape's NATS `URLs` (comma separated) instead of three servers the bench starts")
	fs.StringVar(&cfg.FrameInterval, "frame-interval", "", "the servers' store.frame_interval (a `duration`) with the store on and in the cluster shape; default: theirs")
	fs.IntVar(&cfg.Replicas, "replicas", 2, "turnstile servers of the cluster shape; the concurrent phase spreads its turns over them")
	env := fs.String("env", "", "comma-separated `VAR=value` pairs added to the server's environment (GOGC=200,...)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "turnstile bench: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	switch {
	case *configPath != "":
		b, err := os.ReadFile(*configPath)
		if err != nil {
			fmt.Fprintf(os.Stderr, "turnstile bench: %v\n", err)
			return exitUsage
		}
		cfg.ServerConfig = string(b)
	case *chain:
		cfg.ServerConfig = bench.ChainConfig
	}
	switch *upstream {
	case "h1":
	case "h2":
		cfg.Upstream.TLS = true
	default:
		fmt.Fprintf(os.Stderr, "turnstile bench: --upstream %q: want h1 or h2\n", *upstream)
		return exitUsage
	}
	cfg.Stores = strings.Split(*stores, ",")
	if *env != "" {
		cfg.Env = strings.Split(*env, ",")
	}
	cfg.Log = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "turnstile bench: %v\n", err)
		return exitPermanent
	}
	rep.Write(os.Stdout)
	return exitOK
}
