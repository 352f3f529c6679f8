package runtime_test

import (
	"cmp"
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"iter"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// bySteps is a fake provider that answers each call by the step of the
// turn it is in (the number of tool messages in its conversation): the
// step's reply, streamed word by word. A call that continues a cut reply
// (its conversation ends with the reply's start as an assistant prefill,
// or with it and the continuation prompt) gets the rest of that reply.
// The first call of step failStep fails after streaming its first word,
// once per provider. Unlike a queue of replies, it answers a call made
// again (by a runner that resumed the turn) as it answered the first.
type bySteps struct {
	steps    []string // the text of each step's reply
	calls    []string // the tool call ending a step's reply, as "id name args"; "" for none
	failStep int
	prefill  bool

	mu     sync.Mutex
	failed bool
}

func (p *bySteps) Capabilities(string) llm.Capabilities { return llm.Capabilities{Prefill: p.prefill} }

func (p *bySteps) Stream(ctx context.Context, req *llm.Request) iter.Seq2[llm.Chunk, error] {
	msgs := req.Messages
	step := 0
	for _, m := range msgs {
		if m.Role == llm.RoleTool {
			step++
		}
	}
	text, said := p.steps[step], ""
	switch last := msgs[len(msgs)-1]; {
	case last.Role == llm.RoleAssistant:
		said = last.Text()
	case last.Text() == runtime.ContinuationPrompt:
		said = msgs[len(msgs)-2].Text()
	}
	rest := strings.TrimPrefix(text, said)
	p.mu.Lock()
	fail := step == p.failStep && said == "" && !p.failed
	p.failed = p.failed || fail
	p.mu.Unlock()
	return func(yield func(llm.Chunk, error) bool) {
		for i, w := range strings.SplitAfter(rest, " ") {
			if ctx.Err() != nil {
				yield(llm.Chunk{}, ctx.Err())
				return
			}
			if !yield(llm.Chunk{Kind: llm.ChunkText, Text: w}, nil) {
				return
			}
			if fail && i == 0 {
				yield(llm.Chunk{}, &llm.Error{Kind: llm.KindOverloaded, Message: "overloaded mid-reply"})
				return
			}
		}
		chunks := fake.Text("")[1:] // usage and the end of the turn
		if c := p.calls[step]; c != "" {
			f := strings.SplitN(c, " ", 3)
			chunks = fake.Call(f[0], f[1], f[2])
		}
		for _, c := range chunks {
			if !yield(c, nil) {
				return
			}
		}
	}
}

// TestResumeFromEveryPrefix: a turn (a reply that calls a tool, whose
// result feeds a second reply, whose first call fails mid-stream and is
// retried) is run and its events recorded. Then, for every prefix of
// them, as a runner that went away after storing it would leave them, a
// new runner resumes the turn from ResumeFrom's state and runs it to its
// end: it numbers its events on from the prefix's, emits no TurnStarted,
// and ends as the whole turn did, with the same messages, reason and
// counts of tools, fallbacks and the like; it runs the tool once unless
// its result was stored, and says of a cut call's output what its model's
// on_stream_cut says (dropped, or kept and continued), as
// Runner.ContinuesCut says beforehand.
func TestResumeFromEveryPrefix(t *testing.T) {
	tests := []struct {
		name    string
		cut     runtime.StreamCut
		prefill bool
	}{
		{"restart", runtime.StreamCutRestart, false},
		{"continue with a prompt", runtime.StreamCutContinue, false},
		{"continue from a prefill", runtime.StreamCutContinue, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			provider := func() *bySteps {
				return &bySteps{
					steps:    []string{"Let me look it up. ", "The answer is 42, as the tool says."},
					calls:    []string{`c1 lookup {"q":"answer"}`, ""},
					failStep: 1, prefill: tt.prefill,
				}
			}
			setup := func() (*runtime.Runner, *fake.Tool) {
				lookup := fake.NewTool("lookup", func(_ context.Context, _ llm.ToolCall, progress func(llm.ToolProgress)) (llm.ToolOutput, error) {
					progress(llm.ToolProgress{Message: "looking"})
					return llm.ToolOutput{Content: "42"}, nil
				})
				lookup.ToolSpec.Idempotent = true
				m := model("sim", provider())
				m.OnStreamCut = tt.cut
				return newRunner(t, []*runtime.Model{m}, []llm.Tool{lookup}), lookup
			}
			r, _ := setup()
			whole, done, te := run(t, t.Context(), r, userTurn("what is the answer?"))
			if te != nil {
				t.Fatalf("the whole turn failed: %v", te)
			}
			want := "start | call sim#1 | text | tooldelta | finished | usage | commit assistant | tool lookup | progress | tooldone lookup | commit tool | " +
				"call sim#1 | text | failed OVERLOADED | retry 2/3 OVERLOADED"
			if tt.cut == runtime.StreamCutRestart {
				want += " discard"
			}
			want += " | call sim#2 | text | finished | usage | commit assistant | completed end_turn"
			if got := describeAll(whole); got != want {
				t.Fatalf("the whole turn:\n got %s\nwant %s", got, want)
			}
			if rs, err := runtime.ResumeFrom(whole); rs != nil || err != nil {
				t.Fatalf("ResumeFrom(the whole turn) = %+v, %v; want nil: it ended", rs, err)
			}
			for n := 1; n < len(whole); n++ {
				prefix := whole[:n]
				rs, err := runtime.ResumeFrom(prefix)
				if err != nil || rs == nil {
					t.Fatalf("ResumeFrom(%d events) = %+v, %v", n, rs, err)
				}
				r, lookup := setup()
				req := userTurn("what is the answer?")
				req.Resume = rs
				continues := r.ContinuesCut(req)
				rec := &recorder{}
				res, err := r.Run(t.Context(), req, rec)
				evs := rec.events
				if err != nil {
					t.Fatalf("resumed after %d events (%s): %v\n%s", n, describe(prefix[n-1]), err, describeAll(evs))
				}
				for i, ev := range evs {
					if ev.Seq != uint64(n+1+i) || ev.Terminal() != (i == len(evs)-1) {
						t.Fatalf("resumed after %d events: event %d has seq %d (terminal %v), want %d\n%s", n, i, ev.Seq, ev.Terminal(), n+1+i, describeAll(evs))
					}
					if _, ok := ev.Payload.(*runtime.TurnStarted); ok {
						t.Fatalf("resumed after %d events: a TurnStarted", n)
					}
				}
				if diff := gocmp.Diff(done.Messages, res.Messages); diff != "" || res.Reason != done.Reason {
					t.Errorf("resumed after %d events (%s): ended %s with messages (-whole +resumed):\n%s", n, describe(prefix[n-1]), res.Reason, diff)
				}
				w, g := done.Counters, res.Counters
				if g.ModelCalls < w.ModelCalls || g.Retries < w.Retries || g.ToolCalls != w.ToolCalls || g.ToolErrors != w.ToolErrors ||
					g.Fallbacks != w.Fallbacks || g.Hedges != w.Hedges || g.Compactions != w.Compactions || g.Steered != w.Steered ||
					g.ApprovalsRequested != w.ApprovalsRequested || g.ApprovalsDenied != w.ApprovalsDenied {
					t.Errorf("resumed after %d events: counters %+v, whole turn's %+v", n, g, w)
				}
				if res.Usage.InputTokens < done.Usage.InputTokens {
					t.Errorf("resumed after %d events: usage %+v, whole turn's %+v", n, res.Usage, done.Usage)
				}
				// The tool runs unless its result was stored: once.
				ran, stored := len(lookup.Calls()), slices.ContainsFunc(prefix, func(ev runtime.Event) bool {
					_, ok := ev.Payload.(*runtime.ToolFinished)
					return ok
				})
				if stored && ran != 0 || !stored && ran != 1 {
					t.Errorf("resumed after %d events (%s): the tool ran %d times", n, describe(prefix[n-1]), ran)
				}
				// A cut call's output (streamed since the last commit, and not
				// discarded since) is dropped, or kept to be continued.
				var open uint64
				var text string
				textOnly := true
				for _, ev := range prefix {
					switch p := ev.Payload.(type) {
					case *runtime.TextDelta:
						open = cmp.Or(open, ev.Seq)
						text += p.Text
					case *runtime.ToolCallDelta:
						open = cmp.Or(open, ev.Seq)
						textOnly = false
					case *runtime.MessageCompleted:
						open, text, textOnly = 0, "", true
					case *runtime.Retry:
						if p.DiscardPartial {
							open, text, textOnly = 0, "", true
						}
					}
				}
				retry, ok := evs[0].Payload.(*runtime.Retry)
				if rs.DiscardFromSeq != open || ok != (open != 0) {
					t.Fatalf("resumed after %d events: the output from seq %d is cut, ResumeFrom says %d; first event %s", n, open, rs.DiscardFromSeq, describe(evs[0]))
				}
				if open == 0 {
					if continues {
						t.Errorf("resumed after %d events: ContinuesCut says a reply is continued, and none was cut", n)
					}
					continue
				}
				if !ok {
					t.Fatalf("resumed after %d events within a call's output: first %s, want a retry", n, describe(evs[0]))
				}
				keep := tt.cut == runtime.StreamCutContinue && textOnly
				if retry.DiscardPartial == keep || (!keep && retry.DiscardFromSeq != open) || continues != keep {
					t.Errorf("resumed after %d events: %+v (ContinuesCut %v), want the output from seq %d kept %v", n, retry, continues, open, keep)
				}
				if cut := partsText(rs.Cut); textOnly && cut != text || !textOnly && cut != "" {
					t.Errorf("resumed after %d events: ResumeFrom's cut %q, want %q", n, cut, text)
				}
			}
		})
	}
}

