package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// run is "turnstile run": it runs one turn and renders it for a person, or
// as JSON lines for a script. The first SIGINT (Ctrl-C) or SIGTERM cancels
// the turn: the client asks the server to stop it and the command renders
// its last events, for at most 2s; a second signal exits at once. The command
// then exits 128 + the signal's number (130 for Ctrl-C).
func run(args []string) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	done := make(chan struct{})
	defer close(done)
	prefix := ""
	if isTerminal(os.Stderr) {
		prefix = "\n" // after the terminal's ^C, on a line of its own
	}
	caught := interrupts(sigs, done, cancel, os.Stderr, prefix, os.Exit)
	code := runCommand(ctx, args, os.Stdin, os.Stdout, os.Stderr, detectConsole(os.Stdout, os.Stderr, os.Getenv))
	if s := caught.Load(); s != 0 {
		fmt.Fprintln(os.Stderr, "turnstile run: interrupted")
		return 128 + int(s)
	}
	return code
}

// interrupts handles the signals sigs delivers until done closes: the
// first cancels the turn (cancel; the client then cancels it on the
// server, bounded in time) and says so on stderr; the second exits at
// once with 128 + its number. It returns the first signal's number, 0
// until one came.
func interrupts(sigs <-chan os.Signal, done <-chan struct{}, cancel func(), stderr io.Writer, prefix string, exit func(int)) *atomic.Int32 {
	var caught atomic.Int32
	go func() {
		select {
		case s := <-sigs:
			caught.Store(int32(signalNumber(s)))
			fmt.Fprintf(stderr, "%sturnstile run: cancelling the turn (press Ctrl-C again to quit at once)\n", prefix)
			cancel()
		case <-done:
			return
		}
		select {
		case s := <-sigs:
			fmt.Fprintln(stderr, "turnstile run: interrupted")
			exit(128 + signalNumber(s))
		case <-done:
		}
	}()
	return &caught
}

// signalNumber returns s's number, that of SIGINT for a signal that has
// none.
func signalNumber(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return int(n)
	}
	return int(syscall.SIGINT)
}

const runUsage = `Usage: turnstile run [flags] PROMPT...

Runs one agent turn on a turnstile server and streams it: the reply on
stdout as it arrives, notices (retries, fallbacks, resumes) and the final
usage line on stderr. A PROMPT of "-" is read from stdin. Flags may come
before or after the prompt; "--" ends them. The client key of a server
with auth is read from the environment variable TURNSTILE_TOKEN.

Words: a "retry" is the server calling the model again within the turn; a
"resume" is this command running a failed turn again from what it
committed (--retries).

Ctrl-C cancels the turn: the server stops it (with a turn store, it would
otherwise finish it unwatched) and the command renders the turn's last
events, waiting at most 2s for them, then exits 130; a second Ctrl-C exits
at once. A command killed outright (SIGKILL, a lost terminal) only
leaves the turn: a server with a turn store runs it on for
turn.detach_grace.

Approval and steering: a tool the server lists under require_approval
waits for a decision. On a terminal the command shows the tool and its
arguments and asks "Run TOOL? [y/n]" on stderr (a denial may give the
model a reason); --approve=all or none decides every call without
asking, --approve=wait leaves them to another client or the server's
approval timeout (the default when stdin is not a terminal, and with
--json). A line typed while the turn runs (stdin a terminal, or
--steer=on) is sent to it as a steering message, which the turn takes
before its next model call.

Exit codes: 0 the turn completed; 1 it failed and retrying won't help;
2 bad flags or arguments; 3 it failed but may succeed if run again;
128+N it was stopped by signal N (130: Ctrl-C).

--json prints one turnstile.v1.ClientEvent per line, in protojson:
{"attempt":1,"turnId":"…","agent":{…the server's AgentEvent…}} or
{"attempt":1,"turnId":"…","stepRetry":{…}}. The server numbers the events
of each attempt from seq 1 again: (attempt, seq) orders a turn's events.

Flags:
`

