package server_test

import (
	"math"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/tools/argcheck"
)

// violations returns the field violations of st's BadRequest, as "field:
// description".
func violations(st interface{ Details() []any }) []string {
	var out []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				out = append(out, v.GetField()+": "+v.GetDescription())
			}
		}
	}
	return out
}

// TestModelLimitsOnTheWire: options the model cannot take are refused
// before any event with INVALID_ARGUMENT, each violation naming the field
// and the model's limit; top_p outside 0 to 1 is refused by the server.
func TestModelLimitsOnTheWire(t *testing.T) {
	t.Parallel()
	p := fake.NewProvider(fake.Reply{Chunks: fake.Text("x")})
	p.Caps = llm.Capabilities{MaxStopSequences: new(4), MaxTemperature: new(1.0), TemperatureOrTopP: true}
	ts := start(t, schemaRunner(t, p), server.Options{CheckToolSchemas: argcheck.CheckSchemas})
	hot, topP, over, nan := 1.5, 0.9, 1.2, math.NaN()
	tests := []struct {
		name string
		gen  *turnstilev1.GenerationOptions
		want []string
	}{
		{"over the model's limits",
			&turnstilev1.GenerationOptions{StopSequences: []string{"a", "b", "c", "d", "e"}, Temperature: &hot, TopP: &topP},
			[]string{
				`generation.stop_sequences: model "sim" takes at most 4 stop sequences, got 5 (models.sim.capabilities.max_stop_sequences)`,
				`generation.temperature: model "sim" takes a temperature from 0 to 1, got 1.5 (models.sim.capabilities.max_temperature)`,
				`generation.top_p: model "sim" takes temperature or top_p, not both (models.sim.capabilities.temperature_or_top_p)`,
			}},
		{"top_p over 1", &turnstilev1.GenerationOptions{TopP: &over}, []string{"generation.top_p: must be a number from 0 to 1"}},
		{"top_p NaN", &turnstilev1.GenerationOptions{TopP: &nan}, []string{"generation.top_p: must be a number from 0 to 1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("hi"), Generation: tt.gen}
			evs, st := wiretest.Collect(t, t.Context(), ts.client, req, nil)
			if len(evs) != 0 || st.Code() != codes.InvalidArgument {
				t.Fatalf("%d events, status %v", len(evs), st)
			}
			if diff := cmp.Diff(tt.want, violations(st)); diff != "" {
				t.Errorf("violations (-want +got):\n%s", diff)
			}
		})
	}
	if n := p.Calls(); n != 0 {
		t.Errorf("the provider was called %d times", n)
	}
}

// TestTopPReachesTheProvider: a request's top_p is what the provider is
// asked.
func TestTopPReachesTheProvider(t *testing.T) {
	t.Parallel()
	p := fake.NewProvider(fake.Reply{Chunks: fake.Text("x")})
	ts := start(t, schemaRunner(t, p), server.Options{CheckToolSchemas: argcheck.CheckSchemas})
	topP := 0.25
	req := &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("hi"), Generation: &turnstilev1.GenerationOptions{TopP: &topP}}
	if _, st := wiretest.Collect(t, t.Context(), ts.client, req, nil); st.Code() != codes.OK {
		t.Fatalf("status %v", st)
	}
	if got := p.Requests()[0].TopP; got == nil || *got != topP {
		t.Errorf("top_p %v, want %v", got, topP)
	}
}

// TestThinkingSignerRoundTrip: the thinking a model signs is committed
// with its API's name as signer; a client sending it back gets it to the
// model unchanged; a signer that is not a name is refused.
func TestThinkingSignerRoundTrip(t *testing.T) {
	t.Parallel()
	p := fake.NewProvider(fake.Reply{Chunks: append([]llm.Chunk{{Kind: llm.ChunkThinking, Text: "hm", Signature: "EqQB"}}, fake.Text("ok")...)})
	p.Caps.Signer = "anthropic"
	ts := start(t, schemaRunner(t, p), server.Options{CheckToolSchemas: argcheck.CheckSchemas})
	evs, st := wiretest.Collect(t, t.Context(), ts.client, &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("hi")}, nil)
	if st.Code() != codes.OK {
		t.Fatalf("status %v", st)
	}
	committed := evs[len(evs)-1].GetTurnCompleted().GetMessages()[0]
	th := committed.GetParts()[0].GetThinking()
	if th.GetSigner() != "anthropic" || th.GetSignature() != "EqQB" {
		t.Fatalf("committed thinking %v, want signed by anthropic", th)
	}
	next := &turnstilev1.RunTurnRequest{Messages: slices.Concat(wiretest.UserText("hi"), []*turnstilev1.Message{committed}, wiretest.UserText("more"))}
	if _, st := wiretest.Collect(t, t.Context(), ts.client, next, nil); st.Code() != codes.OK {
		t.Fatalf("status %v", st)
	}
	if got := p.Requests()[1].Messages[1].Parts[0]; got.Signer != "anthropic" || got.Signature != "EqQB" {
		t.Errorf("thinking sent back %+v", got)
	}
	bad := &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{
		msg(user, text("hi")),
		msg(assistant, &turnstilev1.Part{Kind: &turnstilev1.Part_Thinking{Thinking: &turnstilev1.Thinking{Text: "x", Signature: "s", Signer: "not a name"}}}, text("ok")),
		msg(user, text("more")),
	}}
	_, st = wiretest.Collect(t, t.Context(), ts.client, bad, nil)
	want := []string{"messages[1].parts[0].thinking.signer: must be at most 32 letters, digits, '_' or '-'"}
	if diff := cmp.Diff(want, violations(st)); st.Code() != codes.InvalidArgument || diff != "" {
		t.Errorf("status %v, violations (-want +got):\n%s", st, diff)
	}
}
