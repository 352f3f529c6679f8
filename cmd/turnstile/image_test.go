package main

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"gopkg.in/yaml.v3"

	"github.com/turnstile-dev/turnstile/config"
	"github.com/turnstile-dev/turnstile/store"
)

// No container engine runs where the tests run: these tests hold the
// Dockerfile, .dockerignore and deploy/compose.yaml to what the image and
// the server need, as far as that can be checked without building the
// image.

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, RUN, COPY...
	args string
}

func dockerfile(t *testing.T) []instruction {
	t.Helper()
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var out []instruction
	var cur strings.Builder
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if s, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.TrimSpace(args)})
		cur.Reset()
	}
	return out
}

var pinned = regexp.MustCompile(`^[a-z0-9./-]+:[A-Za-z0-9._-]+@sha256:[0-9a-f]{64}$`)

// jsonArgs decodes an exec-form instruction: ["a", "b"].
func jsonArgs(t *testing.T, in instruction) []string {
	t.Helper()
	var a []string
	if err := yaml.Unmarshal([]byte(in.args), &a); err != nil || !strings.HasPrefix(in.args, "[") {
		t.Fatalf("%s %s: not in exec form", in.cmd, in.args)
	}
	return a
}

// TestDockerfile holds the image to what serve needs: base images pinned
// by digest (or none: scratch), the configuration named by
// TURNSTILE_CONFIG with no --config in the CMD to override it, a static,
// stripped binary where ENTRYPOINT runs it, a numeric non-root user, and
// the version stamped where `turnstile version` reads it.
func TestDockerfile(t *testing.T) {
	ins := dockerfile(t)
	stages := map[string]bool{}
	var (
		out, copied, entry, pkg, ldflags, user, buildRun string
		env                                              = map[string]string{}
		cmd                                              []string
		hasVersionArg                                    bool
	)
	goBuild := regexp.MustCompile(`go build .*-ldflags="([^"]*)" .*-o (\S+) (\./\S+)$`)
	for _, in := range ins {
		switch in.cmd {
		case "FROM":
			f := strings.Fields(in.args)
			if !stages[f[0]] && f[0] != "scratch" && !pinned.MatchString(f[0]) {
				t.Errorf("FROM %s: not pinned as name:tag@sha256:digest", f[0])
			}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				stages[f[2]] = true
			}
		case "ARG":
			hasVersionArg = hasVersionArg || strings.HasPrefix(in.args, "VERSION")
		case "RUN":
			if m := goBuild.FindStringSubmatch(in.args); m != nil {
				ldflags, out, pkg, buildRun = m[1], m[2], m[3], in.args
			}
		case "COPY":
			if f := strings.Fields(in.args); len(f) == 3 && strings.HasPrefix(f[0], "--from=") {
				if !stages[strings.TrimPrefix(f[0], "--from=")] {
					t.Errorf("COPY %s: no such stage", in.args)
				}
				if f[1] == out {
					copied = f[2]
				}
			}
		case "ENV":
			k, v, _ := strings.Cut(in.args, "=")
			env[k] = v
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entry = jsonArgs(t, in)[0]
		case "CMD":
			cmd = jsonArgs(t, in)
		}
	}
	if out == "" || copied == "" {
		t.Fatalf("no go build -o ... ./cmd/... whose output the final stage copies (out %q, copied %q)", out, copied)
	}
	if entry != copied {
		t.Errorf("ENTRYPOINT runs %s, the binary is copied to %s", entry, copied)
	}
	if fi, err := os.Stat(filepath.Join("../..", pkg)); err != nil || !fi.IsDir() {
		t.Errorf("go build %s: no such package directory", pkg)
	}
	if !hasVersionArg || !strings.Contains(ldflags, "-X main.version=${VERSION}") {
		t.Errorf("the build does not stamp ARG VERSION into main.version: ldflags %q", ldflags)
	}
	// Static (the final stage is scratch: no libc), without the build
	// machine's paths, stripped.
	for _, want := range []string{"CGO_ENABLED=0 go build", "-trimpath"} {
		if !strings.Contains(buildRun, want) {
			t.Errorf("RUN %s: no %s", buildRun, want)
		}
	}
	if !strings.HasPrefix(ldflags, "-s -w ") {
		t.Errorf("ldflags %q: not stripped (-s -w)", ldflags)
	}
	// A numeric user, so that Kubernetes' runAsNonRoot can tell it is not
	// root.
	if !regexp.MustCompile(`^[1-9][0-9]*:[0-9]+$`).MatchString(user) {
		t.Errorf("USER %q: want a numeric uid:gid other than root", user)
	}
	if !slices.Equal(cmd, []string{"serve"}) {
		t.Errorf("CMD %q: want [serve], so that TURNSTILE_CONFIG chooses the file", cmd)
	}
	if env["TURNSTILE_CONFIG"] != "/etc/turnstile/turnstile.yaml" {
		t.Errorf("ENV TURNSTILE_CONFIG = %q, want /etc/turnstile/turnstile.yaml (deploy/turnstile.yaml's header)", env["TURNSTILE_CONFIG"])
	}

	// The image's ldflags, built here: the version they stamp is the one
	// `turnstile version` prints.
	if testing.Short() {
		t.Skip("builds a binary")
	}
	bin := filepath.Join(t.TempDir(), "turnstile")
	flags := strings.ReplaceAll(ldflags, "${VERSION}", "v9.8.7-image")
	build := exec.Command("go", "build", "-ldflags="+flags, "-o", bin, ".")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -ldflags=%q: %v\n%s", flags, err, b)
	}
	got, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(got), "turnstile v9.8.7-image ") {
		t.Errorf("turnstile version = %q, want it to start with turnstile v9.8.7-image", got)
	}
}

