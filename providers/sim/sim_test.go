package sim_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newSim returns an unpaced simulator named "sim" with script.
func newSim(tb testing.TB, script ...string) *sim.Provider {
	tb.Helper()
	p, err := sim.New("sim", sim.Config{TokenDelay: -1, Script: script})
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return p
}

func user(text string) llm.Message {
	return llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(text)}}
}

func assistant(text string) llm.Message {
	return llm.Message{Role: llm.RoleAssistant, Parts: []llm.Part{llm.TextPart(text)}}
}

func ask(model, text string) *llm.Request {
	return &llm.Request{Model: model, Messages: []llm.Message{user(text)}}
}

// result is what one call streamed.
type result struct {
	chunks []llm.Chunk
	err    error
}

// text joins the text chunks.
func (r result) text() string {
	var b strings.Builder
	for _, c := range r.chunks {
		if c.Kind == llm.ChunkText {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// count counts the chunks of kind k.
func (r result) count(k llm.ChunkKind) int {
	n := 0
	for _, c := range r.chunks {
		if c.Kind == k {
			n++
		}
	}
	return n
}

// stop returns the stop reason, or fails the test when the call did not end
// with usage then a stop.
func (r result) stop(tb testing.TB) llm.StopReason {
	tb.Helper()
	if r.err != nil {
		tb.Fatalf("call failed: %v", r.err)
	}
	n := len(r.chunks)
	if n < 2 || r.chunks[n-2].Kind != llm.ChunkUsage || r.chunks[n-1].Kind != llm.ChunkStop {
		tb.Fatalf("call did not end with usage and stop: %+v", r.chunks)
	}
	return r.chunks[n-1].Stop
}

// usage returns the call's usage chunk.
func (r result) usage(tb testing.TB) llm.Usage {
	tb.Helper()
	r.stop(tb)
	return r.chunks[len(r.chunks)-2].Usage
}

// rtErr returns the call's error as a *runtime.Error, failing the test when
// there is none.
func (r result) rtErr(tb testing.TB) *llm.Error {
	tb.Helper()
	var e *llm.Error
	if !errors.As(r.err, &e) {
		tb.Fatalf("call error = %v (chunks %+v), want a *runtime.Error", r.err, r.chunks)
	}
	return e
}

// call runs one model call to its end, checking that an error comes at most
// once and last.
func call(tb testing.TB, p *sim.Provider, req *llm.Request) result {
	tb.Helper()
	return callCtx(tb, tb.Context(), p, req)
}

func callCtx(tb testing.TB, ctx context.Context, p *sim.Provider, req *llm.Request) result {
	tb.Helper()
	var r result
	for c, err := range p.Stream(ctx, req) {
		if r.err != nil {
			tb.Fatalf("chunk %+v after error %v", c, r.err)
		}
		if err != nil {
			r.err = err
			continue
		}
		r.chunks = append(r.chunks, c)
	}
	return r
}

func TestDefaultAnswer(t *testing.T) {
	t.Parallel()
	const q = "What is the capital of France?"
	p := newSim(t)
	first := call(t, p, ask("m", q))
	if got := first.stop(t); got != llm.StopEndTurn {
		t.Fatalf("stop = %v, want end_turn", got)
	}
	for i, c := range first.chunks[:len(first.chunks)-2] {
		if c.Kind != llm.ChunkText || c.Text == "" {
			t.Fatalf("chunk %d = %+v, want a text token", i, c)
		}
		if strings.TrimSpace(c.Text) == "" || strings.Contains(strings.TrimRight(c.Text, " "), " ") {
			t.Errorf("chunk %d = %q, want one word and its trailing spaces", i, c.Text)
		}
	}
	text := first.text()
	if !strings.Contains(text, "What is the capital of France") {
		t.Errorf("answer %q does not acknowledge the question", text)
	}
	if n := strings.Count(text, ". "); n < 1 {
		t.Errorf("answer %q is not a couple of sentences", text)
	}
	wantUsage := llm.Usage{InputTokens: int64(len(q) / 4), OutputTokens: int64(first.count(llm.ChunkText))}
	if got := first.usage(t); got != wantUsage {
		t.Errorf("usage = %+v, want %+v", got, wantUsage)
	}

	// Same input, same output, whatever the provider instance; the stop
	// names the model asked for as the one that served the reply.
	again := call(t, newSim(t), ask("other-model", q))
	if n := len(again.chunks); n == 0 || again.chunks[n-1].Model != "other-model" {
		t.Fatalf("the stop does not name the model asked for: %+v", again.chunks)
	}
	again.chunks[len(again.chunks)-1].Model = first.chunks[len(first.chunks)-1].Model
	if diff := cmp.Diff(first.chunks, again.chunks); diff != "" {
		t.Errorf("second call differs (-first +second):\n%s", diff)
	}
	if other := call(t, p, ask("m", "How do turnstiles count people?")).text(); other == text {
		t.Errorf("two questions got the same answer %q", text)
	}

	// Directives are not echoed; an empty question gets a greeting.
	if got := call(t, p, ask("m", "[sim think] "+q)).text(); got != text {
		t.Errorf("answer with a directive = %q, want %q", got, text)
	}
	if got := call(t, p, ask("m", "[sim delay=0]")).text(); !strings.HasPrefix(got, "Hello!") {
		t.Errorf("answer to an empty question = %q, want a greeting", got)
	}
	if got := call(t, p, &llm.Request{Model: "m"}).usage(t).InputTokens; got != 1 {
		t.Errorf("input tokens of an empty request = %d, want 1", got)
	}
}

func TestUsageCountsWholeRequest(t *testing.T) {
	t.Parallel()
	req := &llm.Request{
		Model:  "m",
		System: strings.Repeat("s", 400),
		Messages: []llm.Message{
			user(strings.Repeat("u", 200)),
			{Role: llm.RoleAssistant, Parts: []llm.Part{
				{Kind: llm.PartThinking, Text: strings.Repeat("t", 40), Signature: strings.Repeat("s", 60)},
				llm.TextPart(strings.Repeat("a", 200)),
			}},
			user("ok"),
		},
	}
	if got, want := call(t, newSim(t), req).usage(t).InputTokens, int64(902/4); got != want {
		t.Errorf("input tokens = %d, want %d", got, want)
	}
}

func TestPacing(t *testing.T) {
	t.Parallel()
	const delay = 4 * time.Millisecond
	p, err := sim.New("sim", sim.Config{TokenDelay: delay})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := call(t, p, ask("m", "[sim reply=\"one two three four five six seven eight\"]"))
	elapsed := time.Since(start)
	if n := r.count(llm.ChunkText); n != 8 {
		t.Fatalf("streamed %d tokens, want 8", n)
	}
	if elapsed < 8*delay {
		t.Errorf("8 tokens took %v, want at least %v", elapsed, 8*delay)
	}

	// A directive's delay comes before the first token.
	start = time.Now()
	for range newSim(t).Stream(t.Context(), ask("m", "[sim delay=40ms] hi")) {
		if since := time.Since(start); since < 40*time.Millisecond {
			t.Errorf("first chunk after %v, want at least 40ms", since)
		}
		break
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		prompt string
		after  int // chunks to read before cancelling
	}{
		{"mid-answer", "Tell me a story about turnstiles and tokens.", 3},
		{"before first token", "[sim delay=10s] hi", 0},
		{"stalled", "[sim fail=timeout after=2] hi", 2},
		{"stalled before output", "[sim fail=stall] hi", 0},
		{"mid-tool-call", `[sim tool=search args={"query":"a long query string to split"}]`, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := sim.New("sim", sim.Config{TokenDelay: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var cancelledAt time.Time
			var once sync.Once
			if tt.after == 0 {
				time.AfterFunc(30*time.Millisecond, func() { once.Do(func() { cancelledAt = time.Now(); cancel() }) })
			}
			n := 0
			for c, err := range p.Stream(ctx, ask("m", tt.prompt)) {
				if ctx.Err() != nil {
					t.Fatalf("yielded (%+v, %v) after cancellation", c, err)
				}
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				n++
				if n == tt.after {
					once.Do(func() { cancelledAt = time.Now(); cancel() })
				}
			}
			once.Do(func() { t.Fatal("the stream ended before it was cancelled") })
			if since := time.Since(cancelledAt); since > 50*time.Millisecond {
				t.Errorf("stream ended %v after cancel, want under 50ms", since)
			}
		})
	}
}

func TestCancelledBeforeStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for c, err := range newSim(t).Stream(ctx, ask("m", "[sim fail=overloaded] hi")) {
		t.Fatalf("yielded (%+v, %v) on a done context", c, err)
	}
}

func TestFailures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		prompt     string
		kind       llm.Kind
		status     int
		retryAfter time.Duration
		hint       llm.Hint
		message    string // a fragment of the message
		tokens     int    // text tokens streamed before the failure
	}{
		{"[sim fail=rate_limit]", llm.KindRateLimited, 429, time.Second, llm.HintAfter, "try again in 1s", 0},
		{"[sim fail=rate_limit retry_after=3s]", llm.KindRateLimited, 429, 3 * time.Second, llm.HintAfter, "try again in 3s", 0},
		{"[sim fail=rate_limit retry_after=2]", llm.KindRateLimited, 429, 2 * time.Second, llm.HintAfter, "", 0},
		{"[sim fail=quota]", llm.KindQuotaExhausted, 429, 0, llm.HintDefault, "exceeded your current quota", 0},
		{"[sim fail=overloaded]", llm.KindOverloaded, 529, 0, llm.HintDefault, "Overloaded", 0},
		{"[sim fail=overloaded retry_after=500ms]", llm.KindOverloaded, 529, 500 * time.Millisecond, llm.HintAfter, "Overloaded", 0},
		{"[sim fail=unavailable]", llm.KindOverloaded, 503, 0, llm.HintDefault, "overloaded", 0},
		{"[sim fail=server_error]", llm.KindServerError, 500, 0, llm.HintDefault, "server had an error", 0},
		{"[sim fail=bad_gateway]", llm.KindServerError, 502, 0, llm.HintDefault, "Bad Gateway", 0},
		{"[sim fail=gateway_timeout]", llm.KindServerError, 504, 0, llm.HintDefault, "", 0},
		{"[sim fail=auth]", llm.KindAuth, 401, 0, llm.HintDefault, "", 0},
		{"[sim fail=forbidden]", llm.KindAuth, 403, 0, llm.HintDefault, "", 0},
		{"[sim fail=not_found]", llm.KindNotFound, 404, 0, llm.HintDefault, "`sim-x` does not exist", 0},
		{"[sim fail=invalid]", llm.KindInvalidRequest, 400, 0, llm.HintDefault, "", 0},
		{"[sim fail=context_overflow]", llm.KindContextOverflow, 400, 0, llm.HintDefault, "prompt is too long", 0},
		{"[sim fail=content_filter]", llm.KindContentFiltered, 400, 0, llm.HintDefault, "content management policy", 0},
		{"[sim fail=disconnect]", llm.KindNetwork, 0, 0, llm.HintDefault, "connection reset", 0},
		{"[sim fail=disconnect after=4]", llm.KindStreamInterrupted, 0, 0, llm.HintDefault, "cut short", 4},
		{"[sim fail=overloaded after=3]", llm.KindOverloaded, 529, 0, llm.HintDefault, "Overloaded", 3},
		{`[sim fail=server_error message="upstream exploded"]`, llm.KindServerError, 500, 0, llm.HintDefault, "upstream exploded", 0},
	}
	for _, tt := range tests {
		t.Run(tt.prompt, func(t *testing.T) {
			t.Parallel()
			p, err := sim.New("primary", sim.Config{TokenDelay: -1})
			if err != nil {
				t.Fatal(err)
			}
			r := call(t, p, ask("sim-x", tt.prompt+" Why is the sky blue?"))
			e := r.rtErr(t)
			if e.Kind != tt.kind || e.StatusCode != tt.status || e.RetryAfter != tt.retryAfter || e.Hint != tt.hint {
				t.Errorf("error = {Kind %v, StatusCode %d, RetryAfter %v, Hint %v}, want {%v, %d, %v, %v}",
					e.Kind, e.StatusCode, e.RetryAfter, e.Hint, tt.kind, tt.status, tt.retryAfter, tt.hint)
			}
			if e.Provider != "primary" {
				t.Errorf("Provider = %q, want primary", e.Provider)
			}
			if e.Message == "" || !strings.Contains(e.Message, tt.message) {
				t.Errorf("Message = %q, want it to contain %q", e.Message, tt.message)
			}
			if e.RequestID == "" || e.Err == nil {
				t.Errorf("RequestID = %q, Err = %v; want both set", e.RequestID, e.Err)
			}
			if got := r.count(llm.ChunkText); got != tt.tokens || len(r.chunks) != tt.tokens {
				t.Errorf("streamed %d chunks (%d text) before the failure, want %d text chunks only", len(r.chunks), got, tt.tokens)
			}
		})
	}
}

func TestContextOverflowAbove(t *testing.T) {
	t.Parallel()
	p := newSim(t, "fail=context_overflow above=1000")
	long := &llm.Request{Model: "m", Messages: []llm.Message{
		user(strings.Repeat("history ", 100)), assistant(strings.Repeat("answer ", 100)), user("and now?"),
	}}
	e := call(t, p, long).rtErr(t)
	if e.Kind != llm.KindContextOverflow || e.StatusCode != 400 {
		t.Fatalf("long request: error = %v, want a 400 context overflow", e)
	}
	if want := "prompt is too long: 377 tokens > 250 maximum"; e.Message != want {
		t.Errorf("Message = %q, want %q", e.Message, want)
	}
	// The same request after compaction fits and succeeds, every time.
	compacted := &llm.Request{Model: "m", Messages: []llm.Message{
		user("Summary: the user asked about history."), assistant("Noted."), user("and now?"),
	}}
	for range 2 {
		if got := call(t, p, compacted).stop(t); got != llm.StopEndTurn {
			t.Errorf("compacted request: stop = %v, want end_turn", got)
		}
	}
	// The limit counts the system prompt too.
	withSystem := &llm.Request{Model: "m", System: strings.Repeat("x", 1001), Messages: []llm.Message{user("hi")}}
	if k := llm.KindOf(call(t, p, withSystem).err); k != llm.KindContextOverflow {
		t.Errorf("large system prompt: kind = %v, want CONTEXT_OVERFLOW", k)
	}
}

func TestTimes(t *testing.T) {
	t.Parallel()
	p := newSim(t)
	req := ask("m", "[sim fail=overloaded times=2] Is it working?")
	var kinds []string
	for range 4 {
		r := call(t, p, req)
		if r.err != nil {
			kinds = append(kinds, llm.KindOf(r.err).String())
		} else {
			kinds = append(kinds, r.stop(t).String())
		}
	}
	want := []string{"OVERLOADED", "OVERLOADED", "end_turn", "end_turn"}
	if diff := cmp.Diff(want, kinds); diff != "" {
		t.Errorf("outcomes of four identical calls (-want +got):\n%s", diff)
	}

	// Another conversation, or the same one on another model, counts afresh.
	other := ask("m", "[sim fail=overloaded times=2] Is the other one working?")
	if k := llm.KindOf(call(t, p, other).err); k != llm.KindOverloaded {
		t.Errorf("other conversation, first call: kind = %v, want OVERLOADED", k)
	}
	if k := llm.KindOf(call(t, p, ask("m2", req.Messages[0].Text())).err); k != llm.KindOverloaded {
		t.Errorf("other model, first call: kind = %v, want OVERLOADED", k)
	}
	// Without times, a failure applies to every call.
	always := ask("m", "[sim fail=server_error] again")
	for i := range 3 {
		if k := llm.KindOf(call(t, p, always).err); k != llm.KindServerError {
			t.Errorf("call %d: kind = %v, want SERVER_ERROR", i+1, k)
		}
	}
}

// TestTimesPerTurn: times=K counts per turn, so the same prompt fails the
// same way in every turn (the README's directive example is repeatable),
// and a call continuing a cut reply counts with the request it continues.
func TestTimesPerTurn(t *testing.T) {
	t.Parallel()
	p := newSim(t)
	outcomes := func(turn string) []string {
		var kinds []string
		for range 3 {
			req := ask("m", "[sim fail=overloaded times=2] Is it working?")
			req.TurnID = turn
			if r := call(t, p, req); r.err != nil {
				kinds = append(kinds, llm.KindOf(r.err).String())
			} else {
				kinds = append(kinds, r.stop(t).String())
			}
		}
		return kinds
	}
	want := []string{"OVERLOADED", "OVERLOADED", "end_turn"}
	for _, turn := range []string{"turn-1", "turn-2", "turn-3"} {
		if diff := cmp.Diff(want, outcomes(turn)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", turn, diff)
		}
	}

	// A cut reply continued from a prefill, or with a continuation prompt,
	// is not cut again: the continuation is the same request's second call.
	const q = "[sim fail=disconnect after=4 times=1] Explain how a turnstile counts the people passing through it."
	full := call(t, p, ask("m", "Explain how a turnstile counts the people passing through it.")).text()
	for _, tail := range []string{"", "Continue."} {
		req := ask("m", q)
		req.TurnID = "cut-" + tail
		first := call(t, p, req)
		if llm.KindOf(first.err) != llm.KindStreamInterrupted || first.count(llm.ChunkText) != 4 {
			t.Fatalf("first call: %v after %d tokens, want STREAM_INTERRUPTED after 4", first.err, first.count(llm.ChunkText))
		}
		cont := &llm.Request{TurnID: req.TurnID, Model: "m", Messages: []llm.Message{req.Messages[0], assistant(strings.TrimRight(first.text(), " "))}}
		if tail != "" {
			cont.Messages = append(cont.Messages, user(tail))
		}
		second := call(t, p, cont)
		if got := second.stop(t); got != llm.StopEndTurn {
			t.Fatalf("continuation (%q) stop = %v", tail, got)
		}
		if got := strings.TrimRight(first.text(), " ") + second.text(); got != full {
			t.Errorf("continued (%q) = %q, want %q", tail, got, full)
		}
	}
}

func TestTimesSequence(t *testing.T) {
	t.Parallel()
	// Failures apply in order: a script's first, then the prompt's.
	p := newSim(t, "fail=rate_limit times=1")
	req := ask("m", "[sim fail=server_error times=1] [sim fail=disconnect times=1] go")
	var got []llm.Kind
	for range 4 {
		got = append(got, llm.KindOf(call(t, p, req).err))
	}
	want := []llm.Kind{llm.KindRateLimited, llm.KindServerError, llm.KindNetwork, llm.KindInternal}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("kinds (-want +got):\n%s", diff)
	}
}

