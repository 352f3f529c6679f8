package server_test

import (
	"math"
	"slices"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/tools/argcheck"
)

// Parts and messages for building conversations.
func text(s string) *turnstilev1.Part {
	return &turnstilev1.Part{Kind: &turnstilev1.Part_Text{Text: s}}
}
func call(id string) *turnstilev1.Part {
	return &turnstilev1.Part{Kind: &turnstilev1.Part_ToolCall{ToolCall: &turnstilev1.ToolCall{Id: id, Name: "lookup", Arguments: "{}"}}}
}
func result(id string) *turnstilev1.Part {
	return &turnstilev1.Part{Kind: &turnstilev1.Part_ToolResult{ToolResult: &turnstilev1.ToolResult{CallId: id, Name: "lookup", Content: "ok"}}}
}
func msg(role turnstilev1.Role, parts ...*turnstilev1.Part) *turnstilev1.Message {
	return &turnstilev1.Message{Role: role, Parts: parts}
}

const (
	user      = turnstilev1.Role_ROLE_USER
	assistant = turnstilev1.Role_ROLE_ASSISTANT
	tool      = turnstilev1.Role_ROLE_TOOL
)

func structOf(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRequestValidation checks each request is refused with every problem
// it has, each naming its field, in one BadRequest, before any event.
func TestRequestValidation(t *testing.T) {
	t.Parallel()
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("x")}), fake.NewTool("lookup", nil)),
		server.Options{CheckToolSchemas: argcheck.CheckSchemas})
	nan, inf := math.NaN(), math.Inf(1)
	withNumber := func(v float64) *structpb.Struct {
		return &structpb.Struct{Fields: map[string]*structpb.Value{"type": structpb.NewStringValue("object"), "minimum": structpb.NewNumberValue(v)}}
	}
	tests := []struct {
		name   string
		req    *turnstilev1.RunTurnRequest
		fields []string
	}{
		{
			name:   "orphan tool result",
			req:    &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{msg(user, text("hi")), msg(tool, result("c9"))}},
			fields: []string{"messages[1].parts[0].tool_result.call_id"},
		},
		{
			name:   "call left without a result before a user message",
			req:    &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{msg(user, text("hi")), msg(assistant, call("c1"), call("c2")), msg(tool, result("c1")), msg(user, text("and?"))}},
			fields: []string{"messages[1].parts[1].tool_call"},
		},
		{
			name:   "call left without a result at the end",
			req:    &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{msg(user, text("hi")), msg(assistant, call("c1"))}},
			fields: []string{"messages[1].parts[0].tool_call"},
		},
		{
			name: "duplicate call ids and results",
			req: &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{
				msg(user, text("hi")), msg(assistant, call("c1")), msg(tool, result("c1"), result("c1")),
				msg(assistant, call("c1")), msg(tool, result("c1")),
			}},
			fields: []string{"messages[2].parts[1].tool_result.call_id", "messages[3].parts[0].tool_call.id", "messages[4].parts[0].tool_result.call_id"},
		},
		{
			name:   "result answering an older message's call",
			req:    &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{msg(user, text("hi")), msg(assistant, call("c1")), msg(tool, result("c1")), msg(user, text("again")), msg(tool, result("c1"))}},
			fields: []string{"messages[4].parts[0].tool_result.call_id"},
		},
		{
			name:   "parts in the wrong role",
			req:    &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{msg(user, text("hi"), result("c1")), msg(tool, text("words"))}},
			fields: []string{"messages[0].parts[1].tool_result", "messages[1].parts[0].text"},
		},
		{
			name: "several problems at once",
			req: &turnstilev1.RunTurnRequest{
				Model:      strings.Repeat("m", 3<<20),
				Messages:   []*turnstilev1.Message{msg(user, text("hi"))},
				Tools:      []*turnstilev1.ToolDefinition{{Name: "a b"}, {Name: "ok", Description: strings.Repeat("d", 9000)}},
				Generation: &turnstilev1.GenerationOptions{Temperature: &nan, StopSequences: []string{"", strings.Repeat("s", 200)}},
			},
			fields: []string{"model", "tools[0].name", "tools[1].description", "generation.temperature", "generation.stop_sequences[0]", "generation.stop_sequences[1]"},
		},
		{
			name:   "infinite temperature",
			req:    &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{msg(user, text("hi"))}, Generation: &turnstilev1.GenerationOptions{Temperature: &inf}},
			fields: []string{"generation.temperature"},
		},
		{
			name: "tool schemas",
			req: &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{msg(user, text("hi"))}, Tools: []*turnstilev1.ToolDefinition{
				{Name: "nonsense", InputSchema: structOf(t, map[string]any{"type": "nonsense"})},
				{Name: "not_object", InputSchema: structOf(t, map[string]any{"type": "string"})},
				{Name: "bad_keyword", InputSchema: structOf(t, map[string]any{"type": "object", "properties": "nope"})},
				{Name: "remote_ref", InputSchema: structOf(t, map[string]any{"$ref": "https://example.com/schema.json"})},
				{Name: "file_ref", InputSchema: structOf(t, map[string]any{"$ref": "file:///etc/passwd"})},
				{Name: "nan_in_schema", InputSchema: withNumber(nan)},
				{Name: "fine", InputSchema: structOf(t, map[string]any{"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string"}}})},
			}},
			fields: []string{"tools[0].input_schema", "tools[1].input_schema", "tools[2].input_schema", "tools[3].input_schema", "tools[4].input_schema", "tools[5].input_schema"},
		},
		{
			name:   "too many messages",
			req:    &turnstilev1.RunTurnRequest{Messages: manyMessages(10001, 1)},
			fields: []string{"messages"},
		},
		{
			name:   "too many parts",
			req:    &turnstilev1.RunTurnRequest{Messages: manyMessages(21, 1000)},
			fields: []string{"messages"},
		},
		{
			name:   "too many tools",
			req:    &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{msg(user, text("hi"))}, Tools: manyTools(129)},
			fields: []string{"tools"},
		},
		{
			name:   "a server-side tool's name and an unknown model",
			req:    &turnstilev1.RunTurnRequest{Model: "nope", Messages: []*turnstilev1.Message{msg(user, text("hi"))}, Tools: []*turnstilev1.ToolDefinition{{Name: "lookup"}}},
			fields: []string{"model", "tools[0].name"},
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
						if len(v.GetDescription()) > 600 {
							t.Errorf("%s: description of %d bytes", v.GetField(), len(v.GetDescription()))
						}
					}
				}
			}
			if !slices.Equal(got, tt.fields) {
				t.Errorf("violations:\n got %q\nwant %q", got, tt.fields)
			}
			if reasonOf(st) != "INVALID_REQUEST" || len(st.Message()) > 1024 {
				t.Errorf("reason %q, message of %d bytes", reasonOf(st), len(st.Message()))
			}
		})
	}
}

