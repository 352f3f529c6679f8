package runtime_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// render renders a message compactly: its role, then each part (text
// quoted, a tool call by id, a result by id, content and error flag).
func render(m llm.Message) string {
	out := []string{m.Role.String()}
	for _, p := range m.Parts {
		switch p.Kind {
		case llm.PartText:
			out = append(out, sprintf("%q", p.Text))
		case llm.PartThinking:
			out = append(out, sprintf("thinking %q", p.Text))
		case llm.PartToolCall:
			out = append(out, sprintf("call %s %s", p.ToolCall.ID, p.ToolCall.Arguments))
		case llm.PartToolResult:
			r := p.ToolResult
			c := sprintf("%q", r.Content)
			if r.Content == runtime.CancelledToolResult {
				c = "cancelled"
			}
			out = append(out, sprintf("result %s %s error=%v", r.CallID, c, r.IsError))
		}
	}
	return strings.Join(out, " ")
}

// TestCancelCommits holds the rules of what a cancelled turn commits:
// the reply cut short as far as it got (complete tool calls only), a
// result for every call of the last reply left without one (the real one
// when its tool finished), and the user's interruption note; the same
// stop for another reason commits nothing.
func TestCancelCommits(t *testing.T) {
	cancelled := &llm.Error{Kind: llm.KindCancelled, Message: "the turn was cancelled by CancelTurn"}
	blocking := func(started chan<- struct{}) *fake.Tool {
		return fake.NewTool("block", func(ctx context.Context, _ llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
			close(started)
			<-ctx.Done()
			return llm.ToolOutput{}, ctx.Err()
		})
	}
	textChunk := func(s string) llm.Chunk { return llm.Chunk{Kind: llm.ChunkText, Text: s} }
	tests := []struct {
		name    string
		replies []fake.Reply
		// tools makes the server-side tools; started is closed when the
		// blocking one runs.
		tools  func(started chan struct{}) []llm.Tool
		client []llm.ToolSpec // client-side tools
		edit   func(*runtime.Model)
		// at says which event the cancel comes right after.
		at    func(runtime.Event) bool
		cause error
		// want is the event sequence; one of them when parallel tools
		// may start in either order.
		want     []string
		messages []string // the messages the turn commits, rendered
	}{
		{
			name:     "before any output",
			replies:  []fake.Reply{{Hang: true}},
			at:       is[*runtime.LLMCallStarted],
			want:     []string{"start | call a#1 | commit user | error CANCELLED retryable=false"},
			messages: []string{`user "[Request interrupted by user]"`},
		},
		{
			name:     "mid-reply",
			replies:  []fake.Reply{{Chunks: []llm.Chunk{textChunk("Hel"), textChunk("lo, wor")}, Hang: true}},
			at:       nth[*runtime.TextDelta](2),
			want:     []string{"start | call a#1 | text | commit assistant | commit user | error CANCELLED retryable=false"},
			messages: []string{`assistant "Hello, wor"`, `user "[Request interrupted by user]"`},
		},
		{
			name: "mid-reply with a complete and an incomplete tool call",
			replies: []fake.Reply{{Chunks: []llm.Chunk{
				textChunk("Let me look."),
				{Kind: llm.ChunkToolCallStart, Index: 0, CallID: "c1", Name: "lookup"},
				{Kind: llm.ChunkToolCallArgs, Index: 0, Text: `{"q":"a"}`},
				{Kind: llm.ChunkToolCallEnd, Index: 0},
				{Kind: llm.ChunkToolCallStart, Index: 1, CallID: "c2", Name: "lookup"},
				{Kind: llm.ChunkToolCallArgs, Index: 1, Text: `{"q":`},
			}, Hang: true}},
			tools: func(chan struct{}) []llm.Tool { return []llm.Tool{fake.NewTool("lookup", nil)} },
			at: func(ev runtime.Event) bool {
				d, ok := ev.Payload.(*runtime.ToolCallDelta)
				return ok && d.ArgumentsDelta == `{"q":`
			},
			want: []string{"start | call a#1 | text | tooldelta | commit assistant | commit tool | commit user | error CANCELLED retryable=false"},
			messages: []string{
				`assistant "Let me look." call c1 {"q":"a"}`,
				`tool result c1 cancelled error=true`,
				`user "[Request interrupted by user for tool use]"`,
			},
		},
		{
			name:     "reasoning only",
			replies:  []fake.Reply{{Chunks: []llm.Chunk{{Kind: llm.ChunkThinking, Text: "hmm"}}, Hang: true}},
			at:       is[*runtime.ThinkingDelta],
			want:     []string{"start | call a#1 | thinking | commit user | error CANCELLED retryable=false"},
			messages: []string{`user "[Request interrupted by user]"`},
		},
		{
			name:     "blank text",
			replies:  []fake.Reply{{Chunks: []llm.Chunk{textChunk(" \n")}, Hang: true}},
			at:       is[*runtime.TextDelta],
			want:     []string{"start | call a#1 | text | commit user | error CANCELLED retryable=false"},
			messages: []string{`user "[Request interrupted by user]"`},
		},
		{
			name:    "during a retry's backoff",
			replies: []fake.Reply{{Err: providerErr(llm.KindServerError, 0)}},
			edit: func(m *runtime.Model) {
				m.Retry.InitialBackoff, m.Retry.MaxBackoff = time.Minute, time.Minute
			},
			at:       is[*runtime.Retry],
			want:     []string{"start | call a#1 | failed SERVER_ERROR | retry 2/3 SERVER_ERROR | commit user | error CANCELLED retryable=false"},
			messages: []string{`user "[Request interrupted by user]"`},
		},
		{
			name:    "during a retry's backoff, the cut reply kept to continue",
			replies: []fake.Reply{{Chunks: []llm.Chunk{textChunk("Kept so far")}, Err: providerErr(llm.KindStreamInterrupted, 0)}},
			edit: func(m *runtime.Model) {
				m.Retry.InitialBackoff, m.Retry.MaxBackoff = time.Minute, time.Minute
				m.OnStreamCut = runtime.StreamCutContinue
			},
			at:       is[*runtime.Retry],
			want:     []string{"start | call a#1 | text | failed STREAM_INTERRUPTED | retry 2/3 STREAM_INTERRUPTED | commit assistant | commit user | error CANCELLED retryable=false"},
			messages: []string{`assistant "Kept so far"`, `user "[Request interrupted by user]"`},
		},
		{
			name: "continuing a reply cut by the output limit",
			replies: []fake.Reply{
				{Chunks: []llm.Chunk{textChunk("Part one, "), {Kind: llm.ChunkStop, Stop: llm.StopMaxTokens}}},
				{Chunks: []llm.Chunk{textChunk("part two")}, Hang: true},
			},
			at:       nth[*runtime.TextDelta](2),
			want:     []string{"start | call a#1 | text | finished | call a#1 | text | commit assistant | commit user | error CANCELLED retryable=false"},
			messages: []string{`assistant "Part one, part two"`, `user "[Request interrupted by user]"`},
		},
		{
			name: "mid-tool, a parallel call finished",
			replies: []fake.Reply{{Chunks: []llm.Chunk{
				{Kind: llm.ChunkToolCallStart, Index: 0, CallID: "c1", Name: "fast"},
				{Kind: llm.ChunkToolCallEnd, Index: 0},
				{Kind: llm.ChunkToolCallStart, Index: 1, CallID: "c2", Name: "block"},
				{Kind: llm.ChunkToolCallEnd, Index: 1},
				{Kind: llm.ChunkStop, Stop: llm.StopToolUse},
			}}},
			tools: func(started chan struct{}) []llm.Tool {
				fast := fake.NewTool("fast", func(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error) {
					<-started // finishes while block runs
					return llm.ToolOutput{Content: "42"}, nil
				})
				return []llm.Tool{fast, blocking(started)}
			},
			at: func(ev runtime.Event) bool {
				f, ok := ev.Payload.(*runtime.ToolFinished)
				return ok && f.Name == "fast"
			},
			want: []string{
				"start | call a#1 | tooldelta | finished | commit assistant | tool fast | tool block | tooldone fast | toolerr block | commit tool | commit user | error CANCELLED retryable=false",
				"start | call a#1 | tooldelta | finished | commit assistant | tool block | tool fast | tooldone fast | toolerr block | commit tool | commit user | error CANCELLED retryable=false",
			},
			messages: []string{
				`assistant call c1 {} call c2 {}`,
				`tool result c1 "42" error=false result c2 cancelled error=true`,
				`user "[Request interrupted by user for tool use]"`,
			},
		},
		{
			name: "mid-tool, beside a client tool call",
			replies: []fake.Reply{{Chunks: []llm.Chunk{
				{Kind: llm.ChunkToolCallStart, Index: 0, CallID: "c1", Name: "ask"},
				{Kind: llm.ChunkToolCallEnd, Index: 0},
				{Kind: llm.ChunkToolCallStart, Index: 1, CallID: "c2", Name: "block"},
				{Kind: llm.ChunkToolCallEnd, Index: 1},
				{Kind: llm.ChunkStop, Stop: llm.StopToolUse},
			}}},
			tools:  func(started chan struct{}) []llm.Tool { return []llm.Tool{blocking(started)} },
			client: []llm.ToolSpec{{Name: "ask"}},
			at:     is[*runtime.ToolStarted],
			want:   []string{"start | call a#1 | tooldelta | finished | commit assistant | tool block | toolerr block | commit tool | commit user | error CANCELLED retryable=false"},
			messages: []string{
				`assistant call c1 {} call c2 {}`,
				`tool result c1 cancelled error=true result c2 cancelled error=true`,
				`user "[Request interrupted by user for tool use]"`,
			},
		},
		{
			name:    "between steps",
			replies: []fake.Reply{{Chunks: fake.Call("c1", "lookup", `{}`)}, {Hang: true}},
			tools:   func(chan struct{}) []llm.Tool { return []llm.Tool{fake.NewTool("lookup", nil)} },
			at:      nth[*runtime.LLMCallStarted](2),
			want:    []string{"start | call a#1 | tooldelta | finished | usage | commit assistant | tool lookup | tooldone lookup | commit tool | call a#1 | commit user | error CANCELLED retryable=false"},
			messages: []string{
				`assistant call c1 {}`,
				`tool result c1 "{\"ok\":true}" error=false`,
				`user "[Request interrupted by user]"`,
			},
		},
		{
			name:    "a deadline is not a cancel",
			replies: []fake.Reply{{Chunks: []llm.Chunk{textChunk("Hello")}, Hang: true}},
			at:      is[*runtime.TextDelta],
			cause:   &llm.Error{Kind: llm.KindDeadlineExceeded, Message: "the turn's deadline passed"},
			want:    []string{"start | call a#1 | text | error DEADLINE_EXCEEDED retryable=false"},
		},
		{
			name:    "a shutdown is not a cancel",
			replies: []fake.Reply{{Chunks: []llm.Chunk{textChunk("Hello")}, Hang: true}},
			at:      is[*runtime.TextDelta],
			cause:   &llm.Error{Kind: llm.KindUnavailable, Message: "the server is shutting down; retry the turn"},
			want:    []string{"start | call a#1 | text | error UNAVAILABLE retryable=true"},
		},
		{
			name:     "a plain context cancel is a cancel",
			replies:  []fake.Reply{{Chunks: []llm.Chunk{textChunk("Hello")}, Hang: true}},
			at:       is[*runtime.TextDelta],
			cause:    context.Canceled,
			want:     []string{"start | call a#1 | text | commit assistant | commit user | error CANCELLED retryable=false"},
			messages: []string{`assistant "Hello"`, `user "[Request interrupted by user]"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := fake.NewProvider(tt.replies...)
			m := model("a", p)
			if tt.edit != nil {
				tt.edit(m)
			}
			started := make(chan struct{})
			var tools []llm.Tool
			if tt.tools != nil {
				tools = tt.tools(started)
			}
			r := newRunner(t, []*runtime.Model{m}, tools)
			cause := tt.cause
			if cause == nil {
				cause = cancelled
			}
			ctx, cancel := context.WithCancelCause(t.Context())
			defer cancel(nil)
			rec := &recorder{}
			sink := runtime.SinkFunc(func(ctx context.Context, ev runtime.Event) error {
				err := rec.Emit(ctx, ev)
				if tt.at(ev) {
					cancel(cause)
				}
				return err
			})
			req := userTurn("hi")
			req.ClientTools = tt.client
			_, err := r.Run(ctx, req, sink)
			checkSequence(t, rec.events)
			got := describeAll(rec.events)
			found := false
			for _, w := range tt.want {
				found = found || got == w
			}
			if !found {
				t.Errorf("events:\n got %s\nwant %s", got, strings.Join(tt.want, "\n  or "))
			}
			te, ok := err.(*runtime.TurnError)
			if last := rec.events[len(rec.events)-1].Payload; !ok || last != te {
				t.Fatalf("Run returned %v, last event %v", err, last)
			}
			var msgs []string
			for _, ev := range rec.events {
				if mc, ok := ev.Payload.(*runtime.MessageCompleted); ok {
					msgs = append(msgs, render(mc.Message))
				}
			}
			// The messages committed before the cancel are not the
			// cancel's; the table lists them too.
			if strings.Join(msgs, "\n") != strings.Join(tt.messages, "\n") {
				t.Errorf("messages:\n got %s\nwant %s", strings.Join(msgs, "\n     "), strings.Join(tt.messages, "\n     "))
			}
			for _, ev := range rec.events {
				if f, ok := ev.Payload.(*runtime.ToolFinished); ok && f.Name == "block" && (f.Content != runtime.CancelledToolResult || !f.IsError) {
					t.Errorf("the cancelled tool finished with %q (error %v)", f.Content, f.IsError)
				}
			}
		})
	}
}

// TestCancelledConversationContinues: the next turn, sent with the
// conversation plus what the cancelled turn committed, shows the model
// its cut reply, the cancelled calls and the note.
func TestCancelledConversationContinues(t *testing.T) {
	started := make(chan struct{})
	p := fake.NewProvider(fake.Reply{Chunks: fake.Call("c1", "block", `{"x":1}`)}, fake.Reply{Chunks: fake.Text("Stopped, as you asked.")})
	r := newRunner(t, []*runtime.Model{model("a", p)}, []llm.Tool{fake.NewTool("block", func(ctx context.Context, _ llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
		close(started)
		<-ctx.Done()
		return llm.ToolOutput{}, ctx.Err()
	})})
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-started
		cancel()
	}()
	events, _, te := run(t, ctx, r, userTurn("run it"))
	if te == nil || te.Kind != llm.KindCancelled {
		t.Fatalf("the turn ended with %v, want CANCELLED", te)
	}
	req := userTurn("run it")
	for _, ev := range events {
		if mc, ok := ev.Payload.(*runtime.MessageCompleted); ok {
			req.Messages = append(req.Messages, mc.Message)
		}
	}
	req.Messages = append(req.Messages, llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("why did you stop?")}})
	if _, res, te := run(t, t.Context(), r, req); te != nil || res.Reason != runtime.EndTurn {
		t.Fatalf("the next turn: %v", te)
	}
	var got []string
	for _, m := range p.Requests()[1].Messages {
		got = append(got, render(m))
	}
	want := []string{
		`user "run it"`,
		`assistant call c1 {"x":1}`,
		`tool result c1 cancelled error=true`,
		`user "[Request interrupted by user for tool use]"`,
		`user "why did you stop?"`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the model saw:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// is reports whether an event's payload is a P.
func is[P runtime.Payload](ev runtime.Event) bool {
	_, ok := ev.Payload.(P)
	return ok
}

// nth returns a test of whether an event is the n-th whose payload is a P.
func nth[P runtime.Payload](n int) func(runtime.Event) bool {
	seen := 0
	return func(ev runtime.Event) bool {
		if is[P](ev) {
			seen++
			return seen == n
		}
		return false
	}
}

// TestCancelledResumeKeepsStoredResults: a resumed turn cancelled before
// it goes on answers its last reply's calls with the results its log
// stored, and only the others with the cancelled one.
func TestCancelledResumeKeepsStoredResults(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: fake.Text("never")})
	deploy := fake.NewTool("deploy", nil)
	r := newRunner(t, []*runtime.Model{model("a", p)}, []llm.Tool{deploy})
	call := func(id string) llm.Part {
		return llm.Part{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: id, Name: "deploy", Arguments: `{}`}}
	}
	req := userTurn("deploy both")
	req.Resume = &runtime.Resume{
		NextSeq: 9, LastStop: llm.StopToolUse,
		Committed:   []llm.Message{{Role: llm.RoleAssistant, Parts: []llm.Part{call("c1"), call("c2")}}},
		ToolResults: map[string]llm.ToolResult{"c1": {CallID: "c1", Name: "deploy", Content: "deployed"}},
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	rec := &recorder{}
	_, err := r.Run(ctx, req, rec)
	if te, ok := err.(*runtime.TurnError); !ok || te.Kind != llm.KindCancelled {
		t.Fatalf("Run = %v, want CANCELLED", err)
	}
	var msgs []string
	for _, ev := range rec.events {
		if mc, ok := ev.Payload.(*runtime.MessageCompleted); ok {
			msgs = append(msgs, render(mc.Message))
		}
	}
	want := []string{`tool result c1 "deployed" error=false result c2 cancelled error=true`, `user "[Request interrupted by user for tool use]"`}
	if strings.Join(msgs, "\n") != strings.Join(want, "\n") {
		t.Errorf("messages:\n got %s\nwant %s", strings.Join(msgs, "\n     "), strings.Join(want, "\n     "))
	}
	if got := describeAll(rec.events); got != "commit tool | commit user | error CANCELLED retryable=false" {
		t.Errorf("events: %s", got)
	}
	if p.Calls() != 0 || len(deploy.Calls()) != 0 {
		t.Errorf("the model was called %d times, the tool %d times; want neither", p.Calls(), len(deploy.Calls()))
	}
}

// TestCancelDoesNotWaitForAToolThatIgnoresIt: a tool that ignores its
// context does not hold a cancelled turn: the turn ends, closing its
// conversation, while the tool still runs, and its late result is
// dropped.
func TestCancelDoesNotWaitForAToolThatIgnoresIt(t *testing.T) {
	started, release, returned := make(chan struct{}), make(chan struct{}), make(chan struct{})
	stubborn := fake.NewTool("stubborn", func(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error) {
		defer close(returned)
		close(started)
		<-release
		return llm.ToolOutput{Content: "too late"}, nil
	})
	defer func() {
		close(release)
		<-returned
	}()
	p := fake.NewProvider(fake.Reply{Chunks: fake.Call("c1", "stubborn", `{}`)})
	r := newRunner(t, []*runtime.Model{model("a", p)}, []llm.Tool{stubborn})
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-started
		cancel()
	}()
	evs, _, te := run(t, ctx, r, userTurn("go"))
	select {
	case <-returned:
		t.Fatal("the tool returned before the turn ended: the test proves nothing")
	default:
	}
	if te == nil || te.Kind != llm.KindCancelled {
		t.Fatalf("the turn ended with %v, want CANCELLED", te)
	}
	if got, want := describeAll(evs), "start | call a#1 | tooldelta | finished | usage | commit assistant | tool stubborn | toolerr stubborn | commit tool | commit user | error CANCELLED retryable=false"; got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
}

// TestCancelCauseLeftAsIs cancels two turns at once, mid-reply, with one
// *llm.Error as the cause, as a server stopping cancels every turn it
// runs: each turn ends with the cause's class, and the cause itself is not
// written to (the turns' goroutines raced to write their model into it).
func TestCancelCauseLeftAsIs(t *testing.T) {
	cause := &llm.Error{Kind: llm.KindUnavailable, Message: "the server is shutting down"}
	hang := fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "..."}}, Hang: true}
	var wg sync.WaitGroup
	for _, alias := range []string{"a", "b"} {
		r := newRunner(t, []*runtime.Model{model(alias, fake.NewProvider(hang))}, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancelCause(t.Context())
			defer cancel(nil)
			sink := runtime.SinkFunc(func(_ context.Context, ev runtime.Event) error {
				if _, ok := ev.Payload.(*runtime.TextDelta); ok {
					cancel(cause)
				}
				return nil
			})
			_, err := r.Run(ctx, userTurn("hi"), sink)
			if te, ok := err.(*runtime.TurnError); !ok || te.Kind != llm.KindUnavailable || te.Message != cause.Message {
				t.Errorf("turn on %s: %v, want the cause's UNAVAILABLE", alias, err)
			}
		}()
	}
	wg.Wait()
	if cause.Model != "" || cause.Provider != "" {
		t.Errorf("the cause was written to: model %q, provider %q", cause.Model, cause.Provider)
	}
}
