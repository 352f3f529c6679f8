package server_test

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/tools/argcheck"
)

// schemaRunner is a runner of one model on p that validates output
// schemas, with the server-side tool lookup.
func schemaRunner(t *testing.T, p llm.Provider) *runtime.Runner {
	t.Helper()
	retry := policy.DefaultRetry()
	retry.InitialBackoff, retry.MaxBackoff = time.Millisecond, 2*time.Millisecond
	r, err := runtime.New([]*runtime.Model{{Alias: "sim", ProviderName: "fake", Provider: p, ID: "fake-1", Retry: retry}}, "sim",
		[]llm.Tool{fake.NewTool("lookup", nil)}, runtime.WithOutputSchemas(argcheck.OutputSchemas{}))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func budget(n int32) *int32 { return &n }

// TestGenerationOptionsValidation: every problem of the generation
// options and metadata is named in one BadRequest, before any event.
func TestGenerationOptionsValidation(t *testing.T) {
	t.Parallel()
	ts := start(t, schemaRunner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("x")})), server.Options{CheckToolSchemas: argcheck.CheckSchemas})
	hi := wiretest.UserText("hi")
	tests := []struct {
		name   string
		req    *turnstilev1.RunTurnRequest
		fields []string
	}{
		{
			name: "output schema",
			req: &turnstilev1.RunTurnRequest{Messages: hi, Generation: &turnstilev1.GenerationOptions{
				OutputSchema: &turnstilev1.OutputSchema{Name: "a b", Schema: structOf(t, map[string]any{"type": "object"})},
			}},
			fields: []string{"generation.output_schema.name"},
		},
		{
			// Checked by the runner once the request converts.
			name: "output schema that does not compile",
			req: &turnstilev1.RunTurnRequest{Messages: hi, Generation: &turnstilev1.GenerationOptions{
				OutputSchema: &turnstilev1.OutputSchema{Schema: structOf(t, map[string]any{"type": "nonsense"})},
			}},
			fields: []string{"generation.output_schema.schema"},
		},
		{
			name: "output schema without a schema",
			req: &turnstilev1.RunTurnRequest{Messages: hi, Generation: &turnstilev1.GenerationOptions{
				OutputSchema: &turnstilev1.OutputSchema{},
			}},
			fields: []string{"generation.output_schema.schema"},
		},
		{
			name: "output schema too large",
			req: &turnstilev1.RunTurnRequest{Messages: hi, Generation: &turnstilev1.GenerationOptions{
				OutputSchema: &turnstilev1.OutputSchema{Schema: structOf(t, map[string]any{"description": strings.Repeat("d", 65<<10)})},
			}},
			fields: []string{"generation.output_schema.schema"},
		},
		{
			name: "output schema with a remote reference",
			req: &turnstilev1.RunTurnRequest{Messages: hi, Generation: &turnstilev1.GenerationOptions{
				OutputSchema: &turnstilev1.OutputSchema{Schema: structOf(t, map[string]any{"$ref": "https://example.com/s.json"})},
			}},
			fields: []string{"generation.output_schema.schema"},
		},
		{
			name: "tool choice without a mode, tool name without TOOL",
			req: &turnstilev1.RunTurnRequest{Messages: hi, Generation: &turnstilev1.GenerationOptions{
				ToolChoice: &turnstilev1.ToolChoice{ToolName: "lookup"},
			}},
			fields: []string{"generation.tool_choice.mode", "generation.tool_choice.tool_name"},
		},
		{
			name: "tool choice of a tool not offered",
			req: &turnstilev1.RunTurnRequest{Messages: hi, Tools: []*turnstilev1.ToolDefinition{{Name: "ask"}}, Generation: &turnstilev1.GenerationOptions{
				ToolChoice: &turnstilev1.ToolChoice{Mode: turnstilev1.ToolChoiceMode_TOOL_CHOICE_MODE_TOOL, ToolName: "search"},
			}},
			fields: []string{"generation.tool_choice.tool_name"},
		},
		{
			name: "tool choice TOOL without a name",
			req: &turnstilev1.RunTurnRequest{Messages: hi, Generation: &turnstilev1.GenerationOptions{
				ToolChoice: &turnstilev1.ToolChoice{Mode: turnstilev1.ToolChoiceMode_TOOL_CHOICE_MODE_TOOL},
			}},
			fields: []string{"generation.tool_choice.tool_name"},
		},
		{
			name: "reasoning out of range",
			req: &turnstilev1.RunTurnRequest{Messages: hi, Generation: &turnstilev1.GenerationOptions{
				Reasoning: &turnstilev1.Reasoning{Effort: 9, BudgetTokens: budget(100)},
			}},
			fields: []string{"generation.reasoning.effort", "generation.reasoning.budget_tokens"},
		},
		{
			name: "empty reasoning",
			req: &turnstilev1.RunTurnRequest{Messages: hi, Generation: &turnstilev1.GenerationOptions{
				Reasoning: &turnstilev1.Reasoning{},
			}},
			fields: []string{"generation.reasoning"},
		},
		{
			name: "metadata",
			req: &turnstilev1.RunTurnRequest{Messages: hi, Metadata: map[string]string{
				"bad key": "v", "end_user": strings.Repeat("u", 65), "long": strings.Repeat("v", 257), "ok": "fine",
			}},
			fields: []string{"metadata", "metadata[end_user]", "metadata[long]"},
		},
		{
			name:   "too much metadata",
			req:    &turnstilev1.RunTurnRequest{Messages: hi, Metadata: manyLabels(17)},
			fields: []string{"metadata"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs, st := wiretest.Collect(t, t.Context(), ts.client, tt.req, nil)
			if len(evs) != 0 || st.Code() != codes.InvalidArgument {
				t.Fatalf("%d events, status %v", len(evs), st)
			}
			var got []string
			for _, d := range st.Details() {
				if br, ok := d.(*errdetails.BadRequest); ok {
					for _, v := range br.GetFieldViolations() {
						got = append(got, v.GetField())
						if strings.Contains(v.GetDescription(), strings.Repeat("u", 65)) {
							t.Errorf("%s: the description quotes a metadata value", v.GetField())
						}
					}
				}
			}
			if !slices.Equal(got, tt.fields) {
				t.Errorf("violations:\n got %q\nwant %q", got, tt.fields)
			}
		})
	}
}