// TestResumeFromTheOutputOfACut: what ResumeFrom keeps of the output of
// the model call a runner that went away left: the text streamed since
// the last commit (through retries that kept it), which a model with
// on_stream_cut: continue goes on from; nothing when reasoning or a tool
// call was streamed, or the output was discarded or committed.
func TestResumeFromTheOutputOfACut(t *testing.T) {
	text := func(s string) runtime.Payload { return &runtime.TextDelta{Text: s} }
	call := &runtime.LLMCallStarted{Model: "sim"}
	thinking := &runtime.ThinkingDelta{Text: "hmm"}
	retry := func(discard bool) runtime.Payload { return &runtime.Retry{DiscardPartial: discard} }
	reply := &runtime.MessageCompleted{Message: llm.Message{Role: llm.RoleAssistant, Parts: []llm.Part{llm.TextPart("Hello")}}}
	tests := []struct {
		name        string
		events      []runtime.Payload
		wantCut     string
		wantDiscard uint64
	}{
		{"text", []runtime.Payload{call, text("Hel"), text("lo ")}, "Hello ", 2},
		{"text kept through a retry", []runtime.Payload{call, text("Hel"), retry(false), call, text("lo ")}, "Hello ", 2},
		{"text discarded by a retry", []runtime.Payload{call, text("Hel"), retry(true), call, text("Hi ")}, "Hi ", 5},
		{"reasoning first", []runtime.Payload{call, thinking, text("Hello")}, "", 2},
		{"committed", []runtime.Payload{call, text("Hello"), reply}, "", 0},
		{"no output", []runtime.Payload{call}, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs, err := runtime.ResumeFrom(events(tt.events...))
			if err != nil {
				t.Fatal(err)
			}
			if cut := partsText(rs.Cut); cut != tt.wantCut || rs.DiscardFromSeq != tt.wantDiscard || rs.NextSeq != uint64(len(tt.events)+1) {
				t.Errorf("cut %q from seq %d, next %d; want %q from %d, next %d", partsText(rs.Cut), rs.DiscardFromSeq, rs.NextSeq, tt.wantCut, tt.wantDiscard, len(tt.events)+1)
			}
		})
	}
}