func TestModelTargeting(t *testing.T) {
	t.Parallel()
	p := newSim(t)
	const prompt = "[sim fail=quota model=sim-primary] [sim reply=\"from the fallback\" model=sim-fallback,sim-other] Hello"
	if k := llm.KindOf(call(t, p, ask("sim-primary", prompt)).err); k != llm.KindQuotaExhausted {
		t.Errorf("primary: kind = %v, want QUOTA_EXHAUSTED", k)
	}
	for _, model := range []string{"sim-fallback", "sim-other"} {
		if got := call(t, p, ask(model, prompt)).text(); got != "from the fallback" {
			t.Errorf("%s: text = %q, want the fallback's reply", model, got)
		}
	}
	if got, want := call(t, p, ask("sim-third", prompt)).text(), call(t, p, ask("x", "Hello")).text(); got != want {
		t.Errorf("untargeted model: text = %q, want the default answer %q", got, want)
	}
}

func TestScript(t *testing.T) {
	t.Parallel()
	p := newSim(t, "[sim fail=unavailable times=1 model=a] [sim think model=b]", `reply="scripted"`)
	if k := llm.KindOf(call(t, p, ask("a", "hi")).err); k != llm.KindOverloaded {
		t.Errorf("a, first call: kind = %v, want OVERLOADED", k)
	}
	if got := call(t, p, ask("a", "hi")).text(); got != "scripted" {
		t.Errorf("a, second call: text = %q, want scripted", got)
	}
	b := call(t, p, ask("b", "hi"))
	if b.count(llm.ChunkThinking) == 0 || b.text() != "scripted" {
		t.Errorf("b: %d thinking chunks, text %q; want reasoning and the scripted reply", b.count(llm.ChunkThinking), b.text())
	}
}