func manyLabels(n int) map[string]string {
	out := map[string]string{}
	for i := range n {
		out["k"+string(rune('a'+i))] = "v"
	}
	return out
}

// TestGenerationOptionsReachTheProvider: what the request asks is what the
// provider is asked, the metadata's end_user included.
func TestGenerationOptionsReachTheProvider(t *testing.T) {
	t.Parallel()
	p := fake.NewProvider(fake.Reply{Chunks: fake.Text(`{"city":"Oslo"}`)})
	ts := start(t, schemaRunner(t, p), server.Options{CheckToolSchemas: argcheck.CheckSchemas})
	req := &turnstilev1.RunTurnRequest{
		Messages: wiretest.UserText("where?"),
		Tools:    []*turnstilev1.ToolDefinition{{Name: "ask"}},
		Metadata: map[string]string{"end_user": "u-42", "session": "s1"},
		Generation: &turnstilev1.GenerationOptions{
			OutputSchema: &turnstilev1.OutputSchema{Name: "place", Strict: true, Schema: structOf(t, map[string]any{
				"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []any{"city"},
			})},
			ToolChoice: &turnstilev1.ToolChoice{Mode: turnstilev1.ToolChoiceMode_TOOL_CHOICE_MODE_TOOL, ToolName: "lookup"},
			Reasoning:  &turnstilev1.Reasoning{Effort: turnstilev1.ReasoningEffort_REASONING_EFFORT_HIGH, BudgetTokens: budget(2048)},
		},
	}
	if _, st := wiretest.Collect(t, t.Context(), ts.client, req, nil); st.Code() != codes.OK {
		t.Fatalf("status %v", st)
	}
	got := p.Requests()[0]
	var schema bytes.Buffer
	if s := got.OutputSchema; s == nil || s.Name != "place" || !s.Strict || json.Compact(&schema, s.Schema) != nil ||
		schema.String() != `{"properties":{"city":{"type":"string"}},"required":["city"],"type":"object"}` {
		t.Errorf("output schema %+v", got.OutputSchema)
	}
	if c := got.ToolChoice; c == nil || *c != (llm.ToolChoice{Mode: llm.ToolChoiceTool, Name: "lookup"}) {
		t.Errorf("tool choice %+v", got.ToolChoice)
	}
	if r := got.Reasoning; r == nil || *r != (llm.Reasoning{Effort: llm.EffortHigh, BudgetTokens: 2048}) {
		t.Errorf("reasoning %+v", got.Reasoning)
	}
	if got.EndUser != "u-42" {
		t.Errorf("end user %q", got.EndUser)
	}
}

// TestOutputInvalidOnTheWire: a reply that never matches the schema is
// corrected, then the turn ends with OUTPUT_INVALID, not retryable.
func TestOutputInvalidOnTheWire(t *testing.T) {
	t.Parallel()
	bad := fake.Reply{Chunks: fake.Text(`{"city":7}`)}
	p := fake.NewProvider(bad, bad, bad)
	ts := start(t, schemaRunner(t, p), server.Options{CheckToolSchemas: argcheck.CheckSchemas})
	req := &turnstilev1.RunTurnRequest{
		Messages: wiretest.UserText("where?"),
		Generation: &turnstilev1.GenerationOptions{OutputSchema: &turnstilev1.OutputSchema{Schema: structOf(t, map[string]any{
			"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}},
		})}},
	}
	evs, st := wiretest.Collect(t, t.Context(), ts.client, req, nil)
	want := "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage Retry LlmCallStarted TextDelta LlmCallFinished Usage Retry " +
		"LlmCallStarted TextDelta LlmCallFinished Usage Error"
	if got := wiretest.Names(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	for _, ev := range evs {
		if r := ev.GetRetry(); r != nil && (!r.GetDiscardPartial() || r.GetReason() != turnstilev1.ErrorCode_ERROR_CODE_OUTPUT_INVALID) {
			t.Errorf("retry %v", r)
		}
	}
	last := evs[len(evs)-1].GetError()
	if last.GetCode() != turnstilev1.ErrorCode_ERROR_CODE_OUTPUT_INVALID || last.GetRetryable() ||
		last.GetMessage() != `the reply does not match the output schema: property "city": got number, want string` {
		t.Errorf("error %v", last)
	}
	if st.Code() != codes.InvalidArgument || reasonOf(st) != "OUTPUT_INVALID" {
		t.Errorf("status %v, reason %q", st, reasonOf(st))
	}
}
