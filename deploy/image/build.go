package main

import (
	"archive/tar"
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// options are what an image is built from.
type options struct {
	version  string // stamped into main.version
	repo     string // the repository's root
	arch     string // GOARCH
	caBundle string // the CA certificates to ship
	epoch    int64  // the time of the image and its files
}

// The image's shape, which the Dockerfile's final stage has too
// (image_test.go holds the two together).
const (
	binPath    = "/usr/local/bin/turnstile"
	caPath     = "/etc/ssl/certs/ca-certificates.crt"
	configPath = "/etc/turnstile/turnstile.yaml"
	uid        = 65532 // nonroot, as distroless names it
	user       = "65532:65532"
)

// exposed are the image's ports: gRPC (listen) and the ops listener
// (ops.listen: /healthz, /readyz, /metrics).
var exposed = []string{"7700/tcp", "9464/tcp"}

// buildFlags are the go build flags of the binary, the Dockerfile's: a
// static binary, without the build machine's paths, symbols or DWARF, with
// the version stamped.
func buildFlags(version string) []string {
	return []string{"-trimpath", "-buildvcs=false", "-ldflags=-s -w -X main.version=" + version}
}

// buildBinary builds ./cmd/turnstile of o.repo into out.
func buildBinary(o options, out string) error {
	abs, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	args := append([]string{"build"}, buildFlags(o.version)...)
	cmd := exec.Command("go", append(args, "-o", abs, "./cmd/turnstile")...)
	cmd.Dir = o.repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+o.arch)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/turnstile: %w\n%s", err, b)
	}
	return nil
}

// checkBinary checks that bin was built as buildBinary builds it for o,
// so that packing it gives the image a build would: from ./cmd/turnstile,
// static (CGO_ENABLED=0, no ELF interpreter) for linux/o.arch, -trimpath,
// stripped of its symbols and DWARF (-s -w: no .symtab, no .debug_*
// sections), and stamped with o.version, which `bin version` must print
// (the build information holds no -ldflags under -trimpath). It runs bin,
// so it must be for this machine.
func checkBinary(bin string, o options) error {
	var problems []string
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("-bin %s: %w", bin, err)
	}
	got := map[string]string{}
	for _, s := range info.Settings {
		got[s.Key] = s.Value
	}
	if info.Path != "github.com/turnstile-dev/turnstile/cmd/turnstile" {
		problems = append(problems, fmt.Sprintf("built from %s, not ./cmd/turnstile", info.Path))
	}
	want := map[string]string{"CGO_ENABLED": "0", "GOOS": "linux", "GOARCH": o.arch, "-trimpath": "true"}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if got[k] != want[k] {
			problems = append(problems, fmt.Sprintf("%s=%q, want %q", k, got[k], want[k]))
		}
	}
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("-bin %s: %w", bin, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			problems = append(problems, "dynamically linked (an ELF interpreter)")
		}
	}
	for _, sec := range f.Sections {
		if sec.Name == ".symtab" || strings.HasPrefix(sec.Name, ".debug_") || strings.HasPrefix(sec.Name, ".zdebug_") {
			problems = append(problems, "not stripped (section "+sec.Name+")")
			break
		}
	}
	if o.arch != runtime.GOARCH || runtime.GOOS != "linux" {
		problems = append(problems, fmt.Sprintf("for %s, which this %s/%s machine cannot run to read its version: build it instead", o.arch, runtime.GOOS, runtime.GOARCH))
	} else if out, err := exec.Command(bin, "version").Output(); err != nil {
		problems = append(problems, fmt.Sprintf("turnstile version: %v", err))
	} else if !strings.HasPrefix(string(out), "turnstile "+o.version+" ") {
		problems = append(problems, fmt.Sprintf("turnstile version prints %q, want turnstile %s", strings.TrimSpace(string(out)), o.version))
	}
	if problems != nil {
		return fmt.Errorf("-bin %s was not built as the image's binary is (CGO_ENABLED=0 GOOS=linux GOARCH=%s go build %s): %s",
			bin, o.arch, strings.Join(buildFlags(o.version), " "), strings.Join(problems, "; "))
	}
	return nil
}