func TestNewRejectsBadScript(t *testing.T) {
	t.Parallel()
	tests := []struct{ entry, fragment string }{
		{"fail=bogus", "bogus"},
		{"[sim fail=overloaded times=0]", "[sim fail=overloaded times=0]"},
		{"[sim tool=x args=[1]]", "args"},
		{"[sim fail=overloaded", "no closing"},
		{"[sim think] and some text", "outside directives"},
		{"", "empty"},
		{"nonsense", "nonsense"},
	}
	for _, tt := range tests {
		t.Run(tt.entry, func(t *testing.T) {
			t.Parallel()
			_, err := sim.New("sim", sim.Config{Script: []string{"think", tt.entry}})
			if !errors.Is(err, sim.ErrInvalidDirective) {
				t.Fatalf("New(%q) error = %v, want ErrInvalidDirective", tt.entry, err)
			}
			if !strings.Contains(err.Error(), tt.fragment) || !strings.Contains(err.Error(), "script[1]") {
				t.Errorf("New(%q) error = %q, want it to name script[1] and contain %q", tt.entry, err, tt.fragment)
			}
		})
	}
}

func TestBadPromptDirective(t *testing.T) {
	t.Parallel()
	tests := []string{
		"[sim fail=bogus]",
		"[sim fail=overloaded tool=x]",
		"[sim tool=x times=2]",
		"[sim fail=rate_limit retry_after=soon]",
		"[sim max_tokens=0]",
		"[sim]",
		"[sim Fail=overloaded]",
		"[sim reply]",
	}
	p := newSim(t)
	for _, d := range tests {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			r := call(t, p, ask("m", "please "+d+" thanks"))
			e := r.rtErr(t)
			if e.Kind != llm.KindInvalidRequest || e.StatusCode != 400 {
				t.Errorf("error = %v (status %d), want INVALID_REQUEST 400", e, e.StatusCode)
			}
			if !strings.Contains(e.Message, d) || !errors.Is(e, sim.ErrInvalidDirective) {
				t.Errorf("Message = %q, want it to quote %q (and wrap ErrInvalidDirective)", e.Message, d)
			}
			if len(r.chunks) != 0 {
				t.Errorf("streamed %d chunks before the error", len(r.chunks))
			}
		})
	}
	if got := call(t, p, ask("m", "[simple] brackets [simulation] are text")).text(); !strings.Contains(got, "[simple] brackets [simulation] are text") {
		t.Errorf("text = %q, want the brackets kept as text", got)
	}
}

