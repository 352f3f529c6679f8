package server_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/tools/argcheck"
)

// jsonStruct decodes a JSON object into a Struct.
func jsonStruct(t *testing.T, s string) *structpb.Struct {
	t.Helper()
	out := &structpb.Struct{}
	if err := (protojson.UnmarshalOptions{RecursionLimit: 20000}).Unmarshal([]byte(s), out); err != nil {
		t.Fatal(err)
	}
	return out
}

// anyOfChain is the red team's output schema of issue 38: n levels of
// anyOf, each two references to the next level.
func anyOfChain(n int) string {
	var b strings.Builder
	b.WriteString(`{"$ref":"#/$defs/level0","$defs":{`)
	for i := range n {
		fmt.Fprintf(&b, `"level%d":{"anyOf":[{"$ref":"#/$defs/level%d"},{"$ref":"#/$defs/level%d"}]},`, i, i+1, i+1)
	}
	fmt.Fprintf(&b, `"level%d":{"type":"string"}}}`, n)
	return b.String()
}

func deepSchema(open, inner, close string, n int) string {
	return strings.Repeat(open, n) + inner + strings.Repeat(close, n)
}

// TestSchemasPastTheBounds: the schemas that took the server down (issue
// 38) are refused before any event with INVALID_ARGUMENT naming each
// schema and the bound it passes.
func TestSchemasPastTheBounds(t *testing.T) {
	t.Parallel()
	p := fake.NewProvider()
	ts := start(t, schemaRunner(t, p), server.Options{CheckToolSchemas: argcheck.CheckSchemas})
	hi := wiretest.UserText("reply 7")
	output := func(s string) *turnstilev1.GenerationOptions {
		return &turnstilev1.GenerationOptions{OutputSchema: &turnstilev1.OutputSchema{Schema: jsonStruct(t, s)}}
	}
	tool := func(name, s string) *turnstilev1.ToolDefinition {
		return &turnstilev1.ToolDefinition{Name: name, InputSchema: jsonStruct(t, s)}
	}
	deepTool := `{"type":"object","properties":{"a":` + deepSchema(`{"type":"array","items":`, `{}`, `}`, 2000) + `}}`
	depth := "over the bound of 64 levels of nesting"
	tests := []struct {
		name   string
		req    *turnstilev1.RunTurnRequest
		fields []string
		want   string
	}{
		{
			name:   "a chain of 21 anyOfs",
			req:    &turnstilev1.RunTurnRequest{Messages: hi, Generation: output(anyOfChain(21))},
			fields: []string{"generation.output_schema.schema"},
			want:   "output schema too complex: over the bound of 4096 subschemas checked against one value in place",
		},
		{
			name:   "items 3,300 deep",
			req:    &turnstilev1.RunTurnRequest{Messages: hi, Generation: output(deepSchema(`{"items":`, `{}`, `}`, 3300))},
			fields: []string{"generation.output_schema.schema"},
			want:   "output schema too complex: " + depth,
		},
		{
			name:   "properties 1,500 deep",
			req:    &turnstilev1.RunTurnRequest{Messages: hi, Tools: []*turnstilev1.ToolDefinition{tool("t", deepSchema(`{"type":"object","properties":{"a":`, `{}`, `}}`, 1500))}},
			fields: []string{"tools[0].input_schema"},
			want:   "input schema too complex: " + depth,
		},
		{
			name: "4 tools 2,000 deep",
			req: &turnstilev1.RunTurnRequest{Messages: hi, Tools: []*turnstilev1.ToolDefinition{
				tool("a", deepTool), tool("b", deepTool), tool("c", deepTool), tool("d", deepTool),
			}},
			fields: []string{"tools[0].input_schema", "tools[1].input_schema", "tools[2].input_schema", "tools[3].input_schema"},
			want:   "input schema too complex: " + depth,
		},
		{
			// Each schema within the bounds, the two together not.
			name: "tools over the request's bound together",
			req: &turnstilev1.RunTurnRequest{Messages: hi, Tools: []*turnstilev1.ToolDefinition{
				tool("a", wideSchema(argcheck.MaxRequestNodes/2-2)), tool("b", `{"type":"object"}`), tool("c", wideSchema(argcheck.MaxRequestNodes/2-2)),
			}},
			fields: []string{"tools[2].input_schema"},
			want:   "input schema too complex: over the bound of 4096 JSON objects, arrays and booleans in the input schemas of one request's tools together",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs, st := wiretest.Collect(t, t.Context(), ts.client, tt.req, nil)
			if len(evs) != 0 || st.Code() != codes.InvalidArgument {
				t.Fatalf("%d events, status %v", len(evs), st)
			}
			var fields []string
			for _, d := range st.Details() {
				if br, ok := d.(*errdetails.BadRequest); ok {
					for _, v := range br.GetFieldViolations() {
						fields = append(fields, v.GetField())
						if !strings.HasPrefix(v.GetDescription(), tt.want) {
							t.Errorf("%s: %q, want it to start %q", v.GetField(), v.GetDescription(), tt.want)
						}
					}
				}
			}
			if !slices.Equal(fields, tt.fields) {
				t.Errorf("violations:\n got %q\nwant %q", fields, tt.fields)
			}
		})
	}
	if n := len(p.Requests()); n != 0 {
		t.Errorf("the provider was called %d times", n)
	}
}

