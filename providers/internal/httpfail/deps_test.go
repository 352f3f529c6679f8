package httpfail

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportBoundaries enforces the house layout for providers/: no
// provider depends on another, none imports gRPC, gen/, config or the
// server itself (an SDK may pull gRPC in), httpfail, stream and endpoint
// know no SDK, and providertest is for tests only: it knows no provider or
// SDK, and no package's non-test code depends on it.
func TestImportBoundaries(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	const mod = "github.com/turnstile-dev/turnstile/"
	providers := []string{"openai", "anthropic", "gemini"}
	list := func(pkg, format string) []string {
		out, err := exec.Command("go", "list", "-f", format, pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		return strings.Fields(string(out))
	}
	check := func(pkg string, deps, bad []string) {
		for _, dep := range deps {
			for _, b := range bad {
				if strings.HasPrefix(dep, b) {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
	const (
		allDeps    = `{{join .Deps " "}}`
		directDeps = `{{join .Imports " "}}`
	)
	httpfail := mod + "providers/internal/httpfail"
	providertest := mod + "providers/internal/providertest"
	sdksAndProviders := []string{
		"github.com/openai/", "github.com/anthropics/", "google.golang.org/genai", "google.golang.org/grpc",
		mod + "providers/openai", mod + "providers/anthropic", mod + "providers/gemini",
	}
	for _, shared := range []string{httpfail, mod + "providers/internal/stream", mod + "providers/internal/endpoint"} {
		check(shared, list(shared, allDeps), append(sdksAndProviders, providertest))
	}
	check(providertest, list(providertest, allDeps), sdksAndProviders)
	for _, p := range providers {
		pkg := mod + "providers/" + p
		var others []string
		for _, o := range providers {
			if o != p {
				others = append(others, mod+"providers/"+o)
			}
		}
		check(pkg, list(pkg, allDeps), append(others, providertest))
		check(pkg, list(pkg, directDeps), []string{mod + "gen/", mod + "server", mod + "config", "google.golang.org/grpc"})
	}
}