// TestResumeFromSteering: a turn resumed counts the text of every steering
// message its events hold, committed or not, against turn.max_steer_bytes,
// and queues again those not committed.
func TestResumeFromSteering(t *testing.T) {
	steered := func(texts ...string) runtime.Payload {
		m := llm.Message{Role: llm.RoleUser}
		for _, s := range texts {
			m.Parts = append(m.Parts, llm.TextPart(s))
		}
		return &runtime.Steered{Message: m, RequestID: texts[0]}
	}
	committed := &runtime.MessageCompleted{Message: llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("use staging")}}}
	rs, err := runtime.ResumeFrom(events(steered("use staging"), committed, steered("and ", "hurry")))
	if err != nil {
		t.Fatal(err)
	}
	if rs.SteerBytes != len("use staging")+len("and hurry") || len(rs.Steering) != 1 || rs.Steering[0].Text() != "and hurry" || rs.Counters.Steered != 1 {
		t.Errorf("steer bytes %d, queued %+v, steered %d; want %d, [and hurry], 1", rs.SteerBytes, rs.Steering, rs.Counters.Steered, len("use staging")+len("and hurry"))
	}
	want := []runtime.SteerID{{ID: "use staging", Seq: 1}, {ID: "and ", Seq: 3}}
	if diff := gocmp.Diff(want, rs.SteerIDs); diff != "" {
		t.Errorf("steer ids (-want +got):\n%s", diff)
	}
}

