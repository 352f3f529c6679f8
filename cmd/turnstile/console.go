package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

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

// wrapper writes streamed text to a line of width columns, breaking lines
// at word boundaries: a word that would overflow the line starts the next
// one. It holds back the word being written until its end is known. Words
// longer than a line are written whole. It counts runes as columns.
type wrapper struct {
	width int // 0: no wrapping
	col   int // columns written on the current line
	word  []rune
}

// text appends s and returns what to write now; style wraps each visible
// piece (ANSI on, off), or is empty.
func (w *wrapper) text(s string, on, off string) string {
	var b strings.Builder
	piece := func(p string) {
		if p == "" {
			return
		}
		b.WriteString(on + p + off)
	}
	if w.width <= 0 {
		piece(s)
		if i := strings.LastIndexByte(s, '\n'); i >= 0 {
			w.col = utf8.RuneCountInString(s[i+1:])
		} else {
			w.col += utf8.RuneCountInString(s)
		}
		return b.String()
	}
	for _, r := range s {
		switch {
		case r == '\n':
			piece(w.takeWord())
			b.WriteByte('\n')
			w.col = 0
		case unicode.IsSpace(r):
			piece(w.takeWord())
			if w.col >= w.width {
				b.WriteByte('\n')
				w.col = 0
				continue
			}
			piece(string(r))
			w.col++
		default:
			if w.col > 0 && w.col+len(w.word)+1 > w.width {
				// The word no longer fits the line: it starts the next.
				b.WriteByte('\n')
				w.col = 0
			}
			w.word = append(w.word, r)
		}
	}
	return b.String()
}

// flush returns the held-back word, to be written as is.
func (w *wrapper) flush(on, off string) string {
	if len(w.word) == 0 {
		return ""
	}
	return on + w.takeWord() + off
}

func (w *wrapper) takeWord() string {
	s := string(w.word)
	w.col += len(w.word)
	w.word = w.word[:0]
	return s
}

// newline records that a line was ended outside the wrapper.
func (w *wrapper) newline() { w.col, w.word = 0, w.word[:0] }

// midLine reports whether the current line has anything on it.
func (w *wrapper) midLine() bool { return w.col > 0 || len(w.word) > 0 }

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
