package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
)

func TestHITLModes(t *testing.T) {
	for _, tt := range []struct {
		name                 string
		approve, steer       string
		tty, fromStdin, json bool
		wantMode             string
		wantSteer            bool
		wantErr              string
	}{
		{name: "terminal defaults", steer: steerAuto, tty: true, wantMode: approveAsk, wantSteer: true},
		{name: "pipe defaults", steer: steerAuto, wantMode: approveWait},
		{name: "json on a terminal asks nothing", steer: steerAuto, tty: true, json: true, wantMode: approveWait},
		{name: "json may ask", approve: approveAsk, steer: steerAuto, tty: true, json: true, wantMode: approveAsk},
		{name: "prompt from stdin", steer: steerAuto, tty: true, fromStdin: true, wantMode: approveWait},
		{name: "ask without a terminal", approve: approveAsk, steer: steerAuto, wantErr: "--approve=ask needs stdin to be a terminal"},
		{name: "ask with the prompt on stdin", approve: approveAsk, steer: steerAuto, tty: true, fromStdin: true, wantErr: "--approve=ask needs stdin"},
		{name: "all from a pipe", approve: approveAll, steer: steerOn, wantMode: approveAll, wantSteer: true},
		{name: "none", approve: approveNone, steer: steerOff, tty: true, wantMode: approveNone},
		{name: "steer on with the prompt on stdin", approve: approveWait, steer: steerOn, fromStdin: true, wantErr: `--steer=on reads stdin`},
		{name: "bad approve", approve: "maybe", steer: steerAuto, wantErr: `--approve: "maybe" is not one of ask, all, none, wait`},
		{name: "bad steer", steer: "yes", wantErr: `--steer: "yes" is not one of auto, on, off`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mode, steering, err := hitlModes(tt.approve, tt.steer, tt.tty, tt.fromStdin, tt.json)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || mode != tt.wantMode || steering != tt.wantSteer {
				t.Errorf("= %q, %v, %v; want %q, %v", mode, steering, err, tt.wantMode, tt.wantSteer)
			}
		})
	}
}

func TestRunApproveAskWithoutATerminalExits2(t *testing.T) {
	code, _, errOut := runCLI(t, "--addr", "127.0.0.1:1", "--approve=ask", "hello")
	if code != exitUsage || !strings.Contains(errOut, "--approve=ask needs stdin to be a terminal") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
}

// askWith runs the prompter's question about req on the typed input and
// returns its decision, error and what it wrote. Lines typed outside the
// question go to the steering list.
func askWith(t *testing.T, ctx context.Context, input string, req *turnstilev1.ToolApprovalRequested) (client.Decision, error, string, []string) {
	t.Helper()
	before := goleak.IgnoreCurrent()
	pr, pw := io.Pipe()
	var mu sync.Mutex
	var steered []string
	in := readLines(pr, func(s string) { mu.Lock(); steered = append(steered, s); mu.Unlock() })
	var out bytes.Buffer
	p := &prompter{in: in, w: lockedWriter{mu: &mu, w: &out}}
	type answer struct {
		d   client.Decision
		err error
	}
	got := make(chan answer, 1)
	go func() {
		d, err := p.ask(ctx, req)
		got <- answer{d, err}
	}()
	var a answer
	if input != "" {
		// Type only once the question is asked, as a person would.
		for !strings.Contains(syncString(&mu, &out), "[y/n]") {
			select {
			case a = <-got:
				t.Fatalf("returned before the input: %v", a)
			case <-time.After(time.Millisecond):
			}
		}
		if _, err := io.WriteString(pw, input); err != nil {
			t.Fatal(err)
		}
	}
	a = <-got
	pw.Close()
	<-in.done
	goleak.VerifyNone(t, before)
	mu.Lock()
	defer mu.Unlock()
	return a.d, a.err, out.String(), steered
}

func syncString(mu *sync.Mutex, b *bytes.Buffer) string {
	mu.Lock()
	defer mu.Unlock()
	return b.String()
}