// dockerignored reports whether a .dockerignore pattern list excludes
// name (slash-separated, relative to the context): a pattern excludes
// what it matches and everything beneath; "**/" at its start matches any
// depth; "!" re-includes; the last matching pattern wins.
func dockerignored(patterns []string, name string) bool {
	excluded := false
	for _, p := range patterns {
		neg := strings.HasPrefix(p, "!")
		p = strings.TrimPrefix(strings.TrimPrefix(p, "!"), "/")
		anyDepth := strings.HasPrefix(p, "**/")
		p = strings.TrimPrefix(p, "**/")
		parts := strings.Split(name, "/")
		match := false
		for start := 0; start < len(parts) && !match; start++ {
			if start > 0 && !anyDepth {
				break
			}
			for end := start + 1; end <= len(parts); end++ {
				if ok, _ := path.Match(p, strings.Join(parts[start:end], "/")); ok {
					match = true
					break
				}
			}
		}
		if match {
			excluded = !neg
		}
	}
	return excluded
}

// TestDockerignore holds .dockerignore to the build: every file go build
// ./cmd/turnstile reads from the module is in the context, and what only
// weighs it down or may hold secrets (.git, node_modules, build outputs)
// is not.
func TestDockerignore(t *testing.T) {
	b, err := os.ReadFile("../../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.Contains(strings.TrimPrefix(line, "**/"), "**") {
			t.Fatalf(".dockerignore: %q: ** only at the start, as dockerignored understands", line)
		}
		patterns = append(patterns, line)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	list := exec.Command("go", "list", "-deps", "-f",
		`{{if .Module}}{{if .Module.Main}}{{range .GoFiles}}{{$.Dir}}/{{.}}
{{end}}{{range .EmbedFiles}}{{$.Dir}}/{{.}}
{{end}}{{end}}{{end}}`, "./cmd/turnstile")
	list.Dir = root
	got, err := list.Output()
	if err != nil {
		t.Fatal(err)
	}
	need := []string{"go.mod", "go.sum"}
	for f := range strings.Lines(string(got)) {
		if f = strings.TrimSpace(f); f != "" {
			rel, err := filepath.Rel(root, f)
			if err != nil {
				t.Fatal(err)
			}
			need = append(need, filepath.ToSlash(rel))
		}
	}
	if len(need) < 50 {
		t.Fatalf("go list found %d files the build reads; expected many more", len(need))
	}
	for _, f := range need {
		if dockerignored(patterns, f) {
			t.Errorf(".dockerignore excludes %s, which go build ./cmd/turnstile reads", f)
		}
	}
	for _, f := range []string{".git/config", "node_modules/x", "clients/ts/node_modules/x/index.js", "examples/node/node_modules/y",
		"turnstile", "cmd/turnstile/turnstile.test", "cover.out", "clients/python/turnstile/__pycache__/a.pyc"} {
		if !dockerignored(patterns, f) {
			t.Errorf(".dockerignore sends %s to the build", f)
		}
	}
}

// compose is what the test reads of a compose file.
type compose struct {
	Services map[string]struct {
		Image       string
		Build       *struct{ Context string }
		Deploy      struct{ Replicas int }
		Ports       []string
		Command     []string
		Environment map[string]string
		Configs     []struct{ Source, Target string }
	}
	Configs map[string]struct{ Content string }
}

