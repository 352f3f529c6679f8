package main

import (
	"archive/tar"
	"bufio"
	"crypto/x509"
	"debug/buildinfo"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// maxCompressed bounds what pulling the image transfers. It measured 21.7
// MiB (docs/deployment.md); the bound catches a layer gone astray (a
// binary with its symbols, a second copy of something).
const maxCompressed = 32 << 20

// testImage returns the docker archive under test and the version it must
// say: TURNSTILE_IMAGE (one CI built, stamped TURNSTILE_IMAGE_VERSION), or
// one built here from the repository, which takes a build of the binary.
func testImage(t *testing.T) (path, version string) {
	t.Helper()
	if path = os.Getenv("TURNSTILE_IMAGE"); path != "" {
		version = os.Getenv("TURNSTILE_IMAGE_VERSION")
		if version == "" {
			t.Fatal("TURNSTILE_IMAGE is set without TURNSTILE_IMAGE_VERSION, the version it must say")
		}
		return path, version
	}
	if testing.Short() {
		t.Skip("builds the binary and the image")
	}
	path, version = filepath.Join(t.TempDir(), "turnstile.tar"), "v9.8.7-image"
	var out strings.Builder
	if err := run([]string{"-version", version, "-tar", path}, &out); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
	return path, version
}

// layerFiles reads the image's one layer: each file's header, and the
// contents of the regular files.
func layerFiles(t *testing.T, img v1.Image) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	heads, files := map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := "/" + strings.TrimSuffix(h.Name, "/")
		heads[name] = h
		if h.Typeflag == tar.TypeReg {
			if files[name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	return heads, files
}

// TestImage checks the image as a runtime would see it: its configuration
// (user, entrypoint, command, environment, ports, platform), its one
// layer's files (a static, stripped binary built with -trimpath, CA
// certificates that parse, the user the configuration names in
// /etc/passwd with a home of its own, /tmp), the binary taken out of the
// layer and run (`turnstile version` says the stamped version), its size
// within a bound, and the Dockerfile's final stage the same image.
func TestImage(t *testing.T) {
	path, version := testImage(t)
	img, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	env := map[string]string{}
	for _, kv := range c.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("platform %s/%s, want linux/amd64", cf.OS, cf.Architecture)
	}
	if c.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532 (numeric, so that runAsNonRoot can tell)", c.User)
	}
	if !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/turnstile"}) || !slices.Equal(c.Cmd, []string{"serve"}) {
		t.Errorf("entrypoint %q, cmd %q; want [/usr/local/bin/turnstile] [serve]", c.Entrypoint, c.Cmd)
	}
	if env["TURNSTILE_CONFIG"] != "/etc/turnstile/turnstile.yaml" || env["SSL_CERT_FILE"] != "/etc/ssl/certs/ca-certificates.crt" {
		t.Errorf("env %q: want TURNSTILE_CONFIG=/etc/turnstile/turnstile.yaml and SSL_CERT_FILE the CA bundle", c.Env)
	}
	if got := slices.Sorted(maps.Keys(c.ExposedPorts)); !slices.Equal(got, []string{"7700/tcp", "9464/tcp"}) {
		t.Errorf("exposed ports %v, want 7700/tcp (gRPC) and 9464/tcp (ops)", got)
	}
	if c.Labels["org.opencontainers.image.version"] != version {
		t.Errorf("label org.opencontainers.image.version %q, want %q", c.Labels["org.opencontainers.image.version"], version)
	}

	heads, files := layerFiles(t, img)
	for _, name := range []string{"/usr/local/bin/turnstile", "/etc/ssl/certs/ca-certificates.crt", "/etc/passwd", "/etc/group"} {
		if files[name] == nil {
			t.Fatalf("the layer has no %s", name)
		}
	}
	if h := heads["/tmp"]; h == nil || h.Typeflag != tar.TypeDir || h.Mode != 0o1777 {
		t.Errorf("/tmp: %+v, want a directory with mode 1777", h)
	}
	if h := heads["/usr/local/bin/turnstile"]; h.Mode&0o111 == 0 || h.Uid != 0 {
		t.Errorf("the binary: mode %o, owner %d; want executable, owned by root", h.Mode, h.Uid)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(files["/etc/ssl/certs/ca-certificates.crt"]) || strings.Count(string(files["/etc/ssl/certs/ca-certificates.crt"]), "BEGIN CERTIFICATE") < 50 {
		t.Error("the CA bundle holds too few certificates")
	}
	uid, gid, _ := strings.Cut(c.User, ":")
	var home string
	sc := bufio.NewScanner(strings.NewReader(string(files["/etc/passwd"])))
	for sc.Scan() {
		if f := strings.Split(sc.Text(), ":"); len(f) == 7 && f[2] == uid && f[3] == gid {
			home = f[5]
		}
	}
	if h := heads[home]; home == "" || h == nil || h.Typeflag != tar.TypeDir || h.Uid != 65532 {
		t.Errorf("the user %s: no /etc/passwd entry with a home it owns (home %q, %+v)", c.User, home, h)
	}

	// The binary itself, taken out of the layer and run.
	bin := filepath.Join(t.TempDir(), "turnstile")
	if err := os.WriteFile(bin, files["/usr/local/bin/turnstile"], 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("turnstile version: %v", err)
	}
	if !strings.HasPrefix(string(out), "turnstile "+version+" ") {
		t.Errorf("turnstile version in the image prints %q, want turnstile %s", out, version)
	}
	t.Logf("turnstile version in the image: %s", strings.TrimSpace(string(out)))
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	if settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" {
		t.Errorf("the binary's build settings %v: want CGO_ENABLED=0 and -trimpath", settings)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Section(".symtab") != nil || f.Section(".debug_info") != nil {
		t.Error("the binary is not stripped (-s -w)")
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary is dynamically linked: the image has no libc")
		}
	}

	size, err := compressedSize(img)
	if err != nil {
		t.Fatal(err)
	}
	digest, _ := img.Digest()
	t.Logf("image %s: %d bytes compressed (%.1f MiB), binary %d bytes (%.1f MiB)", digest, size, float64(size)/(1<<20),
		len(files["/usr/local/bin/turnstile"]), float64(len(files["/usr/local/bin/turnstile"]))/(1<<20))
	if size > maxCompressed {
		t.Errorf("the image is %d bytes compressed, over the bound %d", size, maxCompressed)
	}

	checkDockerfile(t, cf, heads)
}