// toolTurn returns the messages of a turn in which the assistant called
// calls and each got a result.
func toolTurn(calls []llm.ToolCall, contents ...string) []llm.Message {
	a := llm.Message{Role: llm.RoleAssistant}
	res := llm.Message{Role: llm.RoleTool}
	for i, c := range calls {
		a.Parts = append(a.Parts, llm.Part{Kind: llm.PartToolCall, ToolCall: &c})
		res.Parts = append(res.Parts, llm.Part{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{
			CallID: c.ID, Name: c.Name, Content: contents[i],
		}})
	}
	return []llm.Message{a, res}
}

// calls collects the tool calls a call streamed, checking their framing.
func calls(tb testing.TB, r result) []llm.ToolCall {
	tb.Helper()
	var out []llm.ToolCall
	open := -1
	frags := 0
	for _, c := range r.chunks {
		switch c.Kind {
		case llm.ChunkToolCallStart:
			if open != -1 || c.Index != len(out) {
				tb.Fatalf("start of call %d while call %d is open, or out of order", c.Index, open)
			}
			open, frags = c.Index, 0
			out = append(out, llm.ToolCall{ID: c.CallID, Name: c.Name})
		case llm.ChunkToolCallArgs:
			if c.Index != open {
				tb.Fatalf("arguments for call %d while call %d is open", c.Index, open)
			}
			out[open].Arguments += c.Text
			frags++
		case llm.ChunkToolCallEnd:
			if c.Index != open {
				tb.Fatalf("end of call %d while call %d is open", c.Index, open)
			}
			if frags < 2 {
				tb.Errorf("call %d arguments came in %d fragments, want 2 or more", open, frags)
			}
			open = -1
		}
	}
	if open != -1 {
		tb.Fatalf("call %d never ended", open)
	}
	return out
}