// parseInterspersed parses flags wherever they appear among args, as GNU
// tools do, and returns the other arguments in order. "--" ends the flags.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		left := fs.Args()
		// fs.Parse consumes a "--" that ends the flags: what follows is
		// all positional.
		if n := len(args) - len(left); n > 0 && args[n-1] == "--" {
			return append(rest, left...), nil
		}
		if len(left) == 0 {
			return rest, nil
		}
		rest = append(rest, left[0])
		args = left[1:]
	}
}

// runCommand is run with its streams, context and console given, for tests.
func runCommand(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, con console) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, runUsage)
		fs.PrintDefaults()
	}
	defAddr := os.Getenv("TURNSTILE_ADDR")
	if defAddr == "" {
		defAddr = "127.0.0.1:7700"
	}
	addr := fs.String("addr", defAddr, "server `address`: host:port, a comma-separated list of them, or a gRPC target such as dns:///host:port (env TURNSTILE_ADDR)")
	model := fs.String("model", "", "model `alias` (default: the server's default model)")
	system := fs.String("system", "", "system prompt `text`")
	asJSON := fs.Bool("json", false, "print one turnstile.v1.ClientEvent per line as protojson, for scripts")
	timeout := fs.Duration("timeout", 0, "give up after this `duration`, retries and resumes included (default: no limit)")
	retries := fs.Int("retries", 1, "times a failed turn is resumed when the server says it may succeed (0: never)")
	useTLS := fs.Bool("tls", false, "connect over TLS with the system's root certificates (default: plaintext)")
	caFile := fs.String("ca", "", "connect over TLS trusting the CA certificates in this PEM `file`")
	certFile := fs.String("cert", "", "client certificate PEM `file`, for servers that require one (mutual TLS); with --key")
	keyFile := fs.String("key", "", "client certificate's private key PEM `file`")
	approve := fs.String("approve", "", "how to answer tool calls that wait for approval: `ask|all|none|wait` (default: ask when stdin is a terminal, else wait: leave them to another client or the server's timeout)")
	steer := fs.String("steer", steerAuto, "send the lines typed on stdin while the turn runs as steering messages: `auto|on|off` (auto: when stdin is a terminal)")
	var media mediaFlag
	fs.Var(media.image(), "image", "send the image in this `file` with the prompt (PNG, JPEG, GIF, WebP; repeatable)")
	fs.Var(media.file(), "file", "send the document or audio in this `file` with the prompt (PDF, WAV, MP3, or an image; repeatable)")
	gen := addGenFlags(fs)
	words, err := parseInterspersed(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	prompt := strings.TrimSpace(strings.Join(words, " "))
	approveMode, steering, err := hitlModes(*approve, *steer, con.stdinTTY, prompt == "-", *asJSON)
	if err != nil {
		fmt.Fprintf(stderr, "turnstile run: %v\n", err)
		return exitUsage
	}
	if prompt == "-" {
		b, err := io.ReadAll(stdin)
		if err != nil {
			fmt.Fprintf(stderr, "turnstile run: reading the prompt: %v\n", err)
			return exitUsage
		}
		prompt = strings.TrimSpace(string(b))
	}
	switch {
	case prompt == "":
		fmt.Fprintln(stderr, "turnstile run: a prompt is required")
		fs.Usage()
		return exitUsage
	case *retries < 0:
		fmt.Fprintln(stderr, "turnstile run: --retries must not be negative")
		return exitUsage
	case *timeout < 0:
		fmt.Fprintln(stderr, "turnstile run: --timeout must not be negative")
		return exitUsage
	}

	parts, err := media.parts()
	if err != nil {
		fmt.Fprintf(stderr, "turnstile run: %v\n", err)
		return exitUsage
	}

	opts := []client.Option{client.WithMaxStepRetries(*retries)}
	tlsCfg, err := clientTLS(*useTLS, *caFile, *certFile, *keyFile)
	if err != nil {
		fmt.Fprintf(stderr, "turnstile run: %v\n", err)
		return exitUsage
	}
	if tlsCfg != nil {
		opts = append(opts, client.WithTLS(tlsCfg))
	} else {
		opts = append(opts, client.WithInsecure())
	}
	if token := os.Getenv("TURNSTILE_TOKEN"); token != "" {
		opts = append(opts, client.WithBearerToken(token))
	}
	c, err := client.New(*addr, opts...)
	if err != nil {
		fmt.Fprintf(stderr, "turnstile run: %v\n", err)
		return exitUsage
	}
	defer c.Close()

	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	req := &turnstilev1.RunTurnRequest{
		Model:  *model,
		System: *system,
		Messages: []*turnstilev1.Message{{
			Role:  turnstilev1.Role_ROLE_USER,
			Parts: append([]*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: prompt}}}, parts...),
		}},
	}
	if err := gen.apply(req); err != nil {
		fmt.Fprintf(stderr, "turnstile run: %v\n", err)
		return exitUsage
	}
	var (
		in      *lines
		turnOpt []client.TurnOption
	)
	if approveMode == approveAsk || steering {
		// The goroutine that reads stdin writes to stderr too.
		mu := &sync.Mutex{}
		stderr = lockedWriter{mu: mu, w: stderr}
		in = readLines(stdin, nil)
		if fn := approvalFunc(approveMode, &prompter{in: in, w: stderr}); fn != nil {
			turnOpt = append(turnOpt, client.OnApproval(fn))
		}
	} else if fn := approvalFunc(approveMode, nil); fn != nil {
		turnOpt = append(turnOpt, client.OnApproval(fn))
	}
	turn := c.RunTurn(ctx, req, turnOpt...)
	if steering {
		in.setSteer(steerer(ctx, turn, stderr))
	}

	var r eventRenderer
	if *asJSON {
		r = &jsonRenderer{out: stdout, turnID: turn.ID()}
	} else {
		r = newTextRenderer(stdout, stderr, con)
	}
	defer r.close()
	for ev, err := range turn.Events() {
		if err != nil {
			break
		}
		if err := r.render(ev); err != nil {
			// stdout is gone (a closed pipe): stop the turn.
			fmt.Fprintf(stderr, "turnstile run: %v\n", err)
			return exitPermanent
		}
	}
	if res := turn.Result(); res != nil {
		r.done(res)
		return exitOK
	}
	r.close()
	if errors.Is(ctx.Err(), context.Canceled) {
		// The caller (Ctrl-C) stopped the turn: it knows why.
		return exitPermanent
	}
	var te *client.TurnError
	if !errors.As(turn.Err(), &te) {
		fmt.Fprintf(stderr, "turnstile run: %v\n", turn.Err())
		return exitPermanent
	}
	fmt.Fprintf(stderr, "turnstile run: %s\n", describeFailure(te))
	if te.Retryable {
		return exitRetryable
	}
	return exitPermanent
}

