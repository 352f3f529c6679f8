package durable

import (
	"bytes"
	"crypto/sha256"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// cloneHash is how the hash of a request's content was made before
// requestContent: a copy of the request with turn_id and attempt cleared,
// in protobuf's deterministic encoding. Runs stored by a server of that
// version keep that hash in their record, and a retry must match it.
func cloneHash(t *testing.T, req *turnstilev1.RunTurnRequest) []byte {
	t.Helper()
	c := proto.CloneOf(req)
	c.TurnId, c.Attempt = "", 0
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(b)
	return h[:]
}

// TestRequestContentHash: the hash requestContent makes without copying
// the request is the one of a cleared copy, for requests with every kind
// of field, unknown fields (a newer client's) included; it ignores
// turn_id and attempt and nothing else; and the wire form it returns is
// the request.
func TestRequestContentHash(t *testing.T) {
	params, err := structpb.NewStruct(map[string]any{"type": "object", "b": 1, "a": "x", "c": []any{true, nil}})
	if err != nil {
		t.Fatal(err)
	}
	temp, maxTokens, calls := 0.5, int32(64), int32(3)
	full := &turnstilev1.RunTurnRequest{
		TurnId: "t-1", Model: "fast", System: "be brief", Attempt: 7,
		Messages: []*turnstilev1.Message{
			{Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "hello"}}}},
			{Role: turnstilev1.Role_ROLE_ASSISTANT, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "hi"}}}},
		},
		Tools:      []*turnstilev1.ToolDefinition{{Name: "lookup", Description: "looks up", InputSchema: params}},
		Generation: &turnstilev1.GenerationOptions{MaxOutputTokens: &maxTokens, Temperature: &temp, StopSequences: []string{"\n\n", "END"}},
		Limits:     &turnstilev1.TurnLimits{MaxModelCalls: &calls},
	}
	unknown := proto.CloneOf(full)
	// Fields this version does not know, as a newer client sends them:
	// one after every known field, one between them in number.
	var raw []byte
	raw = protowire.AppendTag(raw, 99, protowire.BytesType)
	raw = protowire.AppendString(raw, "newer")
	raw = protowire.AppendTag(raw, 50, protowire.VarintType)
	raw = protowire.AppendVarint(raw, 5)
	unknown.ProtoReflect().SetUnknown(raw)

	for _, tc := range []struct {
		name string
		req  *turnstilev1.RunTurnRequest
	}{
		{"empty", &turnstilev1.RunTurnRequest{}},
		{"ids only", &turnstilev1.RunTurnRequest{TurnId: "x", Attempt: 2}},
		{"the bench's", &turnstilev1.RunTurnRequest{Messages: full.Messages[:1]}},
		{"every field", full},
		{"unknown fields", unknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hash, wire, err := requestContent(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if want := cloneHash(t, tc.req); !bytes.Equal(hash, want) {
				t.Errorf("hash %x, want the cleared copy's %x", hash, want)
			}
			var back turnstilev1.RunTurnRequest
			if err := proto.Unmarshal(wire, &back); err != nil || !proto.Equal(&back, tc.req) {
				t.Errorf("wire form decodes to %v (%v), want the request", &back, err)
			}
			// Another turn id and attempt: the same content.
			other := proto.CloneOf(tc.req)
			other.TurnId, other.Attempt = "another", 99
			if h, _, _ := requestContent(other); !bytes.Equal(h, hash) {
				t.Errorf("turn_id and attempt changed the hash")
			}
			// Any other field changed: another content.
			other.System += "!"
			if h, _, _ := requestContent(other); bytes.Equal(h, hash) {
				t.Errorf("a changed system prompt kept the hash")
			}
		})
	}
}