func TestToolCalls(t *testing.T) {
	t.Parallel()
	p := newSim(t)
	const prompt = `[sim tool=current_time args={"zone": "UTC"}] [sim tool=weather args={"city":"Oslo","days":[1,2]}] What time is it, and the weather?`
	req := ask("m", prompt)
	r := call(t, p, req)
	if got := r.stop(t); got != llm.StopToolUse {
		t.Fatalf("stop = %v, want tool_use", got)
	}
	got := calls(t, r)
	want := []llm.ToolCall{
		{ID: "call_1", Name: "current_time", Arguments: `{"zone":"UTC"}`},
		{ID: "call_2", Name: "weather", Arguments: `{"city":"Oslo","days":[1,2]}`},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("tool calls (-want +got):\n%s", diff)
	}
	for _, c := range got {
		if !json.Valid([]byte(c.Arguments)) {
			t.Errorf("arguments %q are not JSON", c.Arguments)
		}
	}
	if r.count(llm.ChunkText) != 0 {
		t.Errorf("tool call message has text %q", r.text())
	}
	if u := r.usage(t); u.OutputTokens != int64(r.count(llm.ChunkToolCallArgs)) {
		t.Errorf("output tokens = %d, want one per argument fragment (%d)", u.OutputTokens, r.count(llm.ChunkToolCallArgs))
	}

	// With the results in, the model answers from them instead.
	req.Messages = append(req.Messages, toolTurn(got, `{"time":"12:00Z"}`, "sunny, 21C")...)
	follow := call(t, p, req)
	if got := follow.stop(t); got != llm.StopEndTurn {
		t.Fatalf("follow-up stop = %v, want end_turn", got)
	}
	for _, s := range []string{`{"time":"12:00Z"}`, "sunny, 21C", "current_time", "weather"} {
		if !strings.Contains(follow.text(), s) {
			t.Errorf("follow-up %q does not mention %q", follow.text(), s)
		}
	}
	if follow.count(llm.ChunkToolCallStart) != 0 {
		t.Error("follow-up called tools again")
	}

	// A later question in the same conversation numbers its calls on.
	req.Messages = append(req.Messages, assistant(follow.text()), user("[sim tool=current_time] And now?"))
	if got := calls(t, call(t, p, req)); len(got) != 1 || got[0].ID != "call_3" || got[0].Arguments != "{}" {
		t.Errorf("next turn's calls = %+v, want one call_3 with {}", got)
	}
}

