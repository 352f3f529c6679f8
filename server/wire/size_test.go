package wire

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// TestResponseSize holds ResponseSize, which the sink of a durable run
// compares with server.max_event_bytes in the place of proto.Size, to the
// size of the response gRPC sends, for events small and large (a length
// of one varint byte and of several).
func TestResponseSize(t *testing.T) {
	for _, text := range []string{"", "hi", strings.Repeat("x", 200), strings.Repeat("y", 70_000)} {
		ev := &turnstilev1.AgentEvent{Seq: 7, Attempt: 2, Payload: &turnstilev1.AgentEvent_TextDelta{TextDelta: &turnstilev1.TextDelta{Text: text}}}
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := ResponseSize(len(b)), proto.Size(&turnstilev1.RunTurnResponse{Event: ev}); got != want {
			t.Errorf("text of %d bytes: ResponseSize = %d, want %d", len(text), got, want)
		}
	}
}
