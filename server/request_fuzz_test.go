package server

import (
	"crypto/sha256"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/admission"
	"github.com/turnstile-dev/turnstile/tools/argcheck"
)

// FuzzRequestPath feeds arbitrary wire bytes through what the server does
// with a request before a turn starts: its codec, validation, the client
// key's models and the runner's checks. Every outcome is a request the
// runtime may run or a refusal with a client's code and a bounded
// message; never INTERNAL, never a panic.
func FuzzRequestPath(f *testing.F) {
	wiretest.AddRequestSeeds(f)
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
	k := admission.NewKeys([]Key{{Name: "k", TokenSHA256: sha256.Sum256([]byte("t")), Models: []string{"b"}}}, time.Now).Find("t")
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
		for _, key := range []*admission.Client{nil, k} {
			tr, st := s.request(t.Context(), &req, key)
			if st != nil {
				if code := st.Code(); code != codes.InvalidArgument && code != codes.PermissionDenied || len(st.Message()) > 4096 {
					t.Fatalf("refusal %v (%d bytes)", code, len(st.Message()))
				}
				continue
			}
			if len(tr.Messages) == 0 || !key.MayUse(tr.Model) && tr.Model != "" {
				t.Fatalf("accepted %+v for key %v", tr, key.KeyName())
			}
			if key != nil && tr.Client != "k" {
				t.Fatalf("client %q", tr.Client)
			}
		}
	})
}
