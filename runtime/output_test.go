package runtime_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/tools/argcheck"
)

const citySchema = `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}`

func schemaTurn() *runtime.TurnRequest {
	req := userTurn("Where is it?")
	req.OutputSchema = &llm.OutputSchema{Name: "place", Schema: []byte(citySchema)}
	return req
}

func TestOutputInvalidIsCorrected(t *testing.T) {
	p := fake.NewProvider(
		fake.Reply{Chunks: fake.Text(`It is Oslo.`)},
		fake.Reply{Chunks: fake.Text(`{"town":"Oslo"}`)},
		fake.Reply{Chunks: fake.Text(`{"city":"Oslo"}`)},
	)
	m := model("m", p)
	m.Retry.OutputRetries = 2
	r := newRunner(t, []*runtime.Model{m}, nil, runtime.WithOutputSchemas(argcheck.OutputSchemas{}))
	evs, res, terr := run(t, t.Context(), r, schemaTurn())
	if terr != nil {
		t.Fatal(terr)
	}
	want := "start | call m#1 | text | finished | usage | retry 2/3 OUTPUT_INVALID discard | " +
		"call m#2 | text | finished | usage | retry 3/3 OUTPUT_INVALID discard | " +
		"call m#3 | text | finished | usage | commit assistant | completed end_turn"
	if got := describeAll(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	var discards []uint64
	for _, ev := range evs {
		if rt, ok := ev.Payload.(*runtime.Retry); ok {
			discards = append(discards, rt.DiscardFromSeq)
			if !strings.HasPrefix(rt.Message, "the reply does not match the output schema: ") {
				t.Errorf("retry message %q", rt.Message)
			}
		}
	}
	if len(discards) != 2 || discards[0] != 3 || discards[1] != 8 {
		t.Errorf("discard from seqs %v, want [3 8] (each call's first text)", discards)
	}
	// Only the matching reply is committed.
	if len(res.Messages) != 1 || res.Messages[0].Text() != `{"city":"Oslo"}` {
		t.Errorf("committed %+v", res.Messages)
	}
	// Each correction shows the model its reply and what was wrong, after
	// the conversation; the first call has none.
	reqs := p.Requests()
	if len(reqs) != 3 {
		t.Fatalf("%d calls", len(reqs))
	}
	if n := len(reqs[0].Messages); n != 1 {
		t.Errorf("first call has %d messages, want 1", n)
	}
	for i, want := range []struct{ reply, issue string }{
		{`It is Oslo.`, "the reply is not one JSON value"},
		{`{"town":"Oslo"}`, "the reply: missing property 'city'"},
	} {
		msgs := reqs[i+1].Messages
		if len(msgs) != 3 || msgs[1].Role != llm.RoleAssistant || msgs[1].Text() != want.reply ||
			msgs[2].Role != llm.RoleUser || !strings.Contains(msgs[2].Text(), want.issue) {
			t.Errorf("call %d messages = %+v, want the reply %q and a note naming %q", i+2, msgs, want.reply, want.issue)
		}
	}
	for _, req := range reqs {
		if req.OutputSchema == nil || string(req.OutputSchema.Schema) != citySchema {
			t.Errorf("a call went without the output schema: %+v", req.OutputSchema)
		}
	}
}

func TestOutputInvalidFailsAfterItsRetries(t *testing.T) {
	bad := fake.Reply{Chunks: fake.Text(`{"city":7}`)}
	p := fake.NewProvider(bad, bad)
	m := model("m", p, "other")
	m.Retry.OutputRetries = 1
	other := fake.NewProvider(fake.Reply{Chunks: fake.Text(`{"city":"Oslo"}`)})
	r := newRunner(t, []*runtime.Model{m, model("other", other)}, nil, runtime.WithOutputSchemas(argcheck.OutputSchemas{}))
	evs, _, terr := run(t, t.Context(), r, schemaTurn())
	if terr == nil {
		t.Fatal("turn completed")
	}
	want := "start | call m#1 | text | finished | usage | retry 2/2 OUTPUT_INVALID discard | " +
		"call m#2 | text | finished | usage | error OUTPUT_INVALID retryable=false"
	if got := describeAll(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	if terr.Kind != llm.KindOutputInvalid || terr.Retryable == nil || *terr.Retryable || terr.Message != `the reply does not match the output schema: property "city": got number, want string` {
		t.Errorf("error = %+v", terr)
	}
	if other.Calls() != 0 {
		t.Errorf("the fallback was called %d times: an invalid reply does not fall back", other.Calls())
	}
}

func TestOutputSchemaSkipsToolSteps(t *testing.T) {
	// A reply that calls tools is not the final answer: it is not checked.
	p := fake.NewProvider(
		fake.Reply{Chunks: fake.Call("c1", "lookup", `{}`)},
		fake.Reply{Chunks: fake.Text(`{"city":"Oslo"}`)},
	)
	tool := fake.NewTool("lookup", nil)
	r := newRunner(t, []*runtime.Model{model("m", p)}, []llm.Tool{tool}, runtime.WithOutputSchemas(argcheck.OutputSchemas{}))
	_, res, terr := run(t, t.Context(), r, schemaTurn())
	if terr != nil {
		t.Fatal(terr)
	}
	if len(tool.Calls()) != 1 || len(res.Messages) != 3 {
		t.Errorf("tool calls %d, committed %d messages", len(tool.Calls()), len(res.Messages))
	}
}

func TestValidateGenerationOptions(t *testing.T) {
	p := fake.NewProvider()
	tool := fake.NewTool("lookup", nil)
	m := model("m", p)
	m.Tools = []string{} // offered no server tool
	all := model("all", p)
	tests := []struct {
		name    string
		opts    []runtime.Option
		edit    func(*runtime.TurnRequest)
		field   string
		message string
	}{
		{"schema that does not compile", []runtime.Option{runtime.WithOutputSchemas(argcheck.OutputSchemas{})},
			func(r *runtime.TurnRequest) { r.OutputSchema = &llm.OutputSchema{Schema: []byte(`{"type":"nope"}`)} },
			"generation.output_schema.schema", "invalid output schema"},
		{"no schema compiler", nil,
			func(r *runtime.TurnRequest) { r.OutputSchema = &llm.OutputSchema{Schema: []byte(citySchema)} },
			"generation.output_schema", "this server does not validate output schemas"},
		{"tool not offered at all", nil,
			func(r *runtime.TurnRequest) { r.ToolChoice = &llm.ToolChoice{Mode: llm.ToolChoiceTool, Name: "search"} },
			"generation.tool_choice.tool_name", `"search" is not a tool the turn offers`},
		{"server tool the model may not call", nil,
			func(r *runtime.TurnRequest) { r.ToolChoice = &llm.ToolChoice{Mode: llm.ToolChoiceTool, Name: "lookup"} },
			"generation.tool_choice.tool_name", `"lookup" is not a tool the turn offers`},
	}
	for _, tt := range tests {
		r := newRunner(t, []*runtime.Model{m, all}, []llm.Tool{tool}, tt.opts...)
		req := userTurn("hi")
		tt.edit(req)
		err := r.Validate(req)
		var fe *runtime.FieldError
		if !errors.As(err, &fe) || fe.Field != tt.field || !strings.Contains(fe.Description, tt.message) {
			t.Errorf("%s: Validate = %v, want a FieldError on %s saying %q", tt.name, err, tt.field, tt.message)
		}
	}
	// Offered: a client tool, or a server tool of the turn's model.
	r := newRunner(t, []*runtime.Model{m, all}, []llm.Tool{tool})
	for _, req := range []*runtime.TurnRequest{
		{Model: "all", ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceTool, Name: "lookup"}},
		{ClientTools: []llm.ToolSpec{{Name: "ask"}}, ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceTool, Name: "ask"}},
	} {
		if err := r.Validate(req); err != nil {
			t.Errorf("Validate(%+v) = %v", req.ToolChoice, err)
		}
	}
}