func TestToolSteps(t *testing.T) {
	t.Parallel()
	p := newSim(t)
	req := ask("m", `[sim tool=search args={"q":"turnstile"}] [sim tool=fetch args={"url":"x"} step=2] research`)
	step1 := calls(t, call(t, p, req))
	if len(step1) != 1 || step1[0].Name != "search" {
		t.Fatalf("step 1 calls = %+v, want search", step1)
	}
	req.Messages = append(req.Messages, toolTurn(step1, "found x")...)
	step2 := calls(t, call(t, p, req))
	if len(step2) != 1 || step2[0].Name != "fetch" || step2[0].ID != "call_2" {
		t.Fatalf("step 2 calls = %+v, want fetch as call_2", step2)
	}
	req.Messages = append(req.Messages, toolTurn(step2, "page body")...)
	final := call(t, p, req)
	if final.stop(t) != llm.StopEndTurn || !strings.Contains(final.text(), "found x") || !strings.Contains(final.text(), "page body") {
		t.Errorf("final answer %q, want both results mentioned", final.text())
	}
}

func TestToolResultError(t *testing.T) {
	t.Parallel()
	p := newSim(t)
	c := llm.ToolCall{ID: "call_1", Name: "current_time", Arguments: "{}"}
	msgs := append([]llm.Message{user("[sim tool=current_time] time?")}, toolTurn([]llm.ToolCall{c}, "clock broken")...)
	msgs[2].Parts[0].ToolResult.IsError = true
	if got := call(t, p, &llm.Request{Model: "m", Messages: msgs}).text(); !strings.Contains(got, "failed: clock broken") {
		t.Errorf("answer %q, want the tool failure reported", got)
	}
}

func TestUnpairedToolCalls(t *testing.T) {
	t.Parallel()
	c := llm.ToolCall{ID: "call_1", Name: "t", Arguments: "{}"}
	turn := toolTurn([]llm.ToolCall{c}, "ok")
	tests := map[string][]llm.Message{
		"call without result": {user("q"), turn[0], user("next")},
		"result without call": {user("q"), turn[1]},
		"duplicate call id":   {user("q"), turn[0], turn[1], turn[0], turn[1]},
	}
	for name, msgs := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := call(t, newSim(t), &llm.Request{Model: "m", Messages: msgs}).rtErr(t)
			if e.Kind != llm.KindInvalidRequest || e.StatusCode != 400 || !strings.Contains(e.Message, "call_1") {
				t.Errorf("error = %v, want a 400 invalid request naming call_1", e)
			}
		})
	}
}

