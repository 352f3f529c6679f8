// Command turnstile runs the turnstile gRPC server (serve) and renders turns
// for people (run).
//
//	turnstile serve [--config FILE] [--listen ADDR]
//	turnstile run [--addr ADDR] [--model ALIAS] [--system TEXT] [--json]
//	              [--timeout D] [--retries N] [--tls] PROMPT...
//	turnstile bench [--chunks N] [--delay D] [--c N] [--slow N] [--config FILE] ...
//
// run exits 0 when the turn completed, 1 when it failed and retrying won't
// help, 2 on a usage error, and 3 when it failed but may succeed if run again.
package main

import (
	"fmt"
	"log/slog"
	"os"
)

// Exit codes of turnstile run.
const (
	exitOK        = 0
	exitPermanent = 1 // the turn failed and retrying won't help
	exitUsage     = 2 // bad flags or arguments
	exitRetryable = 3 // the turn failed but may succeed if run again
)

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(exitUsage)
	}
	var code int
	switch os.Args[1] {
	case "serve":
		setGCDefaults()
		startDebug(slog.Default())
		code = serve(os.Args[2:], os.Stderr)
	case "run":
		code = run(os.Args[2:])
	case "bench":
		code = benchCmd(os.Args[2:])
	case "help", "-h", "--help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "turnstile: unknown command %q\n\n", os.Args[1])
		usage()
		code = exitUsage
	}
	os.Exit(code)
}

func usage() {
	fmt.Fprint(os.Stderr, `turnstile runs LLM agent turns over gRPC and streams every step.

Usage:
  turnstile serve [--config FILE] [--listen ADDR]   serve AgentService (default 127.0.0.1:7700)
  turnstile run [flags] PROMPT...                   run one turn and render it
  turnstile bench [flags]                           measure what the server adds (BENCHMARKS.md)

Run "turnstile serve -h", "turnstile run -h" or "turnstile bench -h" for their flags.
`)
}
