package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/turnstile-dev/turnstile/config"
)

// configCmd runs turnstile config: check a file, or print the schema or
// the reference generated from the decoder.
//
//	turnstile config check [--env=false] FILE
//	turnstile config schema
//	turnstile config reference
func configCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		configUsage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "check":
		return configCheck(args[1:], stdout, stderr)
	case "schema", "reference":
		if len(args) > 1 {
			fmt.Fprintf(stderr, "turnstile config %s: unexpected argument %q\n", args[0], args[1])
			return exitUsage
		}
		out := config.Schema()
		if args[0] == "reference" {
			out = config.Reference()
		}
		if _, err := stdout.Write(out); err != nil {
			fmt.Fprintf(stderr, "turnstile config %s: %v\n", args[0], err)
			return exitPermanent
		}
		return exitOK
	case "help", "-h", "--help":
		configUsage(stdout)
		return exitOK
	}
	fmt.Fprintf(stderr, "turnstile config: unknown command %q\n\n", args[0])
	configUsage(stderr)
	return exitUsage
}

// configCheck runs the checks serve runs on a file before it listens: the
// file's own (Load) and, unless --env=false, that the environment variables
// the file names for the providers in use and the client keys are set.
// It prints the problems as serve does and exits 1, or says ok and exits 0.
func configCheck(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("config check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	env := fs.Bool("env", true, "also check that the environment variables the file names are set, as serve does")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: turnstile config check [--env=false] FILE")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return exitUsage
	}
	path := fs.Arg(0)
	cfg, err := config.Load(path)
	if err == nil && *env {
		err = cfg.CheckEnv(os.LookupEnv)
	}
	var cerr *config.Errors
	switch {
	case errors.As(err, &cerr):
		// As serve prints them: one problem a line, file:line: path: message.
		fmt.Fprintln(stderr, cerr)
		return exitPermanent
	case err != nil:
		fmt.Fprintf(stderr, "turnstile config check: %v\n", err)
		return exitPermanent
	}
	fmt.Fprintf(stdout, "%s: ok\n", path)
	return exitOK
}

func configUsage(w io.Writer) {
	fmt.Fprint(w, `Usage:
  turnstile config check [--env=false] FILE   run serve's checks on FILE without serving; exit 1 on a problem
  turnstile config schema                     print the JSON Schema of the file (config/turnstile.schema.json)
  turnstile config reference                  print the configuration reference (docs/config-reference.md)
`)
}
