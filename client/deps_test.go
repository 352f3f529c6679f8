package client_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImports keeps the client free of the server side: it speaks the
// generated contract over gRPC and nothing else of the project.
func TestImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range []string{"turnstile/runtime", "turnstile/server", "turnstile/providers", "turnstile/config", "turnstile/tools"} {
			if strings.Contains(dep, f) {
				t.Errorf("the client depends on %s", dep)
			}
		}
	}
}