// TestValidConversationsPass: conversations that pair calls and results
// as providers require are accepted: results spread over several tool
// messages, and client and server calls in one message.
func TestValidConversationsPass(t *testing.T) {
	t.Parallel()
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("x")})), server.Options{CheckToolSchemas: argcheck.CheckSchemas})
	req := &turnstilev1.RunTurnRequest{
		Messages: []*turnstilev1.Message{
			msg(user, text("hi")), msg(assistant, text("let me look"), call("c1"), call("c2")), msg(tool, result("c1")), msg(tool, result("c2")),
			msg(assistant, text("and again"), call("c3")), msg(tool, result("c3")), msg(user, text("thanks")),
		},
		Tools: []*turnstilev1.ToolDefinition{{Name: "ask", InputSchema: structOf(t, map[string]any{"type": "object"})}, {Name: "no_schema"}},
	}
	if _, st := wiretest.Collect(t, t.Context(), ts.client, req, nil); st.Code() != codes.OK {
		t.Errorf("status %v", st)
	}
}

// manyMessages returns n user messages of parts text parts each.
func manyMessages(n, parts int) []*turnstilev1.Message {
	var ps []*turnstilev1.Part
	for range parts {
		ps = append(ps, text("w"))
	}
	out := make([]*turnstilev1.Message, n)
	for i := range out {
		out[i] = msg(user, ps...)
	}
	return out
}

func manyTools(n int) []*turnstilev1.ToolDefinition {
	var out []*turnstilev1.ToolDefinition
	for i := range n {
		out = append(out, &turnstilev1.ToolDefinition{Name: "t" + strings.Repeat("x", i%10) + string(rune('a'+i%26)) + string(rune('a'+i/26))})
	}
	return out
}