// entry is a file or directory of the image's layer.
type entry struct {
	name string // without the leading slash
	mode int64
	uid  int
	data []byte // nil for a directory
}

// rootfs returns the layer's files: the binary, the CA bundle, the users
// and groups (root and nonroot, whose home is writable), and /tmp.
func rootfs(o options, bin string) ([]entry, error) {
	b, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(o.caBundle)
	if err != nil {
		return nil, fmt.Errorf("the CA certificates (Debian's ca-certificates): %w", err)
	}
	return []entry{
		{name: "etc/", mode: 0o755},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{name: "etc/ssl/", mode: 0o755},
		{name: "etc/ssl/certs/", mode: 0o755},
		{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: ca},
		{name: "etc/turnstile/", mode: 0o755},
		{name: "home/", mode: 0o755},
		{name: "home/nonroot/", mode: 0o700, uid: uid},
		{name: "root/", mode: 0o700},
		{name: "tmp/", mode: 0o1777},
		{name: "usr/", mode: 0o755},
		{name: "usr/local/", mode: 0o755},
		{name: "usr/local/bin/", mode: 0o755},
		{name: "usr/local/bin/turnstile", mode: 0o755, data: b},
	}, nil
}

// layerTar writes entries as an uncompressed tar, every time set to t.
func layerTar(entries []entry, t time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.uid, ModTime: t, Format: tar.FormatPAX}
		if e.data == nil {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// assemble makes the image of the binary bin: one layer, no base.
func assemble(o options, bin string) (v1.Image, error) {
	t := time.Unix(o.epoch, 0).UTC()
	entries, err := rootfs(o, bin)
	if err != nil {
		return nil, err
	}
	raw, err := layerTar(entries, t)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	ports := map[string]struct{}{}
	for _, p := range exposed {
		ports[p] = struct{}{}
	}
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{
		Architecture: o.arch,
		OS:           "linux",
		Config: v1.Config{
			User:       user,
			Entrypoint: []string{binPath},
			Cmd:        []string{"serve"},
			// serve reads the file TURNSTILE_CONFIG names; an explicit
			// --config wins over it.
			Env:          []string{"PATH=/usr/local/bin:/usr/bin:/bin", "TURNSTILE_CONFIG=" + configPath, "SSL_CERT_FILE=" + caPath},
			ExposedPorts: ports,
			WorkingDir:   "/",
			Labels: map[string]string{
				"org.opencontainers.image.title":   "turnstile",
				"org.opencontainers.image.version": o.version,
				"org.opencontainers.image.source":  "https://github.com/turnstile-dev/turnstile",
			},
		},
	})
	if err != nil {
		return nil, err
	}
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Created:   v1.Time{Time: t},
		CreatedBy: "deploy/image: " + binPath + " (go build " + fmt.Sprint(buildFlags(o.version)) + "), " + caPath + ", /etc/passwd, /tmp",
	}})
	if err != nil {
		return nil, err
	}
	img, err = mutate.CreatedAt(img, v1.Time{Time: t})
	if err != nil {
		return nil, err
	}
	return mutate.ConfigMediaType(mutate.MediaType(img, types.OCIManifestSchema1), types.OCIConfigJSON), nil
}

// writeArchive writes img as a docker archive tagged tag.
func writeArchive(path, tag string, img v1.Image) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("-tag %q: %w", tag, err)
	}
	return tarball.WriteToFile(path, ref, img)
}

// writeLayout writes img as an OCI image layout in dir.
func writeLayout(dir string, img v1.Image) error {
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendImage(img)
}

// compressedSize is what pulling img transfers: its layers, manifest and
// configuration.
func compressedSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	size := m.Config.Size
	for _, l := range m.Layers {
		size += l.Size
	}
	raw, err := img.RawManifest()
	return size + int64(len(raw)), err
}