// TestResumeFromApprovalsAndSteering: what ResumeFrom rebuilds of the
// approvals and steering messages a turn's events hold: the decisions
// stored, the requests made (counted once, however often a resumed turn
// emitted them), and the steering messages not yet committed, in order.
func TestResumeFromApprovalsAndSteering(t *testing.T) {
	user := func(s string) llm.Message { return llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(s)}} }
	committed := func(m llm.Message) runtime.Payload { return &runtime.MessageCompleted{Message: m} }
	calls := llm.Message{Role: llm.RoleAssistant, Parts: []llm.Part{
		{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "c1", Name: "deploy", Arguments: "{}"}},
		{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "c2", Name: "deploy", Arguments: "{}"}},
	}}
	requested := func(id string) runtime.Payload { return &runtime.ToolApprovalRequested{CallID: id, Name: "deploy"} }
	denied := &runtime.ToolApprovalDecided{CallID: "c1", Name: "deploy", Reason: "no", DecidedBy: "alice"}
	steered := func(s string) runtime.Payload { return &runtime.Steered{Message: user(s)} }
	rs, err := runtime.ResumeFrom(events(
		&runtime.TurnStarted{Model: "sim"},
		steered("first"),
		committed(user("first")),
		committed(calls),
		requested("c1"), requested("c2"), denied, steered("second"),
		requested("c2"), // emitted again by a runner that resumed the turn
	))
	if err != nil {
		t.Fatal(err)
	}
	c := rs.Counters
	if c.ApprovalsRequested != 2 || c.ApprovalsDenied != 1 || c.Steered != 1 {
		t.Errorf("counters %+v, want 2 requested, 1 denied, 1 steered", c)
	}
	d, ok := rs.Decided["c1"]
	if !ok || d.Approved || d.Reason != "no" || d.DecidedBy != "alice" || d.Seq != 7 || len(rs.Decided) != 1 {
		t.Errorf("decided %+v", rs.Decided)
	}
	if !rs.Requested["c1"] || !rs.Requested["c2"] {
		t.Errorf("requested %v", rs.Requested)
	}
	if len(rs.Steering) != 1 || rs.Steering[0].Text() != "second" {
		t.Errorf("steering %v, want [second]", rs.Steering)
	}
}

// TestResumeFromRefuses: events out of order, and an event that ends the
// turn before the last, are errors; a turn whose last event ends it has
// nothing to resume.
func TestResumeFromRefuses(t *testing.T) {
	call := &runtime.LLMCallStarted{Model: "sim"}
	end := &runtime.TurnCompleted{Reason: runtime.EndTurn}
	gap := events(call, call)
	gap[1].Seq = 3
	if rs, err := runtime.ResumeFrom(gap); err == nil {
		t.Errorf("a gap: %+v, want an error", rs)
	}
	if rs, err := runtime.ResumeFrom(events(call, end)); rs != nil || err != nil {
		t.Errorf("an ended turn: %+v, %v; want nil, nil", rs, err)
	}
	if rs, err := runtime.ResumeFrom(nil); err != nil || rs == nil || rs.NextSeq != 1 {
		t.Errorf("no event: %+v, %v; want a turn to resume from seq 1", rs, err)
	}
}

