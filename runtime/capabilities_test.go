package runtime_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

func stops(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("END%d", i)
	}
	return out
}

// TestValidateOptionLimits: a request the model cannot take is refused
// before the turn, each problem naming the field, the model's limit and
// the key that sets it; options the model is not sent are not checked;
// the configuration's capabilities replace the provider's.
func TestValidateOptionLimits(t *testing.T) {
	t.Parallel()
	temp, hot, topP := 0.5, 1.5, 0.9
	tests := []struct {
		name     string
		caps     llm.Capabilities
		override *runtime.CapabilitiesConfig
		req      runtime.TurnRequest
		want     []string
	}{
		{"stop sequences over the limit", llm.Capabilities{MaxStopSequences: new(4)}, nil,
			runtime.TurnRequest{StopSequences: stops(5)},
			[]string{`generation.stop_sequences: model "a" takes at most 4 stop sequences, got 5 (models.a.capabilities.max_stop_sequences)`}},
		{"stop sequences at the limit", llm.Capabilities{MaxStopSequences: new(5)}, nil,
			runtime.TurnRequest{StopSequences: stops(5)}, nil},
		{"no stop sequences taken", llm.Capabilities{MaxStopSequences: new(0)}, nil,
			runtime.TurnRequest{StopSequences: stops(1)},
			[]string{`generation.stop_sequences: model "a" takes no stop sequences (models.a.capabilities.max_stop_sequences)`}},
		{"temperature over the limit", llm.Capabilities{MaxTemperature: new(1.0)}, nil,
			runtime.TurnRequest{Temperature: &hot},
			[]string{`generation.temperature: model "a" takes a temperature from 0 to 1, got 1.5 (models.a.capabilities.max_temperature)`}},
		{"temperature never sent is not checked", llm.Capabilities{MaxTemperature: new(1.0), Sampling: llm.SamplingNever}, nil,
			runtime.TurnRequest{Temperature: &hot}, nil},
		{"temperature not sent while reasoning is not checked", llm.Capabilities{MaxTemperature: new(1.0), Sampling: llm.SamplingUnlessReasoning}, nil,
			runtime.TurnRequest{Temperature: &hot, Reasoning: &llm.Reasoning{Effort: llm.EffortLow}}, nil},
		{"temperature checked on a model that does not reason", llm.Capabilities{MaxTemperature: new(1.0), Sampling: llm.SamplingUnlessReasoning, Thinking: llm.ThinkingNone}, nil,
			runtime.TurnRequest{Temperature: &hot, Reasoning: &llm.Reasoning{Effort: llm.EffortLow}},
			[]string{`generation.temperature: model "a" takes a temperature from 0 to 1, got 1.5 (models.a.capabilities.max_temperature)`}},
		{"temperature and top_p where one is taken", llm.Capabilities{TemperatureOrTopP: true}, nil,
			runtime.TurnRequest{Temperature: &temp, TopP: &topP},
			[]string{`generation.top_p: model "a" takes temperature or top_p, not both (models.a.capabilities.temperature_or_top_p)`}},
		{"every problem at once", llm.Capabilities{MaxStopSequences: new(4), MaxTemperature: new(1.0), TemperatureOrTopP: true}, nil,
			runtime.TurnRequest{StopSequences: stops(8), Temperature: &hot, TopP: &topP},
			[]string{
				`generation.stop_sequences: model "a" takes at most 4 stop sequences, got 8 (models.a.capabilities.max_stop_sequences)`,
				`generation.temperature: model "a" takes a temperature from 0 to 1, got 1.5 (models.a.capabilities.max_temperature)`,
				`generation.top_p: model "a" takes temperature or top_p, not both (models.a.capabilities.temperature_or_top_p)`,
			}},
		{"the configuration raises a limit", llm.Capabilities{MaxStopSequences: new(4)}, &runtime.CapabilitiesConfig{MaxStopSequences: new(8)},
			runtime.TurnRequest{StopSequences: stops(8)}, nil},
		{"the configuration sets a limit the provider does not know", llm.Capabilities{}, &runtime.CapabilitiesConfig{MaxTemperature: new(1.0)},
			runtime.TurnRequest{Temperature: &hot},
			[]string{`generation.temperature: model "a" takes a temperature from 0 to 1, got 1.5 (models.a.capabilities.max_temperature)`}},
		{"a provider that says nothing takes everything", llm.Capabilities{}, nil,
			runtime.TurnRequest{StopSequences: stops(8), Temperature: &hot, TopP: &topP}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := fake.NewProvider(fake.Reply{Chunks: fake.Text("ok")})
			p.Caps = tt.caps
			m := model("a", p)
			m.Capabilities = tt.override
			r := newRunner(t, []*runtime.Model{m}, nil)
			req := tt.req
			req.Messages = userTurn("hi").Messages
			var got []string
			if err := r.Validate(&req); err != nil {
				for e := range strings.SplitSeq(err.Error(), "\n") {
					got = append(got, e)
				}
				var fe *runtime.FieldError
				if !errors.As(err, &fe) {
					t.Errorf("%v holds no *runtime.FieldError", err)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
		})
	}
}

// TestValidateEveryDeployment: every deployment of the model asked for is
// held to its own provider's limits, and a problem names the deployment.
func TestValidateEveryDeployment(t *testing.T) {
	t.Parallel()
	loose, strict := fake.NewProvider(fake.Reply{Chunks: fake.Text("ok")}), fake.NewProvider(fake.Reply{Chunks: fake.Text("ok")})
	strict.Caps.MaxStopSequences = new(4)
	m := &runtime.Model{Alias: "a", Retry: fastRetry(), Deployments: []runtime.Deployment{
		{Name: "east", ProviderName: "loose", Provider: loose, ID: "x"},
		{Name: "west", ProviderName: "strict", Provider: strict, ID: "y"},
	}}
	r := newRunner(t, []*runtime.Model{m}, nil)
	req := userTurn("hi")
	req.StopSequences = stops(5)
	want := `generation.stop_sequences: model "a" (deployment "west") takes at most 4 stop sequences, got 5 (models.a.capabilities.max_stop_sequences)`
	if err := r.Validate(req); err == nil || err.Error() != want {
		t.Errorf("Validate = %v, want %s", err, want)
	}
}

// TestFallbackSkipsModelsThatCannotTakeTheOptions: a fallback that cannot
// take the request's generation options is skipped, as one that cannot
// take its media is: the turn moves on to the next.
func TestFallbackSkipsModelsThatCannotTakeTheOptions(t *testing.T) {
	t.Parallel()
	a := fake.NewProvider(fake.Reply{Err: &llm.Error{Kind: llm.KindNotFound, Message: "no such model"}})
	b := fake.NewProvider(fake.Reply{Chunks: fake.Text("from b")})
	b.Caps.MaxStopSequences = new(4)
	c := fake.NewProvider(fake.Reply{Chunks: fake.Text("from c")})
	r := newRunner(t, []*runtime.Model{model("a", a, "b", "c"), model("b", b), model("c", c)}, nil)
	req := userTurn("hi")
	req.StopSequences = stops(5)
	_, res, terr := run(t, t.Context(), r, req)
	if terr != nil {
		t.Fatal(terr)
	}
	if b.Calls() != 0 || c.Calls() != 1 || res.Messages[0].Text() != "from c" {
		t.Errorf("b called %d times, c %d; committed %q", b.Calls(), c.Calls(), res.Messages[0].Text())
	}
}

// TestRequestCarriesCapabilities: each call carries what its model takes,
// the configuration over the provider's, and the sampling options it may
// send: the model's default top_p when the request sets none, unless the
// request's temperature displaces it on a model that takes one of the two.
func TestRequestCarriesCapabilities(t *testing.T) {
	t.Parallel()
	temp, topP, defaultTopP := 0.2, 0.5, 0.9
	tests := []struct {
		name            string
		caps            llm.Capabilities
		req             runtime.TurnRequest
		wantTemp, wantP *float64
	}{
		{"the model's top_p", llm.Capabilities{}, runtime.TurnRequest{Temperature: &temp}, &temp, &defaultTopP},
		{"the request's top_p", llm.Capabilities{}, runtime.TurnRequest{TopP: &topP}, nil, &topP},
		{"a temperature displaces the model's top_p", llm.Capabilities{TemperatureOrTopP: true}, runtime.TurnRequest{Temperature: &temp}, &temp, nil},
		{"the model's top_p alone", llm.Capabilities{TemperatureOrTopP: true}, runtime.TurnRequest{}, nil, &defaultTopP},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := fake.NewProvider(fake.Reply{Chunks: fake.Text("ok")})
			p.Caps = tt.caps
			p.Caps.Signer = "fake"
			m := model("a", p)
			m.TopP = &defaultTopP
			m.Capabilities = &runtime.CapabilitiesConfig{Thinking: "adaptive", Prefill: new(true), SignedCalls: new(true)}
			r := newRunner(t, []*runtime.Model{m}, nil)
			req := tt.req
			req.Messages = userTurn("hi").Messages
			if _, _, terr := run(t, t.Context(), r, &req); terr != nil {
				t.Fatal(terr)
			}
			got := p.Requests()[0]
			if diff := cmp.Diff(tt.wantTemp, got.Temperature); diff != "" {
				t.Errorf("temperature (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantP, got.TopP); diff != "" {
				t.Errorf("top_p (-want +got):\n%s", diff)
			}
			want := tt.caps
			want.Signer, want.Thinking, want.Prefill, want.SignedCalls = "fake", llm.ThinkingAdaptive, true, true
			if diff := cmp.Diff(&want, got.Capabilities); diff != "" {
				t.Errorf("capabilities (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCallIDsUniqueInConversation: a tool call the model sends without an
// id, or with one the conversation or the reply already holds (Gemini 2.5
// sends none; a server that numbers calls per reply repeats them), gets a
// new id, so the conversation the client sends back is valid.
func TestCallIDsUniqueInConversation(t *testing.T) {
	t.Parallel()
	twice := append(fake.Call("call_x", "f", `{}`)[:3:3], llm.Chunk{Kind: llm.ChunkToolCallStart, Index: 1, CallID: "call_x", Name: "f"},
		llm.Chunk{Kind: llm.ChunkToolCallArgs, Index: 1, Text: `{}`}, llm.Chunk{Kind: llm.ChunkToolCallEnd, Index: 1},
		llm.Chunk{Kind: llm.ChunkStop, Stop: llm.StopToolUse})
	p := fake.NewProvider(
		fake.Reply{Chunks: fake.Call("call_0_f", "f", `{}`)},
		fake.Reply{Chunks: fake.Call("", "f", `{}`)},
		fake.Reply{Chunks: twice},
		fake.Reply{Chunks: fake.Text("done")},
	)
	n := 0
	ids := runtime.WithIDs(func() string { n++; return fmt.Sprint(n) })
	r := newRunner(t, []*runtime.Model{model("a", p)}, []llm.Tool{fake.NewTool("f", nil)}, ids)
	req := userTurn("go")
	req.Messages = append([]llm.Message{
		{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("before")}},
		{Role: llm.RoleAssistant, Parts: []llm.Part{{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "call_0_f", Name: "f", Arguments: "{}"}}}},
		{Role: llm.RoleTool, Parts: []llm.Part{{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: "call_0_f", Name: "f", Content: "{}"}}}},
	}, req.Messages...)
	_, res, terr := run(t, t.Context(), r, req)
	if terr != nil {
		t.Fatal(terr)
	}
	var got []string
	for _, m := range res.Messages {
		for _, c := range m.ToolCalls() {
			got = append(got, c.ID)
		}
	}
	if diff := cmp.Diff([]string{"call_1", "call_2", "call_x", "call_3"}, got); diff != "" {
		t.Errorf("call ids (-want +got):\n%s", diff)
	}
}

// TestSignaturesStayWithTheirSigner: thinking a model signed is recorded
// with its signer, and a model of another signer is not sent it (a
// fallback from Claude to Gemini); a part of no known signer goes to
// every model.
func TestSignaturesStayWithTheirSigner(t *testing.T) {
	t.Parallel()
	claude := fake.NewProvider(fake.Reply{Chunks: append([]llm.Chunk{{Kind: llm.ChunkThinking, Text: "hm", Signature: "EqQB"}}, fake.Call("toolu_1", "f", `{}`)...)},
		fake.Reply{Err: &llm.Error{Kind: llm.KindNotFound, Message: "gone"}})
	claude.Caps.Signer = "anthropic"
	gemini := fake.NewProvider(fake.Reply{Chunks: fake.Text("done")})
	gemini.Caps.Signer = "gemini"
	r := newRunner(t, []*runtime.Model{model("claude", claude, "gemini"), model("gemini", gemini)}, []llm.Tool{fake.NewTool("f", nil)})
	req := userTurn("go")
	unknown := llm.Part{Kind: llm.PartThinking, Text: "old", Signature: "c2ln"}
	req.Messages = append([]llm.Message{
		{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("before")}},
		{Role: llm.RoleAssistant, Parts: []llm.Part{unknown, llm.TextPart("ok")}},
	}, req.Messages...)
	_, res, terr := run(t, t.Context(), r, req)
	if terr != nil {
		t.Fatal(terr)
	}
	if got := res.Messages[0].Parts[0]; got.Signer != "anthropic" || got.Signature != "EqQB" {
		t.Errorf("committed thinking %+v, want signed by anthropic", got)
	}
	sent := gemini.Requests()[0].Messages
	var thinking []llm.Part
	for _, m := range sent {
		for _, p := range m.Parts {
			if p.Kind == llm.PartThinking {
				thinking = append(thinking, p)
			}
		}
	}
	if diff := cmp.Diff([]llm.Part{unknown}, thinking); diff != "" {
		t.Errorf("thinking sent to gemini (-want +got):\n%s", diff)
	}
	if got := claude.Requests()[1].Messages[3].Parts[0]; got.Signer != "anthropic" {
		t.Errorf("claude's own thinking was not sent back to it: %+v", claude.Requests()[1].Messages[3])
	}
}
