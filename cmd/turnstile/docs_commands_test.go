package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	_ "github.com/turnstile-dev/turnstile/gen/turnstile/v1" // registers the contract
)

// TestDocsCommands checks the commands README.md and docs/ show, as far as
// a test can without the tools and servers they need (the turns they run
// are run by the tests that hold each example: TestREADMEDirectiveExample*,
// the examples' and clients' tests): a grpcurl request parses as its
// method's request (protojson, unknown fields refused) and names a method
// of the service; `turnstile` subcommands exist; `go test` names packages
// that exist and -run/-bench patterns that match a test or benchmark there;
// every repository path a command names exists.
func TestDocsCommands(t *testing.T) {
	pages, _ := filepath.Glob("../../docs/*.md")
	pages = append(pages, "../../README.md", "../../BENCHMARKS.md", "../../ARCHITECTURE.md")
	checked := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, cmd := range commands(string(b)) {
			name := filepath.Base(page) + ": " + clipCmd(cmd)
			if checkCommand(t, name, cmd) {
				checked++
			}
		}
	}
	if checked < 10 {
		t.Fatalf("only %d commands found in the docs: the scan no longer reads them", checked)
	}
	t.Logf("%d commands checked", checked)
}

// commands returns the shell commands of a page: the lines of its indented
// and fenced code blocks that start with a command this test knows, with
// continuation lines ('\' at the end) joined.
func commands(page string) []string {
	var out []string
	lines := strings.Split(page, "\n")
	fenced := false
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		if !fenced && !strings.HasPrefix(l, "    ") {
			continue
		}
		cmd := strings.TrimSpace(l)
		for strings.HasSuffix(cmd, `\`) && i+1 < len(lines) {
			i++
			cmd = strings.TrimSuffix(cmd, `\`) + " " + strings.TrimSpace(lines[i])
		}
		if knownCommand.MatchString(cmd) {
			out = append(out, cmd)
		}
	}
	return out
}

var knownCommand = regexp.MustCompile(`^(\(cd \S+ && )?(grpcurl|go run|go test|turnstile|helm|python3|PYTHONPATH=\S+ \S*python3)\b`)

func clipCmd(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

var (
	grpcurlCall = regexp.MustCompile(`grpcurl .*-d '([^']*)'.* (turnstile\.v1\.AgentService)/(\w+)`)
	subcommand  = regexp.MustCompile(`(?:go run \./cmd/turnstile|^turnstile) (\w+)`)
	repoPath    = regexp.MustCompile(`(?:^|[\s=])((?:\./)?(?:cmd|examples|deploy|clients|server|store|config|internal|providers|runtime|client|policy|telemetry|tools)(?:/[\w.\-]+)+/?)`)
	goTestPkg   = regexp.MustCompile(`go test .*?(\./[\w/]+)\s*(?:#|$)`)
	runFlag     = regexp.MustCompile(`-run '?([^\s']+)'?`)
	benchFlag   = regexp.MustCompile(`-bench '?([^\s']+)'?`)
)

// checkCommand checks one command; it reports whether the command was one
// this test checks.
func checkCommand(t *testing.T, name, cmd string) bool {
	t.Helper()
	ok := false
	if m := grpcurlCall.FindStringSubmatch(cmd); m != nil {
		ok = true
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(m[2]))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			return ok
		}
		method := d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(m[3]))
		if method == nil {
			t.Errorf("%s: %s has no method %s", name, m[2], m[3])
			return ok
		}
		req := dynamicpb.NewMessage(method.Input())
		if err := protojson.Unmarshal([]byte(m[1]), req); err != nil {
			t.Errorf("%s: the request is not a %s: %v", name, method.Input().FullName(), err)
		}
	}
	if m := subcommand.FindStringSubmatch(cmd); m != nil {
		ok = true
		if !slices.Contains([]string{"serve", "run", "bench", "config", "version", "help"}, m[1]) {
			t.Errorf("%s: turnstile has no subcommand %q", name, m[1])
		}
	}
	for _, m := range repoPath.FindAllStringSubmatch(cmd, -1) {
		ok = true
		if _, err := os.Stat(filepath.Join("../..", m[1])); err != nil {
			t.Errorf("%s: %s does not exist", name, m[1])
		}
	}
	if m := goTestPkg.FindStringSubmatch(cmd); m != nil && !strings.HasSuffix(m[1], "...") {
		ok = true
		dir := filepath.Join("../..", m[1])
		if r := runFlag.FindStringSubmatch(cmd); r != nil {
			checkPattern(t, name, dir, "Test", r[1])
		}
		if r := benchFlag.FindStringSubmatch(cmd); r != nil {
			checkPattern(t, name, dir, "Benchmark", r[1])
		}
	}
	return ok
}

// checkPattern checks that a -run or -bench pattern matches a function
// named kind* of the package in dir; XXX and ^$ (run nothing) match none
// on purpose.
func checkPattern(t *testing.T, name, dir, kind, pattern string) {
	t.Helper()
	if pattern == "XXX" || pattern == "^$" {
		return
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		t.Errorf("%s: pattern %q: %v", name, pattern, err)
		return
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*_test.go"))
	decl := regexp.MustCompile(`(?m)^func (` + kind + `\w*)\(`)
	for _, f := range files {
		b, _ := os.ReadFile(f)
		for _, m := range decl.FindAllSubmatch(b, -1) {
			if re.Match(m[1]) {
				return
			}
		}
	}
	t.Errorf("%s: no %s function of %s matches %q", name, kind, dir, pattern)
}
