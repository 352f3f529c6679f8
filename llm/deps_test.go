package llm_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestOnlyStandardLibrary keeps the ground floor free of every other
// package, turnstile's own included.
func TestOnlyStandardLibrary(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep != "github.com/turnstile-dev/turnstile/llm" {
			t.Errorf("llm depends on %s", dep)
		}
	}
}
