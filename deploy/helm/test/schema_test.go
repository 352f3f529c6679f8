package test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/deploy/helm/test/internal/chartgen"
)

// TestGeneratedFresh: the $defs of values.schema.json and the README's
// table of values are what chartgen makes of their sources now (the
// Kubernetes types, the server's schema, values.yaml): run go generate
// in deploy/helm/test when this fails.
func TestGeneratedFresh(t *testing.T) {
	read := func(name string) []byte {
		t.Helper()
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	schema := read(filepath.Join(chartDir, "values.schema.json"))
	got, err := chartgen.Schema(schema, read("../../../config/turnstile.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, schema) {
		t.Error("values.schema.json is stale: run go generate in deploy/helm/test")
	}
	readme := read(filepath.Join(chartDir, "README.md"))
	got, err = chartgen.README(readme, schema, read(filepath.Join(chartDir, "values.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, readme) {
		t.Error("README.md's table of values is stale: run go generate in deploy/helm/test")
	}
}

// TestTyposFail: a value the chart does not know fails helm lint and
// helm template, the message naming it, at every depth: the chart's own
// values, the Kubernetes objects it passes through, and turnstile's
// configuration.
func TestTyposFail(t *testing.T) {
	chart := chartCopy(t)
	for _, tc := range []struct {
		set  []string
		want []string
	}{
		{[]string{"replicaCout=3"}, []string{"additional properties 'replicaCout' not allowed"}},
		{[]string{"resources.limit.memory=2Gi"}, []string{"at '/resources': additional properties 'limit' not allowed"}},
		{[]string{"replicaCout=3", "resources.limit.memory=2Gi"}, []string{"'replicaCout'", "'limit'"}},
		{[]string{"securityContext.runAsUsr=1"}, []string{"at '/securityContext': additional properties 'runAsUsr' not allowed"}},
		{[]string{"affinity.nodeAffinity.requiredDuringScheduling=x"}, []string{"additional properties 'requiredDuringScheduling' not allowed"}},
		{[]string{"tls.secretNmae=x"}, []string{"at '/tls': additional properties 'secretNmae' not allowed"}},
		{[]string{"config.modles.x.provider=y"}, []string{"at '/config': additional properties 'modles' not allowed"}},
		{[]string{"store.mode=embeded"}, []string{"at '/store/mode'"}},
		{[]string{"simulator=yes"}, []string{"at '/simulator'"}},
	} {
		var args []string
		for _, s := range tc.set {
			args = append(args, "--set", s)
		}
		for _, verb := range [][]string{{"lint", "--strict", chart}, {"template", release, chart}} {
			out, err := helmCmd(t, append(verb, args...)...).CombinedOutput()
			if err == nil {
				t.Errorf("helm %s --set %v: no error", verb[0], tc.set)
				continue
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("helm %s --set %v: %s\nwant it to say %q", verb[0], tc.set, out, w)
				}
			}
		}
	}
}

// TestPackage: the chart packages, and the package lints and renders as
// the directory does, offline.
func TestPackage(t *testing.T) {
	chart := chartCopy(t)
	dst := t.TempDir()
	if out, err := helmCmd(t, "package", chart, "--destination", dst).CombinedOutput(); err != nil {
		t.Fatalf("helm package: %v\n%s", err, out)
	}
	pkgs, _ := filepath.Glob(filepath.Join(dst, "turnstile-*.tgz"))
	if len(pkgs) != 1 {
		t.Fatalf("helm package wrote %v", pkgs)
	}
	for _, f := range shapes(t) {
		if out, err := helmCmd(t, "lint", "--strict", pkgs[0], "-f", f).CombinedOutput(); err != nil {
			t.Errorf("helm lint --strict %s -f %s: %v\n%s", filepath.Base(pkgs[0]), filepath.Base(f), err, out)
		}
		if objs := render(t, pkgs[0], "-f", f); len(objs) < 5 {
			t.Errorf("helm template %s -f %s: %d objects", filepath.Base(pkgs[0]), filepath.Base(f), len(objs))
		}
	}
}