func TestPrompterAsks(t *testing.T) {
	req := &turnstilev1.ToolApprovalRequested{CallId: "c1", Name: "deploy", Arguments: `{"env":"prod"}`, Preview: "deploys v2 to prod"}
	for _, tt := range []struct {
		name, input string
		want        client.Decision
		wantOut     []string
		wantSteered []string
	}{
		{name: "yes", input: "y\n", want: client.Decision{Approved: true}},
		{name: "YES", input: "YES\n", want: client.Decision{Approved: true}},
		{name: "no with a reason", input: "n\nuse staging first\n", want: client.Decision{Reason: "use staging first"},
			wantOut: []string{"Reason for the model (optional, Enter to skip): "}},
		{name: "no without a reason", input: "no\n\n", want: client.Decision{}},
		{name: "asks again", input: "maybe\ny\n", want: client.Decision{Approved: true}, wantOut: []string{"Please answer y or n.\nRun deploy? [y/n] "}},
		{name: "a line after the answer steers", input: "y\ngo on with staging\n", want: client.Decision{Approved: true}, wantSteered: []string{"go on with staging"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, err, out, steered := askWith(t, t.Context(), tt.input, req)
			if err != nil || d != tt.want {
				t.Fatalf("decision %+v, %v; want %+v", d, err, tt.want)
			}
			for _, w := range append([]string{"the model wants to run deploy", `arguments: {"env":"prod"}`, "preview: deploys v2 to prod", "Run deploy? [y/n] "}, tt.wantOut...) {
				if !strings.Contains(out, w) {
					t.Errorf("output %q lacks %q", out, w)
				}
			}
			if tt.wantSteered != nil {
				// The reader hands the line on after ask returned.
				if strings.Join(steered, "|") != strings.Join(tt.wantSteered, "|") {
					t.Errorf("steered %q, want %q", steered, tt.wantSteered)
				}
			}
		})
	}
}

func TestPrompterStdinEnds(t *testing.T) {
	pr, pw := io.Pipe()
	in := readLines(pr, nil)
	p := &prompter{in: in, w: io.Discard}
	pw.Close()
	_, err := p.ask(t.Context(), &turnstilev1.ToolApprovalRequested{Name: "deploy"})
	if err == nil || !strings.Contains(err.Error(), "stdin ended before an answer") {
		t.Errorf("err = %v", err)
	}
}

func TestPrompterCancelled(t *testing.T) {
	cause := errors.New("interrupted")
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(cause)
	_, err, _, _ := askWith(t, ctx, "", &turnstilev1.ToolApprovalRequested{Name: "deploy"})
	if !errors.Is(err, cause) {
		t.Errorf("err = %v, want the context's cause", err)
	}
}

func TestRendererShowsApprovalAndSteering(t *testing.T) {
	var out, errOut bytes.Buffer
	r := newTextRenderer(&out, &errOut, console{})
	steering := &turnstilev1.Message{Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "use staging"}}}}
	evs := []*turnstilev1.AgentEvent{
		{Seq: 1, Payload: &turnstilev1.AgentEvent_ToolApprovalRequested{ToolApprovalRequested: &turnstilev1.ToolApprovalRequested{
			CallId: "c1", Name: "deploy", Arguments: `{"env":"prod"}`, Preview: "deploys v2"}}},
		{Seq: 2, Payload: &turnstilev1.AgentEvent_ToolApprovalDecided{ToolApprovalDecided: &turnstilev1.ToolApprovalDecided{
			CallId: "c1", Name: "deploy", Approved: false, Reason: "not on a Friday", DecidedBy: "ops"}}},
		{Seq: 3, Payload: &turnstilev1.AgentEvent_ToolApprovalDecided{ToolApprovalDecided: &turnstilev1.ToolApprovalDecided{
			CallId: "c2", Name: "rollback", TimedOut: true, Reason: "no decision within 5m0s"}}},
		{Seq: 4, Payload: &turnstilev1.AgentEvent_ToolApprovalDecided{ToolApprovalDecided: &turnstilev1.ToolApprovalDecided{
			CallId: "c3", Name: "status", Approved: true}}},
		{Seq: 5, Payload: &turnstilev1.AgentEvent_TextDelta{TextDelta: &turnstilev1.TextDelta{Text: "Deploying to prod"}}},
		{Seq: 6, Payload: &turnstilev1.AgentEvent_Steered{Steered: &turnstilev1.Steered{Message: steering}}},
		{Seq: 7, Payload: &turnstilev1.AgentEvent_TextDelta{TextDelta: &turnstilev1.TextDelta{Text: " now."}}},
		{Seq: 8, Payload: &turnstilev1.AgentEvent_MessageCompleted{MessageCompleted: &turnstilev1.MessageCompleted{Message: &turnstilev1.Message{
			Role: turnstilev1.Role_ROLE_ASSISTANT, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "Deploying to prod now."}}}}}}},
		{Seq: 9, Payload: &turnstilev1.AgentEvent_MessageCompleted{MessageCompleted: &turnstilev1.MessageCompleted{Message: steering}}},
		{Seq: 10, Payload: &turnstilev1.AgentEvent_TextDelta{TextDelta: &turnstilev1.TextDelta{Text: "Staging, then."}}},
	}
	for _, ev := range evs {
		if err := r.render(&client.Event{Attempt: 1, Agent: ev}); err != nil {
			t.Fatal(err)
		}
	}
	r.done(&client.Result{
		EndReason: turnstilev1.EndReason_END_REASON_TOOL_ENDED_TURN,
		Usage:     &turnstilev1.Usage{},
		Counters:  &turnstilev1.TurnCounters{ModelCalls: 1, ApprovalsRequested: 3, ApprovalsDenied: 2, Steered: 1},
	})
	want := `? deploy({"env":"prod"}) waits for approval
  preview: deploys v2
  ↳ deploy denied by ops: not on a Friday
  ↳ rollback denied: nobody decided in time: no decision within 5m0s
  ↳ status approved

Deploying to prod now.

» use staging

Staging, then.
`
	if out.String() != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", out.String(), want)
	}
	for _, w := range []string{"turnstile: steering message received: use staging; the turn takes it before its next model call\n",
		"a tool the server lists under ends_turn ended the turn", "tool_ended_turn ·", "3 approval requests (2 denied) · 1 steering message"} {
		if !strings.Contains(errOut.String(), w) {
			t.Errorf("stderr %q lacks %q", errOut.String(), w)
		}
	}
}