func TestThinking(t *testing.T) {
	t.Parallel()
	p := newSim(t)
	r := call(t, p, ask("m", "[sim think] Why?"))
	var reasoning string
	sawSig, sawText := false, false
	for _, c := range r.chunks {
		switch c.Kind {
		case llm.ChunkThinking:
			if sawSig || sawText {
				t.Fatalf("reasoning chunk %+v after the signature or the answer", c)
			}
			if c.Index != 0 {
				t.Errorf("reasoning block index = %d, want 0", c.Index)
			}
			if c.Signature != "" {
				sawSig = true
				continue
			}
			reasoning += c.Text
		case llm.ChunkText:
			if !sawSig {
				t.Fatal("answer before the reasoning's signature")
			}
			sawText = true
		}
	}
	if reasoning == "" || !sawSig || !sawText || r.stop(t) != llm.StopEndTurn {
		t.Fatalf("reasoning %q, signature %v, answer %v: want all three", reasoning, sawSig, sawText)
	}
	if r.count(llm.ChunkThinking) < 3 {
		t.Errorf("reasoning came in %d chunks, want several fragments", r.count(llm.ChunkThinking))
	}
	if got, want := r.usage(t).OutputTokens, int64(r.count(llm.ChunkThinking)-1+r.count(llm.ChunkText)); got != want {
		t.Errorf("output tokens = %d, want %d (reasoning and text)", got, want)
	}

	custom := call(t, p, ask("m", `[sim think="Check the docs first."] [sim reply=Done.] Why?`))
	if diff := cmp.Diff([]llm.Chunk{
		{Kind: llm.ChunkThinking, Text: "Check "},
		{Kind: llm.ChunkThinking, Text: "the "},
		{Kind: llm.ChunkThinking, Text: "docs "},
		{Kind: llm.ChunkThinking, Text: "first."},
		{Kind: llm.ChunkThinking, Signature: custom.chunks[4].Signature},
		{Kind: llm.ChunkText, Text: "Done."},
		{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 14, OutputTokens: 5}},
		{Kind: llm.ChunkStop, Stop: llm.StopEndTurn, Model: "m"},
	}, custom.chunks); diff != "" {
		t.Errorf("chunks (-want +got):\n%s", diff)
	}
	if custom.chunks[4].Signature == "" {
		t.Error("empty signature")
	}
}

func TestRefusal(t *testing.T) {
	t.Parallel()
	p := newSim(t)
	tests := []struct{ prompt, text string }{
		{"[sim refuse] do something bad", "I'm sorry, but I can't help with that request."},
		{`[sim refuse="No."] do something bad`, "No."},
		{`[sim refuse=""] [sim tool=x] do something bad`, ""},
	}
	for _, tt := range tests {
		r := call(t, p, ask("m", tt.prompt))
		if got := r.stop(t); got != llm.StopRefusal || r.text() != tt.text {
			t.Errorf("%s: stop %v, text %q; want refusal, %q", tt.prompt, got, r.text(), tt.text)
		}
	}
}

func TestMaxTokensAndContinuation(t *testing.T) {
	t.Parallel()
	p := newSim(t)
	const q = "Explain how a turnstile counts the people passing through it."
	full := call(t, p, ask("m", q)).text()

	req := ask("m", "[sim max_tokens=6] "+q)
	first := call(t, p, req)
	if got := first.stop(t); got != llm.StopMaxTokens || first.count(llm.ChunkText) != 6 {
		t.Fatalf("first call: stop %v after %d tokens, want max_tokens after 6", got, first.count(llm.ChunkText))
	}
	if first.usage(t).OutputTokens != 6 {
		t.Errorf("output tokens = %d, want 6", first.usage(t).OutputTokens)
	}

	tests := []struct {
		name string
		msgs []llm.Message
	}{
		{"continuation prompt", []llm.Message{assistant(first.text()), user("Continue exactly where you stopped.")}},
		{"trimmed partial", []llm.Message{assistant(strings.TrimSpace(first.text())), user("Please continue.")}},
		{"assistant prefill", []llm.Message{assistant(first.text())}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cont := &llm.Request{Model: "m", Messages: append([]llm.Message{req.Messages[0]}, tt.msgs...)}
			second := call(t, p, cont)
			if got := second.stop(t); got != llm.StopEndTurn {
				t.Fatalf("continuation stop = %v, want end_turn", got)
			}
			if got := first.text() + second.text(); strings.Join(strings.Fields(got), " ") != full {
				t.Errorf("first + continuation = %q, want %q", got, full)
			}
		})
	}

	// Request.MaxOutputTokens caps every call: the reply takes several
	// continuations, deterministically.
	msgs := []llm.Message{user(q)}
	var parts []string
	for i := range 20 {
		r := call(t, p, &llm.Request{Model: "m", Messages: msgs, MaxOutputTokens: 10})
		parts = append(parts, r.text())
		if r.stop(t) == llm.StopEndTurn {
			break
		}
		if r.stop(t) != llm.StopMaxTokens || r.count(llm.ChunkText) != 10 {
			t.Fatalf("call %d: stop %v after %d tokens, want max_tokens after 10", i+1, r.stop(t), r.count(llm.ChunkText))
		}
		msgs = append(msgs, assistant(r.text()), user("Continue."))
	}
	if got := strings.Join(parts, ""); got != full {
		t.Errorf("joined continuations = %q, want %q", got, full)
	}

	// A new question after a complete answer is answered, not continued.
	next := []llm.Message{user(q), assistant(full), user("Thanks! What about revolving doors?")}
	if got, want := call(t, p, &llm.Request{Model: "m", Messages: next}).text(), call(t, p, ask("m", "Thanks! What about revolving doors?")).text(); got != want {
		t.Errorf("next question answered %q, want %q", got, want)
	}
}