// wideSchema is an object schema of n boolean properties: n+2 nodes.
func wideSchema(n int) string {
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"p%d":true`, i)
	}
	b.WriteString(`}}`)
	return b.String()
}

// TestOutputTooCostlyOnTheWire: a reply whose check would cost more than
// the bound is not checked: it is OUTPUT_INVALID, corrected like any
// other, and the turn ends OUTPUT_INVALID.
func TestOutputTooCostlyOnTheWire(t *testing.T) {
	t.Parallel()
	// Each object is checked against both branches, each of which checks
	// its property a against the whole schema again: 2^depth paths.
	const doubling = `{"anyOf":[{"properties":{"a":{"$ref":"#"}}},{"properties":{"a":{"$ref":"#"}}}]}`
	costly := fake.Reply{Chunks: fake.Text(deepSchema(`{"a":`, `7`, `}`, 40))}
	p := fake.NewProvider(costly, costly, costly)
	ts := start(t, schemaRunner(t, p), server.Options{CheckToolSchemas: argcheck.CheckSchemas})
	req := &turnstilev1.RunTurnRequest{
		Messages:   wiretest.UserText("nest a 40 times"),
		Generation: &turnstilev1.GenerationOptions{OutputSchema: &turnstilev1.OutputSchema{Schema: jsonStruct(t, doubling)}},
	}
	evs, st := wiretest.Collect(t, t.Context(), ts.client, req, nil)
	want := "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage Retry LlmCallStarted TextDelta LlmCallFinished Usage Retry " +
		"LlmCallStarted TextDelta LlmCallFinished Usage Error"
	if got := wiretest.Names(evs); got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	last := evs[len(evs)-1].GetError()
	const msg = "the reply does not match the output schema: the reply is too costly to check against the output schema (over the bound of 262144 steps"
	if last.GetCode() != turnstilev1.ErrorCode_ERROR_CODE_OUTPUT_INVALID || last.GetRetryable() || !strings.HasPrefix(last.GetMessage(), msg) {
		t.Errorf("error %v", last)
	}
	if st.Code() != codes.InvalidArgument || reasonOf(st) != "OUTPUT_INVALID" {
		t.Errorf("status %v, reason %q", st, reasonOf(st))
	}
	// The model was shown why, to reply in a shape that can be checked.
	if got := p.Requests()[1].Messages; !strings.Contains(got[len(got)-1].Text(), "too costly to check") {
		t.Errorf("correction %q", got[len(got)-1].Text())
	}
}

// TestRequestCheckEndsWithItsClient: the check of a request runs under the
// request's context; a client that leaves while its request is checked
// ends the work there, with no turn started and no error logged against
// the store.
func TestRequestCheckEndsWithItsClient(t *testing.T) {
	t.Parallel()
	p := fake.NewProvider(fake.Reply{Chunks: fake.Text("x")})
	var logs syncBuffer
	entered, seen := make(chan struct{}), make(chan error, 1)
	var calls atomic.Int32
	check := func(ctx context.Context, schemas [][]byte) []error {
		if calls.Add(1) == 1 {
			// The first request waits here until its client has left.
			close(entered)
			<-ctx.Done()
			seen <- ctx.Err()
		}
		return argcheck.CheckSchemas(ctx, schemas)
	}
	ts := start(t, runner(t, p), server.Options{CheckToolSchemas: check, Store: memStore(t), Logger: newLogger(&logs)})
	ctx, cancel := context.WithCancel(t.Context())
	req := hello()
	req.Tools = []*turnstilev1.ToolDefinition{{Name: "ask", InputSchema: jsonStruct(t, `{"type":"object"}`)}}
	go func() {
		<-entered
		cancel()
	}()
	_, st := wiretest.Collect(t, ctx, ts.client, req, nil)
	if st.Code() != codes.Canceled {
		t.Errorf("status %v", st)
	}
	if err := <-seen; err != context.Canceled {
		t.Errorf("the check saw %v, want context.Canceled", err)
	}
	// The RPC's line is written when its handler has returned.
	waitFor(t, func() bool { return strings.Contains(logs.String(), "grpc.code=") })
	if !strings.Contains(logs.String(), "grpc.code=Canceled") || strings.Contains(logs.String(), "level=ERROR") ||
		strings.Contains(logs.String(), "unreachable") {
		t.Errorf("logs:\n%s", logs.String())
	}
	if n := len(p.Requests()); n != 0 {
		t.Errorf("the provider was called %d times", n)
	}
	// No run was created: the turn id is free.
	if _, st := wiretest.Collect(t, t.Context(), ts.client, req, nil); st.Code() != codes.OK {
		t.Errorf("the turn afterwards: %v", status.Convert(st.Err()))
	}
}
