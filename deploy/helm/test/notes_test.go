package test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// notes renders the chart's NOTES.txt with args, as helm install prints
// it: helm template leaves NOTES.txt out, so the copy of the chart gets it
// as a named template too, and a ConfigMap that holds its rendering.
func notes(t *testing.T, chart string, args ...string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chart, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "turnstile")
	if err := os.CopyFS(dir, os.DirFS(chart)); err != nil {
		t.Fatal(err)
	}
	define := `{{- define "test.notes" -}}` + string(b) + `{{- end }}`
	cm := `{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "notes"}, "data": {"notes": {{ include "test.notes" . | toJson }}}}`
	for name, text := range map[string]string{"_test_notes.tpl": define, "test-notes.yaml": cm} {
		if err := os.WriteFile(filepath.Join(dir, "templates", name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range find[corev1.ConfigMap](render(t, dir, append(args, "--show-only", "templates/test-notes.yaml")...)) {
		return c.Data["notes"]
	}
	t.Fatal("the notes were not rendered")
	return ""
}

// TestNotes holds what helm install prints to each shape: where the
// gRPC port is in the cluster, a port-forward and a grpcurl line that
// works with the shape's TLS and client key (its request a
// RunTurnRequest), how to run helm test when there is a test to run, and
// a warning when the release serves the simulator or plaintext.
func TestNotes(t *testing.T) {
	chart := chartCopy(t)
	grpcurl := regexp.MustCompile(`grpcurl (.*)\\\n\s+-d '([^']*)' \\\n\s+127\.0\.0\.1:7700 turnstile\.v1\.AgentService/RunTurn`)
	for _, f := range append([]string{""}, shapes(t)...) {
		name, args := "defaults", []string(nil)
		if f != "" {
			name, args = filepath.Base(f), []string{"-f", f}
		}
		t.Run(name, func(t *testing.T) {
			text := notes(t, chart, args...)
			objs := render(t, chart, args...)
			cfg := renderedConfig(t, chart, args...)
			service := release + "-turnstile." + namespace + ".svc"
			for _, want := range []string{service + ":7700", "kubectl -n " + namespace + " port-forward svc/" + release + "-turnstile 7700:7700", "/healthz, /readyz, /metrics"} {
				if !strings.Contains(text, want) {
					t.Errorf("the notes do not say %q:\n%s", want, text)
				}
			}
			m := grpcurl.FindStringSubmatch(text)
			if m == nil {
				t.Fatalf("no grpcurl RunTurn line:\n%s", text)
			}
			var req turnstilev1.RunTurnRequest
			if err := protojson.Unmarshal([]byte(m[2]), &req); err != nil {
				t.Errorf("grpcurl -d %s: not a RunTurnRequest: %v", m[2], err)
			}
			flags := m[1]
			tls := cfg.Server.TLS != nil
			if strings.Contains(flags, "-plaintext") == tls || strings.Contains(flags, "-cacert") != tls {
				t.Errorf("grpcurl %s with the server's TLS %v", flags, tls)
			}
			if tls && !strings.Contains(flags, "-servername "+service) {
				t.Errorf("grpcurl %s: through a port-forward, TLS must check the Service's name %s", flags, service)
			}
			if mtls := tls && cfg.Server.TLS.ClientCAFile != ""; strings.Contains(flags, "-cert ") != mtls {
				t.Errorf("grpcurl %s with mutual TLS %v", flags, mtls)
			}
			if keys := len(cfg.Auth.Keys) > 0; strings.Contains(flags, "authorization: Bearer") != keys {
				t.Errorf("grpcurl %s with %d client keys", flags, len(cfg.Auth.Keys))
			}
			if hasTest := len(find[corev1.Pod](objs)) > 0; strings.Contains(text, "helm test "+release+" -n "+namespace) != hasTest {
				t.Errorf("the notes' helm test line, with a test Pod rendered %v:\n%s", hasTest, text)
			}
			if sim := len(simulators(cfg)) > 0; strings.Contains(text, "serves the simulator") != sim {
				t.Errorf("the notes' simulator warning, with the simulator served %v:\n%s", sim, text)
			}
			if strings.Contains(text, "the gRPC port is plaintext") == tls {
				t.Errorf("the notes' plaintext warning, with TLS %v:\n%s", tls, text)
			}
		})
	}
}
