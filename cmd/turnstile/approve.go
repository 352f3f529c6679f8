package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// How "turnstile run" answers the tool calls that wait for approval
// (--approve).
const (
	approveAsk  = "ask"  // on the terminal, y/n
	approveAll  = "all"  // approve every call
	approveNone = "none" // deny every call
	approveWait = "wait" // leave them to another client or the server's timeout
)

// How "turnstile run" steers a running turn (--steer).
const (
	steerAuto = "auto" // stdin's lines, when stdin is a terminal
	steerOn   = "on"   // stdin's lines, whatever stdin is
	steerOff  = "off"  // never
)

// deniedUnattended is the reason given with --approve=none.
const deniedUnattended = "denied by turnstile run --approve=none"

// hitlModes resolves --approve and --steer against what stdin is (a
// terminal or not, or taken by the prompt "-") and --json: by default the
// command asks and steers on a terminal unless its output is for a
// script; asking without a terminal is an error.
func hitlModes(approve, steer string, stdinTTY, promptFromStdin, asJSON bool) (string, bool, error) {
	interactive := stdinTTY && !promptFromStdin
	switch approve {
	case "":
		approve = approveWait
		if interactive && !asJSON {
			approve = approveAsk
		}
	case approveAsk:
		if !interactive {
			return "", false, errors.New(`--approve=ask needs stdin to be a terminal (and the prompt not read from it); use --approve=all, none or wait`)
		}
	case approveAll, approveNone, approveWait:
	default:
		return "", false, fmt.Errorf("--approve: %q is not one of ask, all, none, wait", approve)
	}
	var steering bool
	switch steer {
	case steerAuto:
		steering = interactive && !asJSON
	case steerOn:
		if promptFromStdin {
			return "", false, errors.New(`--steer=on reads stdin, which the prompt "-" takes`)
		}
		steering = true
	case steerOff:
	default:
		return "", false, fmt.Errorf("--steer: %q is not one of auto, on, off", steer)
	}
	return approve, steering, nil
}

// approvalFunc returns the client's approval hook for mode, or nil when
// the command leaves the calls to others (wait).
func approvalFunc(mode string, p *prompter) client.ApprovalFunc {
	switch mode {
	case approveAll:
		return func(context.Context, *turnstilev1.ToolApprovalRequested) (client.Decision, error) {
			return client.Decision{Approved: true, Reason: "approved by turnstile run --approve=all"}, nil
		}
	case approveNone:
		return func(context.Context, *turnstilev1.ToolApprovalRequested) (client.Decision, error) {
			return client.Decision{Reason: deniedUnattended}, nil
		}
	case approveAsk:
		return p.ask
	}
	return nil
}

// lines reads stdin line by line on a goroutine of its own and hands each
// line either to the question being asked (a session, which may ask more
// than once) or, when none is, to steer. It stops at stdin's end or
// error.
type lines struct {
	mu    sync.Mutex
	cur   *session // the question being asked, or nil
	steer func(string)
	done  chan struct{} // closed at stdin's end
}

// session is one question and its follow-ups: the lines typed while it
// lasts are its answers.
type session struct {
	answers chan string
	ended   chan struct{}
}

// readLines starts reading r; steer receives the lines typed while no
// question is asked (nil drops them).
func readLines(r io.Reader, steer func(string)) *lines {
	l := &lines{steer: steer, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 0, 4096), 64<<10)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			l.mu.Lock()
			cur, steer := l.cur, l.steer
			l.mu.Unlock()
			if cur != nil {
				select {
				case cur.answers <- line:
					continue
				case <-cur.ended:
					// Typed after the question's last answer.
				}
			}
			if line != "" && steer != nil {
				steer(line)
			}
		}
	}()
	return l
}

// setSteer sets the function that receives the lines typed while no
// question is asked.
func (l *lines) setSteer(steer func(string)) {
	l.mu.Lock()
	l.steer = steer
	l.mu.Unlock()
}

// begin starts a question: the lines typed until end are its answers.
func (l *lines) begin() *session {
	s := &session{answers: make(chan string), ended: make(chan struct{})}
	l.mu.Lock()
	l.cur = s
	l.mu.Unlock()
	return s
}

// end ends the question s.
func (l *lines) end(s *session) {
	l.mu.Lock()
	if l.cur == s {
		l.cur = nil
	}
	l.mu.Unlock()
	close(s.ended)
}

// next waits for the next line typed for s; it fails when stdin ends or
// ctx does.
func (l *lines) next(ctx context.Context, s *session) (string, error) {
	select {
	case line := <-s.answers:
		return line, nil
	case <-l.done:
		return "", errors.New("stdin ended before an answer")
	case <-ctx.Done():
		return "", context.Cause(ctx)
	}
}

// prompter asks a person about each tool call that waits for approval:
// the tool, its arguments and preview on w, y or n from the lines, and
// for a denial an optional reason.
type prompter struct {
	in *lines
	w  io.Writer // stderr, shared with the renderer through a lockedWriter
}

func (p *prompter) printf(format string, a ...any) { fmt.Fprintf(p.w, format, a...) }

// ask is the approval hook of --approve=ask.
func (p *prompter) ask(ctx context.Context, req *turnstilev1.ToolApprovalRequested) (client.Decision, error) {
	p.printf("turnstile: the model wants to run %s\n  arguments: %s\n", req.GetName(), clip(req.GetArguments(), 2000))
	if pv := req.GetPreview(); pv != "" {
		p.printf("  preview: %s\n", clip(pv, 2000))
	}
	s := p.in.begin()
	defer p.in.end(s)
	for {
		p.printf("Run %s? [y/n] ", req.GetName())
		answer, err := p.in.next(ctx, s)
		if err != nil {
			p.printf("\n")
			return client.Decision{}, err
		}
		switch strings.ToLower(answer) {
		case "y", "yes":
			return client.Decision{Approved: true}, nil
		case "n", "no":
			p.printf("Reason for the model (optional, Enter to skip): ")
			reason, err := p.in.next(ctx, s)
			if err != nil {
				p.printf("\n")
				return client.Decision{}, err
			}
			return client.Decision{Reason: reason}, nil
		}
		p.printf("Please answer y or n.\n")
	}
}

// lockedWriter serializes the writes of the renderer and of the goroutine
// that reads stdin, which share stderr.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// steerer returns the function that sends a line typed while the turn
// runs to it with SteerTurn, and says on w what went wrong.
func steerer(ctx context.Context, turn *client.Turn, w io.Writer) func(string) {
	return func(line string) {
		err := turn.Steer(ctx, line)
		switch {
		case err == nil:
		case errors.Is(err, client.ErrNotStarted):
			fmt.Fprintln(w, "turnstile: not sent: the turn has not started yet")
		default:
			fmt.Fprintf(w, "turnstile: not sent: %v\n", err)
		}
	}
}
