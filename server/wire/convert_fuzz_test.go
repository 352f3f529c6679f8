package wire

import (
	"testing"

	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/tools/argcheck"
)

// FuzzToTurnRequest feeds arbitrary wire bytes through request validation:
// any request is either converted or rejected with field violations, never
// a panic.
func FuzzToTurnRequest(f *testing.F) {
	wiretest.AddRequestSeeds(f)
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
