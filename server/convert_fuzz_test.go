package server

import (
	"crypto/sha256"
	"math"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/tools/argcheck"
)

func fuzzSeeds(f *testing.F) {
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

// FuzzToTurnRequest feeds arbitrary wire bytes through request validation:
// any request is either converted or rejected with field violations, never
// a panic.
func FuzzToTurnRequest(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		var req turnstilev1.RunTurnRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		tr, bad := toTurnRequest(t.Context(), &req, argcheck.CheckSchemas, mediaLimits{})
		if len(bad) > 0 {
			for _, v := range bad {
				if v.Field == "" || v.Description == "" {
					t.Fatalf("violation %+v names no field or problem", v)
				}
			}
			return
		}
		if len(tr.Messages) == 0 {
			t.Fatal("a request without messages was accepted")
		}
	})
}

// FuzzRequestPath feeds arbitrary wire bytes through what the server does
// with a request before a turn starts: its codec, validation, the client
// key's models and the runner's checks. Every outcome is a request the
// runtime may run or a refusal with a client's code and a bounded
// message; never INTERNAL, never a panic.
func FuzzRequestPath(f *testing.F) {
	fuzzSeeds(f)
	var models []*runtime.Model
	for _, a := range []string{"a", "b"} {
		models = append(models, &runtime.Model{Alias: a, Provider: fake.NewProvider(fake.Reply{}), ID: a, Retry: policy.DefaultRetry()})
	}
	r, err := runtime.New(models, "a", []llm.Tool{fake.NewTool("x", nil)})
	if err != nil {
		f.Fatal(err)
	}
	opts := &Options{CheckToolSchemas: argcheck.CheckSchemas}
	opts.setDefaults()
	s := newService(r, opts)
	k := &key{Key: Key{Name: "k", TokenSHA256: sha256.Sum256([]byte("t")), Models: []string{"b"}}}
	c := newCodec(DefaultMaxRequestBytes)
	f.Fuzz(func(t *testing.T, b []byte) {
		var req turnstilev1.RunTurnRequest
		target := &decodeTarget{Message: &req}
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, target); err != nil {
			t.Fatalf("decoding into a target failed: %v", err)
		}
		if target.err != nil {
			st := malformedRequest(target.err)
			if st.Code() != codes.InvalidArgument || len(st.Message()) > 512 {
				t.Fatalf("undecodable request: %v", st)
			}
			return
		}
		for _, key := range []*key{nil, k} {
			tr, st := s.request(t.Context(), &req, key)
			if st != nil {
				if code := st.Code(); code != codes.InvalidArgument && code != codes.PermissionDenied || len(st.Message()) > 4096 {
					t.Fatalf("refusal %v (%d bytes)", code, len(st.Message()))
				}
				continue
			}
			if len(tr.Messages) == 0 || !key.mayUse(tr.Model) && tr.Model != "" {
				t.Fatalf("accepted %+v for key %v", tr, key.name())
			}
			if key != nil && tr.Client != "k" {
				t.Fatalf("client %q", tr.Client)
			}
		}
	})
}