// TestResumeFromACancelledLog: the events of a cancelled turn. Whole, the
// turn is over (nil). Cut anywhere after the interruption note (the
// runner went away before storing the terminal event), the turn resumed
// ends CANCELLED without calling the model again; cut after the cancelled
// tool results, it commits the note first.
func TestResumeFromACancelledLog(t *testing.T) {
	started := make(chan struct{})
	block := fake.NewTool("block", func(ctx context.Context, _ llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
		close(started)
		<-ctx.Done()
		return llm.ToolOutput{}, ctx.Err()
	})
	p := fake.NewProvider(fake.Reply{Chunks: fake.Call("c1", "block", `{}`)})
	r := newRunner(t, []*runtime.Model{model("sim", p)}, []llm.Tool{block})
	ctx, cancel := context.WithCancelCause(t.Context())
	go func() {
		<-started
		cancel(&llm.Error{Kind: llm.KindCancelled, Message: "the turn was cancelled by CancelTurn"})
	}()
	log, _, te := run(t, ctx, r, userTurn("go"))
	if te == nil || te.Kind != llm.KindCancelled {
		t.Fatalf("the turn ended %v, want CANCELLED", te)
	}
	if rs, err := runtime.ResumeFrom(log); rs != nil || err != nil {
		t.Fatalf("ResumeFrom(the whole log) = %+v, %v; want nil: the turn is over", rs, err)
	}
	tests := []struct {
		name string
		cut  int // events dropped from the end
		want string
	}{
		{"after the note", 1, "error CANCELLED retryable=false"},
		{"after the cancelled results", 2, "commit user | error CANCELLED retryable=false"},
		{"after the running tool's cancelled result", 3, "commit tool | commit user | error CANCELLED retryable=false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stored := log[:len(log)-tt.cut]
			rs, err := runtime.ResumeFrom(stored)
			if err != nil || rs == nil {
				t.Fatalf("ResumeFrom = %+v, %v", rs, err)
			}
			req := userTurn("go")
			req.Resume = rs
			rec := &recorder{}
			_, err = r.Run(t.Context(), req, rec)
			if got := describeAll(rec.events); got != tt.want {
				t.Errorf("resumed: %s, want %s", got, tt.want)
			}
			if te, ok := err.(*runtime.TurnError); !ok || te.Kind != llm.KindCancelled {
				t.Errorf("resumed: %v, want CANCELLED", err)
			}
			if rec.events[0].Seq != uint64(len(stored)+1) {
				t.Errorf("first event seq %d after %d stored", rec.events[0].Seq, len(stored))
			}
			if p.Calls() != 1 {
				t.Errorf("the model was called %d times, want once", p.Calls())
			}
		})
	}
}

// TestFoldDecidesEveryPayload: the fold's switches (fold.add and
// Advances, in fold.go) name every payload type of the package (every type
// with an isPayload method), so a payload added without deciding what a
// resumed turn makes of it, and whether it is progress, fails here, not in
// production, where the fold refuses a payload it does not know.
func TestFoldDecidesEveryPayload(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var payloads []string
	cases := map[string][]string{} // function -> the types its first type switch names
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			if fn.Name.Name == "isPayload" && fn.Recv != nil {
				payloads = append(payloads, typeName(fn.Recv.List[0].Type))
			}
			if fn.Name.Name == "add" && fn.Recv != nil && typeName(fn.Recv.List[0].Type) == "fold" {
				cases["fold.add"] = switchCases(fn.Body)
			}
			if fn.Name.Name == "Advances" && fn.Recv == nil {
				cases["Advances"] = switchCases(fn.Body)
			}
		}
	}
	slices.Sort(payloads)
	if len(payloads) < 20 {
		t.Fatalf("found %d payload types: %v", len(payloads), payloads)
	}
	for _, name := range []string{"fold.add", "Advances"} {
		got := slices.Sorted(slices.Values(cases[name]))
		if diff := gocmp.Diff(payloads, got); diff != "" {
			t.Errorf("%s's switch does not name every payload type (-payloads +cases):\n%s", name, diff)
		}
	}
}

// typeName returns the name of a receiver or case type: T or *T.
func typeName(e ast.Expr) string {
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// switchCases returns the types named by the cases of the first type
// switch in body.
func switchCases(body *ast.BlockStmt) []string {
	var out []string
	ast.Inspect(body, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSwitchStmt)
		if !ok || out != nil {
			return out == nil
		}
		for _, c := range ts.Body.List {
			for _, e := range c.(*ast.CaseClause).List {
				out = append(out, typeName(e))
			}
		}
		return false
	})
	return out
}

// partsText returns the text of parts.
func partsText(parts []llm.Part) string {
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// events returns the events of payloads, numbered from 1.
func events(payloads ...runtime.Payload) []runtime.Event {
	out := make([]runtime.Event, len(payloads))
	for i, p := range payloads {
		out[i] = runtime.Event{Seq: uint64(i + 1), TurnID: "t1", Payload: p}
	}
	return out
}
