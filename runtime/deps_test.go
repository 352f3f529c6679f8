package runtime_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsStayInside keeps the runtime free of gRPC, protobuf, the
// generated code and providers: data flows providers -> runtime -> server.
func TestImportsStayInside(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	forbidden := []string{"google.golang.org/grpc", "google.golang.org/protobuf", "turnstile/gen", "turnstile/providers", "turnstile/server", "turnstile/client"}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if strings.Contains(dep, f) {
				t.Errorf("runtime depends on %s", dep)
			}
		}
	}
}
