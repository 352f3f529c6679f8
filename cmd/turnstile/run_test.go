package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
)

// startTestServer serves a real runtime over a real gRPC server on a
// loopback port, with model "test" answering as p says, and returns its
// address. The runtime does not retry by itself, so the client's step
// retry is what the tests see.
func startTestServer(t *testing.T, p llm.Provider, tools ...llm.Tool) string {
	t.Helper()
	r, err := runtime.New([]*runtime.Model{{
		Alias: "test", ProviderName: "fake", Provider: p, ID: "fake-1",
		Retry: policy.Retry{MaxRetries: 0, Multiplier: 1},
	}}, "test", tools)
	if err != nil {
		t.Fatal(err)
	}
	return serveRunner(t, r)
}

func serveRunner(t *testing.T, r *runtime.Runner) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(r, server.Options{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() { srv.Stop(); <-done })
	return lis.Addr().String()
}

// runCLI runs "turnstile run args..." and returns its exit code, stdout and
// stderr. The command must leave no goroutine behind.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	before := goleak.IgnoreCurrent()
	var stdout, stderr bytes.Buffer
	code := runCommand(t.Context(), args, strings.NewReader(""), &stdout, &stderr, console{})
	goleak.VerifyNone(t, before)
	t.Logf("turnstile run %s => %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	return code, stdout.String(), stderr.String()
}

func thinking(text string) llm.Chunk {
	return llm.Chunk{Kind: llm.ChunkThinking, Text: text}
}

func serverError() *llm.Error {
	return &llm.Error{Kind: llm.KindServerError, Message: "upstream returned 500", StatusCode: 500}
}

func TestRunRendersTheTurn(t *testing.T) {
	p := fake.NewProvider(
		fake.Reply{Chunks: fake.Call("call_1", "lookup", `{"city":"Oslo"}`)},
		fake.Reply{Chunks: append([]llm.Chunk{thinking("The tool says ok.")}, fake.Text("It is sunny in Oslo.")...)},
	)
	tool := fake.NewTool("lookup", nil)
	addr := startTestServer(t, p, tool)

	code, out, errOut := runCLI(t, "--addr", addr, "what", "is", "the", "weather?")
	if code != exitOK {
		t.Fatalf("exit code %d, want %d", code, exitOK)
	}
	for _, want := range []string{
		`⚙ lookup({"city":"Oslo"})`,
		`↳ lookup: {"ok":true}`,
		"thinking: The tool says ok.",
		"\n\nIt is sunny in Oslo.\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	if strings.Contains(out+errOut, "\x1b[") {
		t.Errorf("ANSI sequences written to a non-terminal")
	}
	if !strings.HasSuffix(out, "It is sunny in Oslo.\n") {
		t.Errorf("stdout does not end with the reply and a newline: %q", out)
	}
	for _, want := range []string{"end_turn", "20 tokens in, 10 tokens out", "2 model calls", "1 tool call"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
	if n := len(p.Requests()); n != 2 {
		t.Errorf("model calls = %d, want 2", n)
	}
	if got := p.Requests()[0].Messages[0].Text(); got != "what is the weather?" {
		t.Errorf("prompt = %q", got)
	}
}

func TestRunStepRetryThenSuccess(t *testing.T) {
	p := fake.NewProvider(
		fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "Half a rep"}}, Err: serverError()},
		fake.Reply{Chunks: fake.Text("A whole reply.")},
	)
	addr := startTestServer(t, p)

	code, out, errOut := runCLI(t, "--addr", addr, "--retries", "1", "hello")
	if code != exitOK {
		t.Fatalf("exit code %d, want %d", code, exitOK)
	}
	if !strings.Contains(out, "Half a rep\n") || !strings.HasSuffix(out, "A whole reply.\n") {
		t.Errorf("stdout = %q, want the partial line then the reply", out)
	}
	for _, want := range []string{
		"turnstile: SERVER_ERROR: upstream returned 500; resuming the turn in ",
		"(resume 1 of 1); the partial output above is discarded",
		"· 1 resume\n",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
}

