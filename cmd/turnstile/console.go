package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/rivo/uniseg"
	"golang.org/x/term"
)

// console says what the command's stdout and stderr are, so the text
// renderer styles and wraps only what a person reads on a terminal.
type console struct {
	tty      bool // stdout is a terminal
	color    bool // stdout: ANSI styles
	errColor bool // stderr: ANSI styles
	spinner  bool // stderr may animate a line
	width    int  // stdout's width in columns; 0: no wrapping
	errWidth int  // stderr's width in columns; 0: no wrapping
	stdinTTY bool // stdin is a terminal: a person can answer questions and steer
}

// detectConsole looks at the streams and the environment: styles only on a
// terminal (a real one: /dev/null is a character device, not a terminal),
// never with NO_COLOR set (https://no-color.org) or TERM=dumb, which also
// rules out the spinner's cursor movements; wrapping the reply and the
// notices at their terminal's width.
func detectConsole(stdout, stderr *os.File, getenv func(string) string) console {
	outTTY, errTTY := isTerminal(stdout), isTerminal(stderr)
	dumb := getenv("TERM") == "dumb"
	styled := getenv("NO_COLOR") == "" && !dumb
	c := console{tty: outTTY, color: outTTY && styled, errColor: errTTY && styled, spinner: errTTY && !dumb}
	c.width, c.errWidth = termWidth(stdout, outTTY), termWidth(stderr, errTTY)
	c.stdinTTY = isTerminal(os.Stdin)
	return c
}

// termWidth returns the width of the terminal f, or 0.
func termWidth(f *os.File, tty bool) int {
	if !tty {
		return 0
	}
	w, _, err := term.GetSize(int(f.Fd()))
	if err != nil || w <= 0 {
		return 0
	}
	return w
}

func isTerminal(f *os.File) bool { return f != nil && term.IsTerminal(int(f.Fd())) }

// wrapper writes streamed text to a line of width display columns,
// breaking lines where Unicode's line breaking rules (UAX #14) allow: after
// the spaces between words, and between the characters of Chinese or
// Japanese text, which has none. A segment that would overflow the line
// starts the next one; one wider than a line is written whole. Columns are
// counted per grapheme cluster, as a terminal draws them: two for East
// Asian wide characters and emoji, none for combining marks (rivo/uniseg).
// It holds back the text after the last break opportunity until the next
// one is known, so a cluster or a word split across chunks is measured
// whole.
type wrapper struct {
	width int    // 0: no wrapping
	col   int    // columns written on the current line
	held  string // the text after the last break opportunity, not yet written
	state int    // the line breaking state at the start of held; -1 at the start
}

// text appends s and returns what to write now; style wraps each visible
// piece (ANSI on, off), or is empty.
func (w *wrapper) text(s string, on, off string) string {
	if w.width <= 0 {
		if i := strings.LastIndexByte(s, '\n'); i >= 0 {
			w.col = uniseg.StringWidth(s[i+1:])
		} else {
			w.col += uniseg.StringWidth(s)
		}
		if s == "" {
			return ""
		}
		return on + s + off
	}
	if w.held == "" {
		w.state = -1
	}
	w.held += s
	var b strings.Builder
	for {
		seg, rest, _, state := uniseg.FirstLineSegmentInString(w.held, w.state)
		if rest == "" {
			// The last segment may go on in the next chunk.
			break
		}
		w.place(&b, seg, on, off)
		w.held, w.state = rest, state
	}
	return b.String()
}

// place writes seg, a segment after which the line may be broken, on the
// current line or, when it does not fit there, on the next.
func (w *wrapper) place(b *strings.Builder, seg, on, off string) {
	piece := func(p string) {
		if p != "" {
			b.WriteString(on + p + off)
		}
	}
	body := seg
	hard := uniseg.HasTrailingLineBreakInString(seg)
	if hard {
		body = strings.TrimRight(seg, "\r\n")
	}
	word := strings.TrimRightFunc(body, unicode.IsSpace)
	if ww := uniseg.StringWidth(word); ww > 0 {
		if w.col > 0 && w.col+ww > w.width {
			b.WriteByte('\n')
			w.col = 0
		}
		piece(word)
		w.col += ww
	}
	// Spaces that reach the line's end end it instead.
	for _, r := range body[len(word):] {
		if w.col >= w.width {
			b.WriteByte('\n')
			w.col = 0
			continue
		}
		piece(string(r))
		w.col += uniseg.StringWidth(string(r))
	}
	if hard {
		if rest := seg[len(body):]; rest != "" {
			b.WriteString(rest)
		} else {
			b.WriteByte('\n')
		}
		w.col = 0
	}
}

// flush returns the held-back text, laid out as the end of the text.
func (w *wrapper) flush(on, off string) string {
	if w.held == "" {
		return ""
	}
	var b strings.Builder
	w.place(&b, w.held, on, off)
	w.held = ""
	return b.String()
}

// newline records that a line was ended outside the wrapper.
func (w *wrapper) newline() { w.col, w.held = 0, "" }

// midLine reports whether the current line has anything on it.
func (w *wrapper) midLine() bool { return w.col > 0 || w.held != "" }

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