func TestGenerationOptionsPerModel(t *testing.T) {
	// The request's reasoning wins over the model's default; a model
	// without one sends none. A named tool a fallback model is not offered
	// is not forced on it.
	first := fake.NewProvider(fake.Reply{Err: &llm.Error{Kind: llm.KindAuth, Message: "bad key"}})
	second := fake.NewProvider(fake.Reply{Chunks: fake.Text("ok")}, fake.Reply{Chunks: fake.Text("ok")})
	a := model("a", first, "b")
	a.Reasoning = &llm.Reasoning{Effort: llm.EffortLow}
	b := model("b", second)
	b.Tools = []string{}
	b.Reasoning = &llm.Reasoning{BudgetTokens: 9000}
	tool := fake.NewTool("lookup", nil)
	r := newRunner(t, []*runtime.Model{a, b}, []llm.Tool{tool})

	req := userTurn("hi")
	req.ToolChoice = &llm.ToolChoice{Mode: llm.ToolChoiceTool, Name: "lookup"}
	req.Metadata = map[string]string{"end_user": "u-1", "other": "x"}
	if _, _, terr := run(t, t.Context(), r, req); terr != nil {
		t.Fatal(terr)
	}
	got := first.Requests()[0]
	if *got.Reasoning != (llm.Reasoning{Effort: llm.EffortLow}) || *got.ToolChoice != *req.ToolChoice || got.EndUser != "u-1" {
		t.Errorf("first model got reasoning %+v, tool choice %+v, end user %q", got.Reasoning, got.ToolChoice, got.EndUser)
	}
	got = second.Requests()[0]
	if *got.Reasoning != (llm.Reasoning{BudgetTokens: 9000}) || got.ToolChoice != nil {
		t.Errorf("fallback got reasoning %+v, tool choice %+v; want its own default and no forced tool it lacks", got.Reasoning, got.ToolChoice)
	}

	req = userTurn("again")
	req.TurnID = "t2"
	req.Model = "b"
	req.Reasoning = &llm.Reasoning{Effort: llm.EffortHigh}
	if _, _, terr := run(t, t.Context(), r, req); terr != nil {
		t.Fatal(terr)
	}
	if got := second.Requests()[1]; *got.Reasoning != (llm.Reasoning{Effort: llm.EffortHigh}) {
		t.Errorf("request's reasoning %+v, want it over the model's", got.Reasoning)
	}
}