// TestCompose holds deploy/compose.yaml, which docs/deployment.md shows, to
// the image and the servers: turnstile reads the file TURNSTILE_CONFIG names,
// and that file is a valid configuration using the NATS services, whose
// gRPC and ops ports are published on the host's loopback for every
// replica; every NATS server runs JetStream in one cluster with max_payload
// raised to 8 MiB; every image it pulls is pinned.
func TestCompose(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile("../../docs/deployment.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), "```yaml\n"+string(raw)+"```\n") {
		t.Error("docs/deployment.md does not show deploy/compose.yaml as it is")
	}
	var c compose
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	mounted := func(name, target string) string {
		for _, m := range c.Services[name].Configs {
			if m.Target == target {
				cfg, ok := c.Configs[m.Source]
				if !ok {
					t.Fatalf("services.%s: config %q is not defined", name, m.Source)
				}
				return cfg.Content
			}
		}
		t.Fatalf("services.%s: nothing is mounted at %s", name, target)
		return ""
	}

	natsRoutes := map[string]bool{}
	natsClients := map[string]bool{}
	var turnstiles []string
	for name, s := range c.Services {
		switch {
		case s.Build != nil:
			turnstiles = append(turnstiles, name)
			if fi, err := os.Stat(filepath.Join("../../deploy", s.Build.Context, "Dockerfile")); err != nil || fi.IsDir() {
				t.Errorf("services.%s.build.context %q holds no Dockerfile", name, s.Build.Context)
			}
		case !pinned.MatchString(s.Image):
			t.Errorf("services.%s.image %q is not pinned as name:tag@sha256:digest", name, s.Image)
		}
		if !strings.HasPrefix(s.Image, "nats:") {
			continue
		}
		natsClients["nats://"+name+":4222"] = true
		natsRoutes["nats://"+name+":6222"] = true
	}
	for name, s := range c.Services {
		if !strings.HasPrefix(s.Image, "nats:") {
			continue
		}
		i := slices.Index(s.Command, "--config")
		if i < 0 || i+1 >= len(s.Command) {
			t.Fatalf("services.%s.command %q: no --config", name, s.Command)
		}
		if j := slices.Index(s.Command, "--name"); j < 0 || s.Command[j+1] != name {
			t.Errorf("services.%s.command %q: --name is not %s (JetStream in a cluster needs unique names)", name, s.Command, name)
		}
		file := filepath.Join(t.TempDir(), "nats.conf")
		if err := os.WriteFile(file, []byte(mounted(name, s.Command[i+1])), 0o600); err != nil {
			t.Fatal(err)
		}
		opts, err := natsserver.ProcessConfigFile(file)
		if err != nil {
			t.Fatalf("services.%s: nats-server rejects its configuration: %v", name, err)
		}
		if opts.MaxPayload < 8<<20 {
			t.Errorf("services.%s: max_payload %d, want at least 8 MiB (a turn's request is up to 4 MiB)", name, opts.MaxPayload)
		}
		if !opts.JetStream {
			t.Errorf("services.%s: JetStream is off", name)
		}
		if opts.Cluster.Name == "" {
			t.Errorf("services.%s: no cluster name", name)
		}
		for _, r := range opts.Routes {
			if !natsRoutes[r.String()] {
				t.Errorf("services.%s: route %s is no NATS service's cluster port", name, r)
			}
		}
		if len(opts.Routes) != len(natsRoutes) || len(natsRoutes) != 3 {
			t.Errorf("services.%s: %d routes over %d NATS services, want 3 and 3", name, len(opts.Routes), len(natsRoutes))
		}
	}

	if len(turnstiles) != 1 {
		t.Fatalf("%d services build turnstile, want 1", len(turnstiles))
	}
	name := turnstiles[0]
	s := c.Services[name]
	file := s.Environment["TURNSTILE_CONFIG"]
	if file == "" {
		t.Fatalf("services.%s sets no TURNSTILE_CONFIG", name)
	}
	if slices.Contains(s.Command, "--config") {
		t.Errorf("services.%s.command %q passes --config, which wins over TURNSTILE_CONFIG", name, s.Command)
	}
	cfg, err := config.Parse(file, []byte(mounted(name, file)))
	if err != nil {
		t.Fatalf("services.%s: its configuration: %v", name, err)
	}
	if cfg.Store.Mode != store.ModeNATS {
		t.Errorf("services.%s: store.mode %q, want nats", name, cfg.Store.Mode)
	}
	for _, u := range strings.Split(cfg.Store.NATS.URL, ",") {
		if !natsClients[u] {
			t.Errorf("services.%s: store.nats.url holds %s, no NATS service's client port", name, u)
		}
	}
	if cfg.Ops.Listen == "" {
		t.Errorf("services.%s: no ops.listen: nothing answers /readyz", name)
	}

	// The gRPC and ops ports published on the host's loopback (the
	// configuration is plaintext), a host port for each replica.
	published := map[string]int{} // container port -> host ports
	for _, p := range s.Ports {
		m := regexp.MustCompile(`^127\.0\.0\.1:(\d+)(?:-(\d+))?:(\d+)$`).FindStringSubmatch(p)
		if m == nil {
			t.Errorf("services.%s.ports %q: want 127.0.0.1:FIRST-LAST:PORT (loopback only: the configuration has no TLS)", name, p)
			continue
		}
		first, _ := strconv.Atoi(m[1])
		last := first
		if m[2] != "" {
			last, _ = strconv.Atoi(m[2])
		}
		published[m[3]] += last - first + 1
	}
	replicas := max(s.Deploy.Replicas, 1)
	for _, listen := range []string{cfg.Listen, cfg.Ops.Listen} {
		_, port, err := net.SplitHostPort(listen)
		if err != nil {
			t.Fatal(err)
		}
		if published[port] < replicas {
			t.Errorf("services.%s: %s is published on %d host ports, want one for each of the %d replicas", name, listen, published[port], replicas)
		}
	}
}
