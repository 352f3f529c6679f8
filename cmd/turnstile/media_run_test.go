package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/providers/sim"
)

// TestRunSendsMedia: --image and --file send the files with the prompt, in
// order, their types from the extension or the content; the simulator, as
// the model, says what it received.
func TestRunSendsMedia(t *testing.T) {
	p, err := sim.New("sim", sim.Config{TokenDelay: -1})
	if err != nil {
		t.Fatal(err)
	}
	addr := startTestServer(t, p)
	dir := t.TempDir()
	png := append([]byte("\x89PNG\r\n\x1a\n"), make([]byte, 32)...)
	write := func(name string, data []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	shot, doc := write("shot", png), write("doc.pdf", []byte("%PDF-1.7 tiny"))

	code, out, _ := runCLI(t, "--addr", addr, "--image", shot, "what", "is", "this?", "--file", doc)
	if code != exitOK {
		t.Fatalf("exit code %d", code)
	}
	if want := "I received 2 media: image/png of 40 bytes named 'shot'; application/pdf of 13 bytes named 'doc.pdf'."; !strings.Contains(out, want) {
		t.Errorf("stdout %q lacks %q", out, want)
	}

	for _, tt := range []struct {
		args []string
		says string
	}{
		{[]string{"--image", doc, "hi"}, "--image " + doc + ": not an image (application/pdf); use --file"},
		{[]string{"--file", filepath.Join(dir, "missing.png"), "hi"}, "--file: open"},
	} {
		code, _, errOut := runCLI(t, append([]string{"--addr", addr}, tt.args...)...)
		if code != exitUsage || !strings.Contains(errOut, tt.says) {
			t.Errorf("run %q = %d, %q; want %d saying %q", tt.args, code, errOut, exitUsage, tt.says)
		}
	}
}
