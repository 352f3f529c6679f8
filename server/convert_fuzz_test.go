package server

import (
	"testing"

	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// FuzzToTurnRequest feeds arbitrary wire bytes through request validation:
// any request is either converted or rejected with a field error, never a
// panic.
func FuzzToTurnRequest(f *testing.F) {
	seeds := []*turnstilev1.RunTurnRequest{
		{Messages: []*turnstilev1.Message{{Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "hi"}}}}}},
		{Messages: []*turnstilev1.Message{{Role: turnstilev1.Role_ROLE_ASSISTANT, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_ToolCall{ToolCall: &turnstilev1.ToolCall{Id: "1", Name: "x", Arguments: "{}"}}}}}}},
		{Tools: []*turnstilev1.ToolDefinition{{Name: "t"}}, Generation: &turnstilev1.GenerationOptions{StopSequences: []string{""}}},
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req turnstilev1.RunTurnRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		tr, err := toTurnRequest(&req)
		if err != nil {
			if _, ok := asFieldError(err); !ok {
				t.Fatalf("error %v is not a field error", err)
			}
			return
		}
		if len(tr.Messages) == 0 {
			t.Fatal("a request without messages was accepted")
		}
	})
}