// startGatedServer is startTestServer with the tools named in gated
// waiting for approval.
func startGatedServer(t *testing.T, p llm.Provider, gated []string, tools ...llm.Tool) string {
	t.Helper()
	r, err := runtime.New([]*runtime.Model{{
		Alias: "test", ProviderName: "fake", Provider: p, ID: "fake-1",
		Retry: policy.Retry{MaxRetries: 0, Multiplier: 1},
	}}, "test", tools, runtime.WithToolRules(runtime.ToolRules{RequireApproval: gated}))
	if err != nil {
		t.Fatal(err)
	}
	return serveRunner(t, r)
}

// waitFor waits until w holds want, or the command ended (done closed).
func waitFor(t *testing.T, w *syncBuffer, want string, done <-chan struct{}) {
	t.Helper()
	for !strings.Contains(w.String(), want) {
		select {
		case <-done:
			t.Fatalf("the command ended before writing %q", want)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// interactive runs "turnstile run args..." with stdin a pipe, as a
// terminal (con.stdinTTY) or not; typist types on it as the command runs.
// It returns the exit code, stdout and stderr.
func interactive(t *testing.T, tty bool, typist func(stdin io.Writer, stdout, stderr *syncBuffer, done <-chan struct{}), args ...string) (int, string, string) {
	t.Helper()
	before := goleak.IgnoreCurrent()
	pr, pw := io.Pipe()
	var stdout, stderr syncBuffer
	done := make(chan struct{})
	typed := make(chan struct{})
	go func() {
		defer close(typed)
		typist(pw, &stdout, &stderr, done)
	}()
	code := runCommand(t.Context(), args, pr, &stdout, &stderr, console{stdinTTY: tty})
	close(done)
	<-typed
	pw.Close() // the end of stdin ends the command's reader
	goleak.VerifyNone(t, before)
	t.Logf("turnstile run %s => %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	return code, stdout.String(), stderr.String()
}

func TestRunApproveWithoutATerminal(t *testing.T) {
	for _, tt := range []struct {
		flag       string
		runs       int
		wantOut    []string
		wantResult string
	}{
		{flag: "--approve=all", runs: 1, wantOut: []string{"  ↳ lookup approved: approved by turnstile run --approve=all\n", `⚙ lookup({"city":"Oslo"})`, `↳ lookup: {"ok":true}`}, wantResult: `{"ok":true}`},
		{flag: "--approve=none", runs: 0, wantOut: []string{"  ↳ lookup denied: denied by turnstile run --approve=none\n  ↳ lookup error: denied by the user: denied by turnstile run --approve=none"}, wantResult: "denied by the user: denied by turnstile run --approve=none"},
	} {
		t.Run(tt.flag, func(t *testing.T) {
			p := fake.NewProvider(
				fake.Reply{Chunks: fake.Call("call_1", "lookup", `{"city":"Oslo"}`)},
				fake.Reply{Chunks: fake.Text("Done.")},
			)
			tool := fake.NewTool("lookup", nil)
			addr := startGatedServer(t, p, []string{"lookup"}, tool)
			code, out, errOut := runCLI(t, "--addr", addr, tt.flag, "weather?")
			if code != exitOK {
				t.Fatalf("exit %d", code)
			}
			for _, w := range append([]string{`? lookup({"city":"Oslo"}) waits for approval`}, tt.wantOut...) {
				if !strings.Contains(out, w) {
					t.Errorf("stdout lacks %q", w)
				}
			}
			if n := len(tool.Calls()); n != tt.runs {
				t.Errorf("the tool ran %d times, want %d", n, tt.runs)
			}
			got := p.Requests()[1].Messages
			if r := got[len(got)-1].Parts[0].ToolResult; r == nil || r.Content != tt.wantResult {
				t.Errorf("the model's second request ends with %+v, want the result %q", got[len(got)-1], tt.wantResult)
			}
			if !strings.Contains(errOut, "· 1 approval request") {
				t.Errorf("stderr lacks the approval count")
			}
		})
	}
}

// TestRunAsksOnTheTerminal: with stdin a terminal the command asks about
// the call on stderr, and a denial's reason reaches the model.
func TestRunAsksOnTheTerminal(t *testing.T) {
	p := fake.NewProvider(
		fake.Reply{Chunks: fake.Call("call_1", "lookup", `{"city":"Oslo"}`)},
		fake.Reply{Chunks: fake.Text("Fine, no lookup.")},
	)
	tool := fake.NewTool("lookup", nil)
	addr := startGatedServer(t, p, []string{"lookup"}, tool)
	code, out, errOut := interactive(t, true, func(stdin io.Writer, _, stderr *syncBuffer, done <-chan struct{}) {
		waitFor(t, stderr, "Run lookup? [y/n] ", done)
		io.WriteString(stdin, "n\n")
		waitFor(t, stderr, "Reason for the model", done)
		io.WriteString(stdin, "the weather is fine\n")
	}, "--addr", addr, "weather?")
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	for _, w := range []string{"turnstile: the model wants to run lookup\n", `  arguments: {"city":"Oslo"}`} {
		if !strings.Contains(errOut, w) {
			t.Errorf("stderr lacks %q", w)
		}
	}
	if !strings.Contains(out, "  ↳ lookup denied: the weather is fine\n") || !strings.HasSuffix(out, "Fine, no lookup.\n") {
		t.Errorf("stdout lacks the denial or the reply")
	}
	if n := len(tool.Calls()); n != 0 {
		t.Errorf("the tool ran %d times", n)
	}
	got := p.Requests()[1].Messages
	if r := got[len(got)-1].Parts[0].ToolResult; r == nil || !r.IsError || !strings.Contains(r.Content, "the weather is fine") {
		t.Errorf("the model's second request ends with %+v", got[len(got)-1])
	}
}

// TestRunStdinEndsBeforeTheAnswer: a terminal closed while the command
// asks cancels the turn, which fails with the reason; the tool never runs.
func TestRunStdinEndsBeforeTheAnswer(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: fake.Call("call_1", "lookup", `{}`)})
	tool := fake.NewTool("lookup", nil)
	addr := startGatedServer(t, p, []string{"lookup"}, tool)
	code, _, errOut := interactive(t, true, func(stdin io.Writer, _, stderr *syncBuffer, done <-chan struct{}) {
		waitFor(t, stderr, "Run lookup? [y/n] ", done)
		stdin.(io.Closer).Close()
	}, "--addr", addr, "weather?")
	if code != exitPermanent || !strings.Contains(errOut, "CANCELLED") {
		t.Errorf("exit %d, want %d with CANCELLED", code, exitPermanent)
	}
	if n := len(tool.Calls()); n != 0 {
		t.Errorf("the tool ran %d times", n)
	}
}

// TestRunSteersFromStdin: with --steer=on a line on stdin reaches the
// running turn: the steered event is shown and the message is in the
// model's next request.
func TestRunSteersFromStdin(t *testing.T) {
	release := make(chan struct{})
	p := fake.NewProvider(
		fake.Reply{Chunks: fake.Call("call_1", "step", `{}`)},
		fake.Reply{Chunks: fake.Text("Staging it is.")},
	)
	tool := fake.NewTool("step", func(ctx context.Context, _ llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return llm.ToolOutput{Content: "stepped"}, nil
	})
	addr := startTestServer(t, p, tool)
	code, out, _ := interactive(t, false, func(stdin io.Writer, stdout, stderr *syncBuffer, done <-chan struct{}) {
		defer close(release)
		waitFor(t, stdout, "⚙ step({})", done)
		io.WriteString(stdin, "\nuse staging instead\n")
		waitFor(t, stderr, "turnstile: steering message received: use staging instead", done)
	}, "--addr", addr, "--steer=on", "deploy")
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(out, "\n» use staging instead\n\nStaging it is.\n") {
		t.Errorf("stdout lacks the steering message where the turn took it, then the reply")
	}
	got := p.Requests()[1].Messages
	if last := got[len(got)-1]; last.Role != llm.RoleUser || last.Text() != "use staging instead" {
		t.Errorf("the model's second request ends with %+v, want the steering message", last)
	}
}
