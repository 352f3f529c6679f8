package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// run is "turnstile run": it runs one turn and renders it for a person, or
// as JSON lines for a script.
func run(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runCommand(ctx, args, os.Stdin, os.Stdout, os.Stderr)
}

const runUsage = `Usage: turnstile run [flags] PROMPT...

Runs one agent turn on a turnstile server and streams it: the reply on
stdout as it arrives, notices (retries, fallbacks) and the final usage line
on stderr. A PROMPT of "-" is read from stdin. The client key of a server
with auth is read from the environment variable TURNSTILE_TOKEN.

Exit codes: 0 the turn completed; 1 it failed and retrying won't help;
2 bad flags or arguments; 3 it failed but may succeed if run again.

Flags:
`

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

// runCommand is run with its streams and context given, for tests.
func runCommand(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
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
	asJSON := fs.Bool("json", false, "print one event per line as protojson, for scripts")
	timeout := fs.Duration("timeout", 0, "give up after this `duration`, retries included (default: no limit)")
	retries := fs.Int("retries", 1, "times a failed step is run again when the server says it may succeed (0: never)")
	useTLS := fs.Bool("tls", false, "connect over TLS with the system's root certificates (default: plaintext)")
	caFile := fs.String("ca", "", "connect over TLS trusting the CA certificates in this PEM `file`")
	certFile := fs.String("cert", "", "client certificate PEM `file`, for servers that require one (mutual TLS); with --key")
	keyFile := fs.String("key", "", "client certificate's private key PEM `file`")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	prompt := strings.TrimSpace(strings.Join(fs.Args(), " "))
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
			Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: prompt}}},
		}},
	}
	turn := c.RunTurn(ctx, req)

	var r eventRenderer
	if *asJSON {
		r = &jsonRenderer{out: stdout}
	} else {
		r = newTextRenderer(stdout, stderr)
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

// describeFailure says what failed, how often and what to do.
func describeFailure(te *client.TurnError) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", client.CodeName(te.Code), te.Message)
	if te.Model != "" {
		fmt.Fprintf(&b, " (model %s)", te.Model)
	}
	if te.Attempts > 1 {
		fmt.Fprintf(&b, "; gave up after %d attempts", te.Attempts)
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

// eventRenderer shows a turn's events.
type eventRenderer interface {
	render(ev *client.Event) error
	done(res *client.Result)
	close()
}

// jsonRenderer prints each event as one line of protojson. The client's
// own step-retry signal is a line {"stepRetry": {...}} in the same style.
type jsonRenderer struct{ out io.Writer }

func (j *jsonRenderer) render(ev *client.Event) error {
	var line []byte
	var err error
	switch {
	case ev.Agent != nil:
		line, err = protojson.Marshal(ev.Agent)
	case ev.StepRetry != nil:
		sr := ev.StepRetry
		line, err = json.Marshal(map[string]any{"stepRetry": map[string]any{
			"attempt":        sr.Attempt,
			"maxAttempts":    sr.MaxAttempts,
			"delay":          fmt.Sprintf("%.3fs", sr.Delay.Seconds()),
			"code":           sr.Err.Code.String(),
			"message":        sr.Err.Message,
			"discardPartial": sr.DiscardPartial,
			"turnId":         sr.Err.TurnID,
		}})
	default:
		return nil
	}
	if err != nil {
		return fmt.Errorf("encoding an event: %w", err)
	}
	_, err = fmt.Fprintf(j.out, "%s\n", line)
	return err
}

func (j *jsonRenderer) done(*client.Result) {}
func (j *jsonRenderer) close()              {}

// ANSI sequences, used only on terminals.
const (
	ansiDim    = "\x1b[2m"
	ansiYellow = "\x1b[33m"
	ansiReset  = "\x1b[0m"
)

// textRenderer renders a turn for a person: text as it arrives, thinking
// dimmed, tool calls and results, notices on stderr.
type textRenderer struct {
	out, errw io.Writer
	color     bool // stdout is a terminal
	errColor  bool // stderr is a terminal
	spin      *spinner
	mode      string // what stdout shows last: "", "text", "thinking", "tool"
	midLine   bool   // stdout's last line is not ended
	anyOutput bool
}

func newTextRenderer(stdout, stderr io.Writer) *textRenderer {
	r := &textRenderer{out: stdout, errw: stderr, color: isTerminal(stdout), errColor: isTerminal(stderr)}
	if r.errColor {
		r.spin = &spinner{w: stderr}
		r.spin.start("waiting for the model")
	}
	return r
}

func (r *textRenderer) render(ev *client.Event) error {
	if sr := ev.StepRetry; sr != nil {
		msg := fmt.Sprintf("attempt %d failed: %s: %s; resuming the turn in %s (attempt %d of %d)",
			sr.Attempt-1, client.CodeName(sr.Err.Code), sr.Err.Message, roundDelay(sr.Delay), sr.Attempt, sr.MaxAttempts)
		if sr.DiscardPartial {
			msg += "; the partial output above is discarded"
		}
		r.notice(msg)
		r.waiting()
		return nil
	}
	a := ev.Agent
	switch p := a.GetPayload().(type) {
	case *turnstilev1.AgentEvent_TextDelta:
		return r.write("text", p.TextDelta.GetText())
	case *turnstilev1.AgentEvent_ThinkingDelta:
		return r.write("thinking", p.ThinkingDelta.GetText())
	case *turnstilev1.AgentEvent_ToolCallDelta:
		r.stopSpinner()
	case *turnstilev1.AgentEvent_ToolStarted:
		t := p.ToolStarted
		if err := r.line("tool", fmt.Sprintf("⚙ %s(%s)", t.GetName(), clip(t.GetArguments(), 200))); err != nil {
			return err
		}
		r.waiting()
	case *turnstilev1.AgentEvent_ToolFinished:
		t := p.ToolFinished
		label := "↳"
		if t.GetIsError() {
			label = "↳ error:"
		}
		if err := r.line("tool", fmt.Sprintf("  %s %s (%s)", label, clip(t.GetContent(), 300), roundDelay(t.GetDuration().AsDuration()))); err != nil {
			return err
		}
		r.waiting()
	case *turnstilev1.AgentEvent_Retry:
		e := p.Retry
		msg := fmt.Sprintf("model %s: %s: %s; retrying in %s (attempt %d of %d)",
			e.GetModel(), client.CodeName(e.GetReason()), e.GetMessage(), roundDelay(e.GetDelay().AsDuration()), e.GetAttempt(), e.GetMaxAttempts())
		if e.GetDiscardPartial() {
			msg += "; the partial output above is discarded"
		}
		r.notice(msg)
		r.waiting()
	case *turnstilev1.AgentEvent_Fallback:
		e := p.Fallback
		msg := fmt.Sprintf("model %s: %s: %s; falling back to model %s", e.GetFromModel(), client.CodeName(e.GetReason()), e.GetMessage(), e.GetToModel())
		if e.GetDiscardPartial() {
			msg += "; the partial output above is discarded"
		}
		r.notice(msg)
		r.waiting()
	case *turnstilev1.AgentEvent_Compaction:
		e := p.Compaction
		r.notice(fmt.Sprintf("the conversation was compacted (%s): %d → %d messages", e.GetStrategy(), e.GetMessagesBefore(), e.GetMessagesAfter()))
	}
	return nil
}

// write appends a fragment of kind mode ("text" or "thinking") to stdout.
func (r *textRenderer) write(mode, s string) error {
	if s == "" {
		return nil
	}
	r.stopSpinner()
	var b strings.Builder
	if r.mode != mode {
		if r.midLine {
			b.WriteString("\n")
		}
		if r.anyOutput {
			b.WriteString("\n")
		}
		if mode == "thinking" && !r.color {
			b.WriteString("thinking: ")
		}
	}
	if mode == "thinking" && r.color {
		b.WriteString(ansiDim + s + ansiReset)
	} else {
		b.WriteString(s)
	}
	r.mode, r.anyOutput = mode, true
	r.midLine = !strings.HasSuffix(s, "\n")
	_, err := io.WriteString(r.out, b.String())
	return err
}

// line writes a whole line of kind mode to stdout, dimmed on a terminal.
func (r *textRenderer) line(mode, s string) error {
	r.stopSpinner()
	var b strings.Builder
	if r.midLine {
		b.WriteString("\n")
	}
	if r.mode != mode && r.anyOutput {
		b.WriteString("\n")
	}
	if r.color {
		s = ansiDim + s + ansiReset
	}
	b.WriteString(s + "\n")
	r.mode, r.midLine, r.anyOutput = mode, false, true
	_, err := io.WriteString(r.out, b.String())
	return err
}

// notice writes a line to stderr, ending stdout's line first.
func (r *textRenderer) notice(msg string) {
	r.stopSpinner()
	if r.midLine {
		_, _ = io.WriteString(r.out, "\n")
		r.midLine = false
	}
	if r.errColor {
		msg = ansiYellow + msg + ansiReset
	}
	fmt.Fprintf(r.errw, "turnstile: %s\n", msg)
}

func (r *textRenderer) waiting() {
	if r.spin != nil {
		r.spin.start("waiting for the model")
	}
}

func (r *textRenderer) stopSpinner() {
	if r.spin != nil {
		r.spin.stop()
	}
}

// done ends stdout's line and prints the usage line on stderr.
func (r *textRenderer) done(res *client.Result) {
	r.close()
	u, c := res.Usage, res.Counters
	line := fmt.Sprintf("%s · %s in, %s out",
		strings.ToLower(strings.TrimPrefix(res.EndReason.String(), "END_REASON_")),
		plural(int(u.GetInputTokens()), "token"), plural(int(u.GetOutputTokens()), "token"))
	if n := u.GetCacheReadTokens(); n > 0 {
		line += fmt.Sprintf(" (%d cached)", n)
	}
	line += " · " + plural(int(c.GetModelCalls()), "model call")
	if n := c.GetToolCalls(); n > 0 {
		line += " · " + plural(int(n), "tool call")
	}
	if n := c.GetRetries(); n > 0 {
		line += " · " + plural(int(n), "retry")
	}
	if n := c.GetFallbacks(); n > 0 {
		line += " · " + plural(int(n), "fallback")
	}
	if res.Attempts > 1 {
		line += fmt.Sprintf(" · %d attempts", res.Attempts)
	}
	if r.errColor {
		line = ansiDim + line + ansiReset
	}
	fmt.Fprintln(r.errw, line)
}

// close stops the spinner and ends stdout's line; it may be called again.
func (r *textRenderer) close() {
	r.stopSpinner()
	if r.midLine {
		_, _ = io.WriteString(r.out, "\n")
		r.midLine = false
	}
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

// clip shortens s to n runes on one line.
func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// spinner animates a line on a terminal until stopped. start and stop may
// be called repeatedly, from one goroutine.
type spinner struct {
	w       io.Writer
	mu      sync.Mutex
	stopped chan struct{} // closed to stop the running animation
	exited  chan struct{} // closed when it has cleared its line
}

func (s *spinner) start(label string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped != nil {
		return
	}
	s.stopped, s.exited = make(chan struct{}), make(chan struct{})
	go func(stopped, exited chan struct{}) {
		defer close(exited)
		frames := []rune("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			fmt.Fprintf(s.w, "\r%c %s…", frames[i%len(frames)], label)
			select {
			case <-stopped:
				fmt.Fprint(s.w, "\r\x1b[K")
				return
			case <-tick.C:
			}
		}
	}(s.stopped, s.exited)
}

func (s *spinner) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped == nil {
		return
	}
	close(s.stopped)
	<-s.exited
	s.stopped, s.exited = nil, nil
}
