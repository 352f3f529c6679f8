package mcp_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// serverBin is the stdio test server built from testdata/testserver.
var serverBin string

// TestMain builds the test server once for all tests (each test starts its
// own processes from it) and checks that no goroutine outlives the tests.
func TestMain(m *testing.M) {
	code := run(m)
	os.Exit(code)
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "mcp-testserver-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	serverBin = filepath.Join(dir, "testserver")
	build := exec.Command("go", "build", "-o", serverBin, "./testdata/testserver")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the test server:", err)
		return 1
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}