func TestToolAnswerContinuation(t *testing.T) {
	t.Parallel()
	p := newSim(t)
	c := llm.ToolCall{ID: "call_1", Name: "current_time", Arguments: "{}"}
	base := append([]llm.Message{user("[sim tool=current_time] [sim max_tokens=4] time?")}, toolTurn([]llm.ToolCall{c}, "noon")...)
	first := call(t, p, &llm.Request{Model: "m", Messages: base})
	if first.stop(t) != llm.StopMaxTokens {
		t.Fatalf("stop = %v, want max_tokens", first.stop(t))
	}
	cont := append(base[:len(base):len(base)], assistant(first.text()), user("Continue."))
	second := call(t, p, &llm.Request{Model: "m", Messages: cont})
	if second.stop(t) != llm.StopEndTurn || !strings.Contains(first.text()+second.text(), "noon") {
		t.Errorf("continued tool answer %q + %q, want it to end the turn and mention noon", first.text(), second.text())
	}
}

func TestStopSequences(t *testing.T) {
	t.Parallel()
	p := newSim(t)
	req := ask("m", `[sim reply="alpha beta STOP gamma"] go`)
	req.StopSequences = []string{"gamma", "STOP"}
	r := call(t, p, req)
	if got := r.stop(t); got != llm.StopSequence || r.text() != "alpha beta " {
		t.Errorf("stop %v, text %q; want stop_sequence, %q", got, r.text(), "alpha beta ")
	}
	req.StopSequences = []string{"ta ST"}
	if r := call(t, p, req); r.stop(t) != llm.StopSequence || r.text() != "alpha be" {
		t.Errorf("mid-token stop: stop %v, text %q; want stop_sequence, %q", r.stop(t), r.text(), "alpha be")
	}
	req.StopSequences = []string{"absent"}
	if r := call(t, p, req); r.stop(t) != llm.StopEndTurn {
		t.Errorf("absent stop sequence: stop %v, want end_turn", r.stop(t))
	}
}

func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	p, err := sim.New("sim", sim.Config{TokenDelay: time.Microsecond, Script: []string{"fail=rate_limit times=5 model=shared"}})
	if err != nil {
		t.Fatal(err)
	}
	const workers, calls = 16, 8
	var (
		mu       sync.Mutex
		failures int
		texts    = map[string]bool{}
		wg       sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for i := range calls {
				model := "shared"
				if i%2 == 1 {
					model = "own"
				}
				r := call(t, p, ask(model, "[sim think] the same question"))
				mu.Lock()
				if r.err != nil {
					failures++
				} else {
					texts[r.text()] = true
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if failures != 5 {
		t.Errorf("%d calls failed, want exactly 5 (times=5 shared by every goroutine)", failures)
	}
	if len(texts) != 1 {
		t.Errorf("%d different answers to one question, want 1", len(texts))
	}
}

// TestHugePromptSmallAnswer: the reply, its reasoning, and the answer after
// a tool quote at most 200 bytes of the question, however long its
// words: a 3 MB prompt must not make a reply larger than an event may be.
func TestHugePromptSmallAnswer(t *testing.T) {
	t.Parallel()
	for name, q := range map[string]string{
		"one word":    strings.Repeat("x", 3<<20),
		"long words":  strings.Repeat(strings.Repeat("y", 300<<10)+" ", 10),
		"many words":  strings.Repeat("word ", 600_000),
		"multibyte":   strings.Repeat("é", 1<<20),
		"with a turn": "[sim think] " + strings.Repeat("z", 3<<20),
	} {
		got := call(t, newSim(t), ask("m", q))
		if n := len(got.text()); n > 500 {
			t.Errorf("%s: a reply of %d bytes", name, n)
		}
		var thinking int
		for _, c := range got.chunks {
			if c.Kind == llm.ChunkThinking {
				thinking += len(c.Text)
			}
		}
		if thinking > 500 {
			t.Errorf("%s: reasoning of %d bytes", name, thinking)
		}
		if !utf8.ValidString(got.text()) {
			t.Errorf("%s: the reply is not valid UTF-8", name)
		}
	}
}