func TestOutputSchemaAndContinuedReplies(t *testing.T) {
	cut := func(text string) fake.Reply {
		return fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: text}, {Kind: llm.ChunkStop, Stop: llm.StopMaxTokens}}}
	}
	t.Run("a reply cut by the output limit is validated once continued", func(t *testing.T) {
		p := fake.NewProvider(cut(`{"city":`), fake.Reply{Chunks: fake.Text(`"Oslo"}`)})
		r := newRunner(t, []*runtime.Model{model("m", p)}, nil, runtime.WithOutputSchemas(argcheck.OutputSchemas{}))
		evs, res, terr := run(t, t.Context(), r, schemaTurn())
		if terr != nil {
			t.Fatal(terr)
		}
		want := "start | call m#1 | text | finished | call m#1 | text | finished | usage | commit assistant | completed end_turn"
		if got := describeAll(evs); got != want {
			t.Errorf("events:\n got %s\nwant %s", got, want)
		}
		if res.Messages[0].Text() != `{"city":"Oslo"}` {
			t.Errorf("committed %q", res.Messages[0].Text())
		}
	})
	t.Run("an invalid continued reply is discarded from its start", func(t *testing.T) {
		p := fake.NewProvider(cut(`{"town":`), fake.Reply{Chunks: fake.Text(`"Oslo"}`)}, fake.Reply{Chunks: fake.Text(`{"city":"Oslo"}`)})
		m := model("m", p)
		m.Retry.OutputRetries = 1
		r := newRunner(t, []*runtime.Model{m}, nil, runtime.WithOutputSchemas(argcheck.OutputSchemas{}))
		evs, res, terr := run(t, t.Context(), r, schemaTurn())
		if terr != nil {
			t.Fatal(terr)
		}
		want := "start | call m#1 | text | finished | call m#1 | text | finished | usage | retry 2/2 OUTPUT_INVALID discard | " +
			"call m#2 | text | finished | usage | commit assistant | completed end_turn"
		if got := describeAll(evs); got != want {
			t.Errorf("events:\n got %s\nwant %s", got, want)
		}
		for _, ev := range evs {
			if rt, ok := ev.Payload.(*runtime.Retry); ok && rt.DiscardFromSeq != 3 {
				t.Errorf("discard from seq %d, want 3: the first part of the continued reply", rt.DiscardFromSeq)
			}
		}
		if len(res.Messages) != 1 || res.Messages[0].Text() != `{"city":"Oslo"}` {
			t.Errorf("committed %+v", res.Messages)
		}
		// The correction shows the whole reply, and no continuation.
		last := p.Requests()[2].Messages
		if len(last) != 3 || last[1].Text() != `{"town":"Oslo"}` {
			t.Errorf("correction call's messages %+v", last)
		}
	})
}
