package server

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// TestEncodedResponse: a response sent as its event's stored wire form
// decodes as the response encoded by gRPC's codec would, small (its own
// buffer) and large (the event's bytes themselves, behind their tag and
// length: not a copy), for both streaming responses; read as a message
// (a stats handler's payload), it is the response.
func TestEncodedResponse(t *testing.T) {
	t.Parallel()
	c := newCodec(1 << 20)
	for _, size := range []int{0, 10, 1 << 10, 100 << 10} {
		ev := &turnstilev1.AgentEvent{Seq: 7, Attempt: 2, Payload: &turnstilev1.AgentEvent_TextDelta{TextDelta: &turnstilev1.TextDelta{Text: strings.Repeat("é", size/2)}}}
		wire, err := proto.MarshalOptions{Deterministic: true}.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		for _, resp := range []interface {
			proto.Message
			GetEvent() *turnstilev1.AgentEvent
		}{&turnstilev1.RunTurnResponse{Event: ev}, &turnstilev1.WatchTurnResponse{Event: ev}} {
			enc := &encodedResponse{typ: resp.ProtoReflect().Type(), event: wire}
			got, err := c.Marshal(enc)
			if err != nil {
				t.Fatal(err)
			}
			// A stats handler reading the payload sent reads the response.
			if !proto.Equal(enc, resp) {
				t.Errorf("%T of a %d-byte event, read as a message: %v", resp, len(wire), enc.ProtoReflect().Interface())
			}
			want, err := c.Marshal(resp)
			if err != nil {
				t.Fatal(err)
			}
			if got.Len() != want.Len() || got.Len() != proto.Size(resp) {
				t.Errorf("%T of a %d-byte event: %d bytes, want %d", resp, len(wire), got.Len(), want.Len())
			}
			dec := resp.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(got.Materialize(), dec); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(dec, resp) {
				t.Errorf("%T of a %d-byte event decodes as %v", resp, len(wire), dec)
			}
			// Responses of 1 KiB or more (gRPC's pooling threshold).
			large := len(wire) >= 1<<10
			if shared := len(got) == 2 && &got[1].ReadOnlyData()[0] == &wire[0]; shared != large {
				t.Errorf("%T of a %d-byte event: sent as the event's own bytes = %v, want %v", resp, len(wire), shared, large)
			}
			got.Free()
			want.Free()
		}
	}
}
