// Command turnstile runs the turnstile gRPC server (serve) and renders turns
// for people (run).
//
//	turnstile serve [--config FILE] [--listen ADDR]
//	turnstile run [--addr ADDR] [--model ALIAS] [--system TEXT] [--json]
//	              [--timeout D] [--retries N] [--tls] PROMPT...
//	turnstile bench [--chunks N] [--delay D] [--c N] [--slow N] [--upstream h1|h2] [--config FILE] ...
//	turnstile config check [--env=false] FILE | schema | reference
//	turnstile version
//
// run exits 0 when the turn completed, 1 when it failed and retrying won't
// help, 2 on a usage error, 3 when it failed but may succeed if run again,
// and 130 when Ctrl-C stopped it.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
)

// Exit codes of turnstile run.
const (
	exitOK        = 0
	exitPermanent = 1 // the turn failed and retrying won't help
	exitUsage     = 2 // bad flags or arguments
	exitRetryable = 3 // the turn failed but may succeed if run again
)

// version is the release, when the build stamps one:
// go build -ldflags "-X main.version=v1.2.3". Without it the module's
// version from the build information is used ("(devel)" for a build from a
// checkout).
var version = ""

func main() {
	os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
}

// cli dispatches the command line to its subcommand.
func cli(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "serve":
		setGCDefaults()
		return serve(args[1:], stderr)
	case "run":
		return run(args[1:])
	case "bench":
		return benchCmd(args[1:])
	case "config":
		return configCmd(args[1:], stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, versionString())
		return exitOK
	case "help", "-h", "--help":
		usage(stdout)
		return exitOK
	}
	fmt.Fprintf(stderr, "turnstile: unknown command %q\n\n", args[0])
	usage(stderr)
	return exitUsage
}

// versionString says which turnstile this is: its version, the commit it
// was built from (with +dirty for uncommitted changes) and when, and the Go
// release and platform.
func versionString() string {
	v := releaseVersion()
	if v == "" {
		v = "(unknown)"
	}
	s := "turnstile " + v
	info, ok := debug.ReadBuildInfo()
	if ok {
		var rev, at string
		var dirty bool
		for _, kv := range info.Settings {
			switch kv.Key {
			case "vcs.revision":
				rev = kv.Value
			case "vcs.time":
				at = kv.Value
			case "vcs.modified":
				dirty = kv.Value == "true"
			}
		}
		if rev != "" {
			s += " (commit " + rev[:min(len(rev), 12)]
			if dirty {
				s += "+dirty"
			}
			if at != "" {
				s += ", " + at
			}
			s += ")"
		}
	}
	return s + " " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
}

// releaseVersion is the version stamped by -ldflags, else the module's
// version from the build information ("(devel)" for a build from a
// checkout), else empty: the service.version of the telemetry's resource
// and the version of its instrumentation scope.
func releaseVersion() string {
	if version != "" {
		return version
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		return info.Main.Version
	}
	return ""
}

func usage(w io.Writer) {
	fmt.Fprint(w, `turnstile runs LLM agent turns over gRPC and streams every step.

Usage:
  turnstile serve [--config FILE] [--listen ADDR]   serve AgentService (default 127.0.0.1:7700)
  turnstile run [flags] PROMPT...                   run one turn and render it
  turnstile bench [flags]                           measure what the server adds (BENCHMARKS.md)
  turnstile config check|schema|reference          check a config file; print its JSON Schema or reference
  turnstile version                                 print the version and build information

Run "turnstile serve -h", "turnstile run -h" or "turnstile bench -h" for their flags.
`)
}
