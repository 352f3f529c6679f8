package endpoint

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestImports keeps the shared settings free of SDKs and providers, so
// every adapter can embed them.
func TestImports(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const mod = "github.com/turnstile-dev/turnstile/"
	allowed := []string{mod + "providers/internal/endpoint", mod + "policy", mod + "llm"}
	for _, dep := range strings.Fields(string(out)) {
		if !slices.Contains(allowed, dep) {
			t.Errorf("endpoint depends on %s", dep)
		}
	}
}