func TestRunRetryableFailureExits3(t *testing.T) {
	addr := startTestServer(t, fake.NewProvider(fake.Reply{Err: serverError()}))
	code, _, errOut := runCLI(t, "--addr", addr, "--retries", "1", "hello")
	if code != exitRetryable {
		t.Errorf("exit code %d, want %d", code, exitRetryable)
	}
	for _, want := range []string{"turnstile run: SERVER_ERROR: upstream returned 500 (model test); gave up after 1 resume; it may succeed if run again"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
}

func TestRunPermanentFailureExits1(t *testing.T) {
	addr := startTestServer(t, fake.NewProvider(fake.Reply{Err: &llm.Error{Kind: llm.KindAuth, Message: "invalid x-api-key", StatusCode: 401}}))
	code, _, errOut := runCLI(t, "--addr", addr, "hello")
	if code != exitPermanent {
		t.Errorf("exit code %d, want %d", code, exitPermanent)
	}
	if !strings.Contains(errOut, "AUTH: invalid x-api-key") || strings.Contains(errOut, "resuming") {
		t.Errorf("stderr = %q, want the AUTH error and no retry", errOut)
	}

	// A model the server does not know is rejected before the turn starts.
	code, _, errOut = runCLI(t, "--addr", addr, "--model", "nope", "hello")
	if code != exitPermanent || !strings.Contains(errOut, "INVALID_REQUEST") {
		t.Errorf("unknown model: exit code %d, stderr %q; want %d and INVALID_REQUEST", code, errOut, exitPermanent)
	}
}

func TestRunServerDownExits3(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	code, _, errOut := runCLI(t, "--addr", addr, "--retries", "0", "hello")
	if code != exitRetryable || !strings.Contains(errOut, "UNAVAILABLE") {
		t.Errorf("exit code %d, stderr %q; want %d and UNAVAILABLE", code, errOut, exitRetryable)
	}
}

func TestRunTimeout(t *testing.T) {
	addr := startTestServer(t, fake.NewProvider(fake.Reply{Hang: true}))
	start := time.Now()
	code, _, errOut := runCLI(t, "--addr", addr, "--timeout", "300ms", "hello")
	if code != exitPermanent || !strings.Contains(errOut, "DEADLINE_EXCEEDED") {
		t.Errorf("exit code %d, stderr %q; want %d and DEADLINE_EXCEEDED", code, errOut, exitPermanent)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
}

// --json prints one kind of line: a turnstile.v1.ClientEvent in protojson,
// for the server's events and the client's step retry alike; the second
// attempt's events are numbered from seq 1 again.
func TestRunJSON(t *testing.T) {
	p := fake.NewProvider(
		fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "Half"}}, Err: serverError()},
		fake.Reply{Chunks: fake.Text("Whole.")},
	)
	addr := startTestServer(t, p)
	// Flags after the prompt are flags too.
	code, out, _ := runCLI(t, "--addr", addr, "hello", "--json")
	if code != exitOK {
		t.Fatalf("exit code %d, want %d", code, exitOK)
	}
	var kinds []string
	var turnIDs = map[string]bool{}
	firstSeq := map[uint32]uint64{}
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var ev turnstilev1.ClientEvent
		if err := protojson.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("line %q is not a ClientEvent: %v", l, err)
		}
		turnIDs[ev.GetTurnId()] = true
		switch k := ev.GetKind().(type) {
		case *turnstilev1.ClientEvent_Agent:
			kinds = append(kinds, string(k.Agent.ProtoReflect().WhichOneof(k.Agent.ProtoReflect().Descriptor().Oneofs().ByName("payload")).Name()))
			if _, ok := firstSeq[ev.GetAttempt()]; !ok {
				firstSeq[ev.GetAttempt()] = k.Agent.GetSeq()
			}
		case *turnstilev1.ClientEvent_StepRetry:
			kinds = append(kinds, "step_retry")
			sr := k.StepRetry
			if sr.GetAttempt() != 2 || !sr.GetDiscardPartial() || sr.GetError().GetCode() != turnstilev1.ErrorCode_ERROR_CODE_SERVER_ERROR || sr.GetDelay() == nil {
				t.Errorf("step retry = %v", sr)
			}
		default:
			t.Fatalf("line %q has no event", l)
		}
	}
	if len(kinds) == 0 || kinds[0] != "turn_started" || kinds[len(kinds)-1] != "turn_completed" {
		t.Errorf("event kinds = %v, want turn_started first and turn_completed last", kinds)
	}
	for _, want := range []string{"text_delta", "error", "step_retry", "message_completed"} {
		if !slices.Contains(kinds, want) {
			t.Errorf("no %s line in %v", want, kinds)
		}
	}
	if len(turnIDs) != 1 {
		t.Errorf("turn ids = %v, want one", turnIDs)
	}
	if firstSeq[1] != 1 || firstSeq[2] != 1 {
		t.Errorf("first seq per attempt = %v, want 1 for attempts 1 and 2", firstSeq)
	}
}

func TestRunUsage(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want int
	}{
		{nil, exitUsage},
		{[]string{"--bogus", "hi"}, exitUsage},
		{[]string{"--retries", "-1", "hi"}, exitUsage},
		{[]string{"--timeout", "-1s", "hi"}, exitUsage},
		{[]string{"--timeout", "soon", "hi"}, exitUsage},
		{[]string{"--addr", "", "hi"}, exitUsage},
		{[]string{"-h"}, exitOK},
	} {
		if code, _, _ := runCLI(t, tt.args...); code != tt.want {
			t.Errorf("run %q = %d, want %d", tt.args, code, tt.want)
		}
	}
}