// clientTLS returns the TLS configuration the flags ask for, nil for
// plaintext.
func clientTLS(useTLS bool, caFile, certFile, keyFile string) (*tls.Config, error) {
	if !useTLS && caFile == "" && certFile == "" && keyFile == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca: no PEM certificate in %s", caFile)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("--cert and --key go together")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("--cert, --key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// describeFailure says what failed, how often the turn was resumed and
// what to do.
func describeFailure(te *client.TurnError) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", client.CodeName(te.Code), te.Message)
	if te.Model != "" {
		fmt.Fprintf(&b, " (model %s)", te.Model)
	}
	if te.Attempts > 1 {
		fmt.Fprintf(&b, "; gave up after %s", plural(te.Attempts-1, "resume"))
	}
	if te.Retryable {
		b.WriteString("; it may succeed if run again")
		if te.RetryAfter > 0 {
			fmt.Fprintf(&b, " after %s", roundDelay(te.RetryAfter))
		}
	}
	if te.TurnID != "" {
		fmt.Fprintf(&b, " [turn %s]", te.TurnID)
	}
	return b.String()
}

func roundDelay(d time.Duration) time.Duration {
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond)
	case d >= 10*time.Second:
		return d.Round(time.Second)
	case d >= time.Second:
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	if strings.HasSuffix(what, "y") {
		return fmt.Sprintf("%d %sies", n, strings.TrimSuffix(what, "y"))
	}
	return fmt.Sprintf("%d %ss", n, what)
}
