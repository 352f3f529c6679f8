package main

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rivo/uniseg"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// openPTY returns the terminal side of a new pseudo-terminal of cols
// columns: a real terminal, as a person's shell gives the command.
func openPTY(t *testing.T, cols uint16) *os.File {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { master.Close() })
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	tty, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tty.Close() })
	if err := unix.IoctlSetWinsize(int(tty.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: 24}); err != nil {
		t.Fatal(err)
	}
	return tty
}

func TestDetectConsole(t *testing.T) {
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	tty := openPTY(t, 40)
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	for _, tt := range []struct {
		name           string
		stdout, stderr *os.File
		getenv         func(string) string
		want           console
	}{
		{"a terminal", tty, tty, env("TERM", "xterm-256color"), console{tty: true, color: true, errColor: true, spinner: true, width: 40, errWidth: 40}},
		{"/dev/null is no terminal", devnull, devnull, env("TERM", "xterm"), console{}},
		{"stdout piped", devnull, tty, env(), console{errColor: true, spinner: true, errWidth: 40}},
		{"NO_COLOR", tty, tty, env("NO_COLOR", "1"), console{tty: true, spinner: true, width: 40, errWidth: 40}},
		{"TERM=dumb", tty, tty, env("TERM", "dumb"), console{tty: true, width: 40, errWidth: 40}},
	} {
		if got := detectConsole(tt.stdout, tt.stderr, tt.getenv); got != tt.want {
			t.Errorf("%s: %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

func TestWrapper(t *testing.T) {
	for _, tt := range []struct {
		width  int
		chunks []string
		want   string
	}{
		{0, []string{"no wrapping without a width at all"}, "no wrapping without a width at all"},
		{10, []string{"hello world again"}, "hello \nworld \nagain"},
		{10, []string{"hel", "lo wo", "rld ag", "ain"}, "hello \nworld \nagain"},
		{12, []string{"one two three four"}, "one two \nthree four"},
		{8, []string{"a verylongword here"}, "a \nverylongword\nhere"},
		{10, []string{"line one\nline two"}, "line one\nline two"},
		{6, []string{"ab cd ef gh"}, "ab cd \nef gh"},
	} {
		w := wrapper{width: tt.width}
		var b strings.Builder
		for _, c := range tt.chunks {
			b.WriteString(w.text(c, "", ""))
		}
		b.WriteString(w.flush("", ""))
		if got := b.String(); got != tt.want {
			t.Errorf("width %d, %q: %q, want %q", tt.width, tt.chunks, got, tt.want)
		}
	}
}

// TestWrapperDisplayWidth wraps wide characters and emoji at a narrow
// width: each takes two columns, a grapheme cluster (an emoji sequence
// joined by ZWJ, a letter and its combining accent) is measured whole even
// when a chunk ends inside it, Japanese text, which has no spaces, breaks
// between its characters where Unicode allows, and no line is wider than
// the terminal.
func TestWrapperDisplayWidth(t *testing.T) {
	family := "\U0001F468\u200D\U0001F469\u200D\U0001F467" // one cluster, two columns
	for _, tt := range []struct {
		name   string
		width  int
		chunks []string
		want   string
	}{
		{"japanese", 10, []string{"日本語のテキストを折り返す"}, "日本語のテ\nキストを折\nり返す"},
		{"japanese in chunks", 10, []string{"日本", "語のテキ", "ストを折り返す"}, "日本語のテ\nキストを折\nり返す"},
		{"japanese punctuation stays on its line", 8, []string{"こんにちは。世界"}, "こんにち\nは。世界"},
		{"mixed", 12, []string{"turnstile は速い"}, "turnstile は\n速い"},
		{"emoji", 8, []string{"👍👍 ok " + family + " fine"}, "👍👍 ok \n" + family + " fine"},
		{"cluster split across chunks", 8, []string{"👍👍 ok \U0001F468\u200D", "\U0001F469\u200D\U0001F467 fine"}, "👍👍 ok \n" + family + " fine"},
		{"combining accent", 6, []string{"cafe\u0301 cafe\u0301"}, "cafe\u0301 \ncafe\u0301"},
		{"a wide character fills the line", 5, []string{"ab 日本"}, "ab 日\n本"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := wrapper{width: tt.width}
			var b strings.Builder
			for _, c := range tt.chunks {
				b.WriteString(w.text(c, "", ""))
			}
			b.WriteString(w.flush("", ""))
			got := b.String()
			if got != tt.want {
				t.Errorf("%q at width %d:\n%s\nwant\n%s", tt.chunks, tt.width, got, tt.want)
			}
			for _, line := range strings.Split(got, "\n") {
				if n := uniseg.StringWidth(strings.TrimRight(line, " ")); n > tt.width {
					t.Errorf("line %q is %d columns wide, more than %d", line, n, tt.width)
				}
			}
		})
	}
}

func agent(p any) *client.Event {
	ev := &turnstilev1.AgentEvent{}
	switch p := p.(type) {
	case *turnstilev1.TextDelta:
		ev.Payload = &turnstilev1.AgentEvent_TextDelta{TextDelta: p}
	case *turnstilev1.ToolCallDelta:
		ev.Payload = &turnstilev1.AgentEvent_ToolCallDelta{ToolCallDelta: p}
	case *turnstilev1.ToolStarted:
		ev.Payload = &turnstilev1.AgentEvent_ToolStarted{ToolStarted: p}
	case *turnstilev1.ToolProgress:
		ev.Payload = &turnstilev1.AgentEvent_ToolProgress{ToolProgress: p}
	case *turnstilev1.ToolFinished:
		ev.Payload = &turnstilev1.AgentEvent_ToolFinished{ToolFinished: p}
	case *turnstilev1.MessageCompleted:
		ev.Payload = &turnstilev1.AgentEvent_MessageCompleted{MessageCompleted: p}
	case *turnstilev1.Retry:
		ev.Payload = &turnstilev1.AgentEvent_Retry{Retry: p}
	case *turnstilev1.LlmCallStarted:
		ev.Payload = &turnstilev1.AgentEvent_LlmCallStarted{LlmCallStarted: p}
	case *turnstilev1.LlmCallFinished:
		ev.Payload = &turnstilev1.AgentEvent_LlmCallFinished{LlmCallFinished: p}
	default:
		panic("unknown payload")
	}
	return &client.Event{Attempt: 1, Agent: ev}
}

func renderAll(t *testing.T, con console, evs ...*client.Event) (string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	r := newTextRenderer(&out, &errOut, con)
	for _, ev := range evs {
		if err := r.render(ev); err != nil {
			t.Fatal(err)
		}
	}
	r.close()
	return out.String(), errOut.String()
}

func toolCallMessage(id, name, args string) *turnstilev1.MessageCompleted {
	return &turnstilev1.MessageCompleted{Message: &turnstilev1.Message{
		Role:  turnstilev1.Role_ROLE_ASSISTANT,
		Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_ToolCall{ToolCall: &turnstilev1.ToolCall{Id: id, Name: name, Arguments: args}}}},
	}}
}

func TestTextRendererTools(t *testing.T) {
	out, _ := renderAll(t, console{},
		agent(toolCallMessage("call_1", "fetch", `{"url":"a"}`)),
		agent(&turnstilev1.ToolStarted{CallId: "call_1", Name: "fetch", Arguments: `{"url":"a"}`}),
		agent(&turnstilev1.ToolProgress{CallId: "call_1", Name: "fetch", Message: "downloading", Progress: 3, Total: 10}),
		agent(&turnstilev1.ToolProgress{CallId: "call_1", Name: "fetch", Progress: 7}),
		agent(toolCallMessage("call_2", "nope", `{"x":1}`)),
		// An unknown tool is never started: only its error result comes.
		agent(&turnstilev1.ToolFinished{CallId: "call_2", Name: "nope", Content: `unknown tool "nope"`, IsError: true}),
		agent(&turnstilev1.ToolFinished{CallId: "call_1", Name: "fetch", Content: "done", Duration: durationpb.New(12 * time.Millisecond)}),
	)
	want := `⚙ fetch({"url":"a"})
  … fetch: downloading (3 of 10)
  … fetch (7)
⚙ nope({"x":1})
  ↳ nope error: unknown tool "nope"
  ↳ fetch: done (12ms)
`
	if out != want {
		t.Errorf("stdout =\n%s\nwant\n%s", out, want)
	}
}

// The discard notice speaks of output above only when some was shown.
func TestTextRendererDiscardOnlyWhatWasShown(t *testing.T) {
	retry := &turnstilev1.Retry{Attempt: 2, MaxAttempts: 3, Model: "m", Reason: turnstilev1.ErrorCode_ERROR_CODE_OVERLOADED, Message: "Overloaded", DiscardPartial: true, DiscardFromSeq: 3}
	_, errOut := renderAll(t, console{},
		agent(&turnstilev1.ToolCallDelta{Index: 0, CallId: "c", Name: "t", ArgumentsDelta: `{"a":`}),
		agent(retry),
	)
	if strings.Contains(errOut, "discarded") {
		t.Errorf("only a tool call delta was streamed (not shown), yet: %q", errOut)
	}
	_, errOut = renderAll(t, console{},
		agent(&turnstilev1.TextDelta{Text: "Half a"}),
		agent(retry),
	)
	if !strings.Contains(errOut, "; the partial output above is discarded") {
		t.Errorf("text was shown, but: %q", errOut)
	}
	// A step retry that drops a committed message whose text was shown.
	_, errOut = renderAll(t, console{},
		agent(&turnstilev1.TextDelta{Text: "Let me look."}),
		agent(toolCallMessage("call_1", "deploy", "{}")),
		agent(&turnstilev1.ToolCallDelta{Index: 0, CallId: "c"}),
		&client.Event{Attempt: 1, StepRetry: &client.StepRetry{Attempt: 2, MaxAttempts: 2, Err: &client.TurnError{Code: turnstilev1.ErrorCode_ERROR_CODE_UNAVAILABLE, Message: "gone"}, DiscardPartial: true}},
	)
	if !strings.Contains(errOut, "turnstile: UNAVAILABLE: gone; resuming the turn in 0s (resume 1 of 1); the partial output above is discarded") {
		t.Errorf("step retry notice: %q", errOut)
	}
}

// A reply cut at the output token limit and continued says so.
func TestTextRendererMaxTokensContinued(t *testing.T) {
	_, errOut := renderAll(t, console{},
		agent(&turnstilev1.TextDelta{Text: "The beginning"}),
		agent(&turnstilev1.LlmCallFinished{Model: "m", StopReason: turnstilev1.StopReason_STOP_REASON_MAX_TOKENS}),
		agent(&turnstilev1.LlmCallStarted{Model: "m", Attempt: 1, Call: 2}),
		agent(&turnstilev1.TextDelta{Text: " and the end."}),
	)
	if want := "turnstile: the reply reached the output token limit; model m continues it\n"; errOut != want {
		t.Errorf("stderr = %q, want %q", errOut, want)
	}
}

// On a terminal the reply wraps at word boundaries to its width.
func TestTextRendererWraps(t *testing.T) {
	out, _ := renderAll(t, console{width: 16},
		agent(&turnstilev1.TextDelta{Text: "The quick brown "}),
		agent(&turnstilev1.TextDelta{Text: "fox jumps over the lazy dog."}),
	)
	if want := "The quick brown \nfox jumps over \nthe lazy dog.\n"; out != want {
		t.Errorf("stdout = %q, want %q", out, want)
	}
	// Japanese and emoji take two columns each.
	out, _ = renderAll(t, console{width: 12},
		agent(&turnstilev1.TextDelta{Text: "東京の天気は"}),
		agent(&turnstilev1.TextDelta{Text: "晴れです☀️ 明日も晴れ"}),
	)
	if want := "東京の天気は\n晴れです☀️ \n明日も晴れ\n"; out != want {
		t.Errorf("stdout = %q, want %q", out, want)
	}
}

// Notices wrap at stderr's width too.
func TestNoticesWrap(t *testing.T) {
	_, errOut := renderAll(t, console{errWidth: 30},
		agent(&turnstilev1.Retry{Attempt: 2, MaxAttempts: 3, Model: "m", Reason: turnstilev1.ErrorCode_ERROR_CODE_OVERLOADED, Message: "Overloaded", Delay: durationpb.New(time.Second)}),
	)
	if want := "turnstile: model m: \nOVERLOADED: Overloaded; \nretrying in 1s (retry 1 of 2)\n"; errOut != want {
		t.Errorf("stderr = %q, want %q", errOut, want)
	}
}

// A retry that keeps the streamed text (a cut stream continued) leaves the
// reply whole in a file; on a terminal the notice gets a line of its own.
func TestTextRendererContinuedStream(t *testing.T) {
	retry := agent(&turnstilev1.Retry{Attempt: 2, MaxAttempts: 3, Model: "m", Reason: turnstilev1.ErrorCode_ERROR_CODE_STREAM_INTERRUPTED, Message: "cut"})
	for _, tt := range []struct {
		con  console
		want string
	}{
		{console{}, "Half a reply.\n"},
		{console{tty: true}, "Half a\n reply.\n"},
	} {
		out, errOut := renderAll(t, tt.con, agent(&turnstilev1.TextDelta{Text: "Half a"}), retry, agent(&turnstilev1.TextDelta{Text: " reply."}))
		if out != tt.want || strings.Contains(errOut, "discarded") {
			t.Errorf("tty %v: stdout %q, stderr %q; want stdout %q and no discard", tt.con.tty, out, errOut, tt.want)
		}
	}
}