func TestRunPromptFromStdin(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: fake.Text("ok")})
	addr := startTestServer(t, p)
	var stdout, stderr bytes.Buffer
	code := runCommand(context.Background(), []string{"--addr", addr, "-"}, strings.NewReader("a prompt\nfrom stdin\n"), &stdout, &stderr, console{})
	if code != exitOK {
		t.Fatalf("exit code %d: %s", code, stderr.String())
	}
	if got := p.Requests()[0].Messages[0].Text(); got != "a prompt\nfrom stdin" {
		t.Errorf("prompt = %q", got)
	}
}

func TestTextRendererOnATerminal(t *testing.T) {
	var out, errOut bytes.Buffer
	r := newTextRenderer(&out, &errOut, console{color: true})
	for _, ev := range []*turnstilev1.AgentEvent{
		{Payload: &turnstilev1.AgentEvent_ThinkingDelta{ThinkingDelta: &turnstilev1.ThinkingDelta{Text: "hmm"}}},
		{Payload: &turnstilev1.AgentEvent_TextDelta{TextDelta: &turnstilev1.TextDelta{Text: "Hi"}}},
		{Payload: &turnstilev1.AgentEvent_Retry{Retry: &turnstilev1.Retry{
			Attempt: 2, MaxAttempts: 3, Model: "m", Delay: durationpb.New(1500 * time.Millisecond),
			Reason: turnstilev1.ErrorCode_ERROR_CODE_OVERLOADED, Message: "Overloaded", DiscardPartial: true,
		}}},
		{Payload: &turnstilev1.AgentEvent_Retry{Retry: &turnstilev1.Retry{
			Attempt: 2, MaxAttempts: 4, Model: "m", Reason: turnstilev1.ErrorCode_ERROR_CODE_RATE_LIMITED, Message: "Slow down", ToDeployment: "eu",
		}}},
		{Payload: &turnstilev1.AgentEvent_Fallback{Fallback: &turnstilev1.Fallback{
			FromModel: "m", ToModel: "n", Reason: turnstilev1.ErrorCode_ERROR_CODE_OVERLOADED, Message: "Overloaded",
		}}},
	} {
		if err := r.render(&client.Event{Attempt: 1, Agent: ev}); err != nil {
			t.Fatal(err)
		}
	}
	r.close()
	if want := ansiDim + "hmm" + ansiReset + "\n\nHi\n"; out.String() != want {
		t.Errorf("stdout = %q, want %q", out.String(), want)
	}
	for _, want := range []string{
		"turnstile: model m: OVERLOADED: Overloaded; retrying in 1.5s (retry 1 of 2); the partial output above is discarded\n",
		"turnstile: model m: RATE_LIMITED: Slow down; moving to its deployment eu\n",
		"turnstile: model m: OVERLOADED: Overloaded; falling back to model n\n",
	} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr = %q, lacks %q", errOut.String(), want)
		}
	}
}

func TestSpinnerClearsItsLine(t *testing.T) {
	var buf bytes.Buffer
	s := &spinner{w: &buf}
	s.start("waiting")
	s.start("waiting") // already running: no second animation
	s.stop()
	s.stop()
	if got := buf.String(); !strings.HasPrefix(got, "\r") || !strings.Contains(got, "waiting…") || !strings.HasSuffix(got, "\r\x1b[K") {
		t.Errorf("spinner wrote %q", got)
	}
}

// lockedBuilder is a strings.Builder safe for concurrent use.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *lockedBuilder) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuilder) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// The first Ctrl-C cancels the turn and says so; the second exits at once.
func TestInterruptsCancelThenExit(t *testing.T) {
	sigs, done := make(chan os.Signal, 2), make(chan struct{})
	defer close(done)
	cancelled, exited := make(chan struct{}), make(chan int, 1)
	var stderr lockedBuilder
	caught := interrupts(sigs, done, func() { close(cancelled) }, &stderr, "", func(code int) { exited <- code })
	if n := caught.Load(); n != 0 {
		t.Fatalf("caught = %d before any signal", n)
	}
	sigs <- os.Interrupt
	<-cancelled
	if n := caught.Load(); n != int32(syscall.SIGINT) {
		t.Errorf("caught = %d, want SIGINT", n)
	}
	if !strings.Contains(stderr.String(), "cancelling the turn (press Ctrl-C again to quit at once)") {
		t.Errorf("stderr = %q", stderr.String())
	}
	select {
	case code := <-exited:
		t.Fatalf("exited %d after one Ctrl-C", code)
	default:
	}
	sigs <- os.Interrupt
	if code := <-exited; code != 130 {
		t.Errorf("exit code %d, want 130", code)
	}
}