// checkDockerfile holds the Dockerfile's final stage to the image: the
// same build flags, user, entrypoint, command, environment, ports and
// files, so that Docker users get the image CI checks.
func checkDockerfile(t *testing.T, cf *v1.ConfigFile, heads map[string]*tar.Header) {
	t.Helper()
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	text := regexp.MustCompile(`\\\n\s*`).ReplaceAllString(string(b), " ")
	var final []string // the final stage's instructions
	var buildLine string
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "FROM ") {
			final = nil
		}
		if strings.Contains(line, "go build") {
			buildLine = line
		}
		final = append(final, line)
	}
	if len(final) == 0 || final[0] != "FROM scratch" {
		t.Fatalf("the Dockerfile's final stage starts %q, want FROM scratch (no base image, as deploy/image builds)", final[:min(1, len(final))])
	}
	want := []string{"-trimpath", "-buildvcs=false", `-ldflags="-s -w -X main.version=${VERSION}"`, "CGO_ENABLED=0"}
	for _, w := range want {
		if !strings.Contains(buildLine, w) {
			t.Errorf("the Dockerfile builds with %q: no %s (deploy/image builds with %q)", buildLine, w, buildFlags("${VERSION}"))
		}
	}
	c := cf.Config
	got := map[string][]string{}
	for _, in := range final[1:] {
		cmd, args, _ := strings.Cut(in, " ")
		got[cmd] = append(got[cmd], args)
	}
	var env []string
	for _, e := range got["ENV"] {
		env = append(env, e)
	}
	if !slices.Equal(slices.Sorted(slices.Values(env)), slices.Sorted(slices.Values(c.Env))) {
		t.Errorf("Dockerfile ENV %q; the image's %q", env, c.Env)
	}
	var ports []string
	for _, e := range got["EXPOSE"] {
		for _, p := range strings.Fields(e) {
			ports = append(ports, p+"/tcp")
		}
	}
	if !slices.Equal(slices.Sorted(slices.Values(ports)), slices.Sorted(maps.Keys(c.ExposedPorts))) {
		t.Errorf("Dockerfile EXPOSE %v; the image's %v", ports, slices.Sorted(maps.Keys(c.ExposedPorts)))
	}
	if u := got["USER"]; len(u) != 1 || u[0] != c.User {
		t.Errorf("Dockerfile USER %q; the image's %q", u, c.User)
	}
	for _, kv := range []struct {
		cmd  string
		want []string
	}{{"ENTRYPOINT", c.Entrypoint}, {"CMD", c.Cmd}} {
		var a []string
		if v := got[kv.cmd]; len(v) != 1 || json.Unmarshal([]byte(v[0]), &a) != nil || !slices.Equal(a, kv.want) {
			t.Errorf("Dockerfile %s %q; the image's %q", kv.cmd, v, kv.want)
		}
	}
	// Every file of the image is made by the Dockerfile: under /out/rootfs
	// by its build stage, or as a COPY's destination, or as their parents.
	made := map[string]bool{}
	add := func(p string) {
		for p = strings.TrimSuffix(p, "/"); p != "" && p != "/"; p = filepath.Dir(p) {
			made[p] = true
		}
	}
	for _, m := range regexp.MustCompile(`/out/rootfs(/[\w./-]*)`).FindAllStringSubmatch(text, -1) {
		add(m[1])
	}
	for _, in := range got["COPY"] {
		f := strings.Fields(in)
		add(f[len(f)-1])
		if strings.Contains(in, "--chown=65532:65532") && heads[f[len(f)-1]] != nil && heads[f[len(f)-1]].Uid != 65532 {
			t.Errorf("the Dockerfile gives %s to 65532, the image does not", f[len(f)-1])
		}
	}
	for name := range heads {
		if !made[name] {
			t.Errorf("the image's %s is not made by the Dockerfile", name)
		}
	}
}

// TestReproducible: the same binary and inputs make the same image, byte
// for byte, whatever the time of the build.
func TestReproducible(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "turnstile")
	if err := os.WriteFile(bin, []byte("\x7fELF not a real binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	o := options{version: "v1.0.0", arch: "amd64", caBundle: "/etc/ssl/certs/ca-certificates.crt"}
	if _, err := os.Stat(o.caBundle); err != nil {
		o.caBundle = bin // any file: this test compares two builds
	}
	var digests []v1.Hash
	for range 2 {
		img, err := assemble(o, bin)
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d)
	}
	if digests[0] != digests[1] {
		t.Errorf("two builds of the same inputs: %s and %s", digests[0], digests[1])
	}
}
