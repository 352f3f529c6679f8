package wiretest

import (
	"math"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// AddRequestSeeds adds to f the seeds of the fuzz tests that feed wire
// bytes through a RunTurnRequest's decoding and validation: valid
// requests (a user message; a tool call and its result), a request whose
// tool schema and generation options are invalid (an empty stop
// sequence, a NaN temperature), and bytes that are not valid UTF-8.
func AddRequestSeeds(f *testing.F) {
	nan := math.NaN()
	schema, _ := structpb.NewStruct(map[string]any{"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string"}}})
	call := &turnstilev1.Part{Kind: &turnstilev1.Part_ToolCall{ToolCall: &turnstilev1.ToolCall{Id: "1", Name: "x", Arguments: "{}"}}}
	result := &turnstilev1.Part{Kind: &turnstilev1.Part_ToolResult{ToolResult: &turnstilev1.ToolResult{CallId: "1", Content: "r"}}}
	text := &turnstilev1.Part{Kind: &turnstilev1.Part_Text{Text: "hi"}}
	seeds := []*turnstilev1.RunTurnRequest{
		{Messages: []*turnstilev1.Message{{Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{text}}}},
		{Messages: []*turnstilev1.Message{{Role: turnstilev1.Role_ROLE_ASSISTANT, Parts: []*turnstilev1.Part{call}}}},
		{Model: "b", Messages: []*turnstilev1.Message{
			{Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{text}},
			{Role: turnstilev1.Role_ROLE_ASSISTANT, Parts: []*turnstilev1.Part{call}},
			{Role: turnstilev1.Role_ROLE_TOOL, Parts: []*turnstilev1.Part{result}},
		}},
		{Tools: []*turnstilev1.ToolDefinition{{Name: "t", InputSchema: schema}}, Generation: &turnstilev1.GenerationOptions{StopSequences: []string{""}, Temperature: &nan}},
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x12, 0x02, 0xff, 0xfe})
}
