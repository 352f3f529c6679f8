package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// docPages returns the pages whose links TestDocsLinks checks, relative to
// the repository's root: README.md, docs/*.md, ARCHITECTURE.md,
// BENCHMARKS.md and the clients' READMEs.
func docPages(t *testing.T, root string) []string {
	t.Helper()
	pages := []string{"README.md", "ARCHITECTURE.md", "BENCHMARKS.md"}
	for _, glob := range []string{"docs/*.md", "clients/*/README.md"} {
		m, err := filepath.Glob(filepath.Join(root, glob))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range m {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				t.Fatal(err)
			}
			pages = append(pages, filepath.ToSlash(rel))
		}
	}
	return pages
}

// TestDocsLinks fails on a relative link of a documentation page whose file
// does not exist, or whose #anchor names no heading of the page it points
// to (GitHub's anchors), so moving a section cannot leave a link behind.
func TestDocsLinks(t *testing.T) {
	const root = "../.."
	pages := docPages(t, root)
	if !slices.Contains(pages, "docs/contract.md") || !slices.Contains(pages, "clients/ts/README.md") {
		t.Fatalf("pages = %v, want docs/*.md and clients/*/README.md among them", pages)
	}
	for _, p := range pages {
		for _, problem := range checkLinks(root, p) {
			t.Error(problem)
		}
	}
}

// TestCheckLinksFindsBrokenLinks holds the checker to what it must catch:
// a missing file, a missing anchor in another page and in the page itself;
// and to what it must let through: links in code, external links, line
// anchors of source files, a heading's GitHub anchor.
func TestCheckLinksFindsBrokenLinks(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("main.go", "package main\n")
	write("docs/other.md", "# Other page\n\n## Sizing the store (issue #12)\n\n## Sizing the store (issue #12)\n")
	write("README.md", strings.Join([]string{
		"# Title",
		"## `store.max_bytes`: the *limit*",
		"[ok](docs/other.md) [ok](docs/other.md#sizing-the-store-issue-12) [ok](docs/other.md#sizing-the-store-issue-12-1)",
		"[ok](#storemax_bytes-the-limit) [ok](main.go#L1) [ok](https://example.com/x#y) [ok](docs)",
		"`[not a link](gone.md)`",
		"```",
		"[not a link](gone.md)",
		"```",
		"[bad](gone.md) [bad](docs/other.md#sizing) [bad](#nowhere) [bad](main.go#main)",
	}, "\n"))
	got := checkLinks(dir, "README.md")
	want := []string{
		"README.md:9: gone.md: no such file",
		"README.md:9: docs/other.md#sizing: no such heading in docs/other.md",
		"README.md:9: #nowhere: no such heading in README.md",
		"README.md:9: main.go#main: an anchor in a file that is not Markdown",
	}
	if !slices.Equal(got, want) {
		t.Errorf("checkLinks =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestGitHubAnchor holds anchor to GitHub's rules for a heading's id.
func TestGitHubAnchor(t *testing.T) {
	for heading, want := range map[string]string{
		"Retry, fallback and recovery":                                   "retry-fallback-and-recovery",
		"The durable default against no store (issue #26)":               "the-durable-default-against-no-store-issue-26",
		"Telemetry (#10)":                                                "telemetry-10",
		"`turnstile run`: the CLI":                                       "turnstile-run-the-cli",
		"Third pass (perf3): the OpenAI request built and sent directly": "third-pass-perf3-the-openai-request-built-and-sent-directly",
		"[Durable turns](docs/durable-turns.md) and *store.dir*":         "durable-turns-and-storedir",
		"Node ≥ 20, max_bytes":                                           "node--20-max_bytes",
	} {
		if got := anchor(heading); got != want {
			t.Errorf("anchor(%q) = %q, want %q", heading, got, want)
		}
	}
}

var (
	fence      = regexp.MustCompile("^\\s*(```|~~~)")
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
	mdLink     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE  = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	lineAnchor = regexp.MustCompile(`^L\d+(-L\d+)?$`)
	inlineLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	notInID    = regexp.MustCompile(`[^\p{L}\p{N}\p{M}_\- ]`)
)

// anchor returns the id GitHub gives a heading: its text without markup,
// lowercase, every character but letters, digits, '_', '-' and spaces
// dropped, spaces turned into '-'.
func anchor(heading string) string {
	s := inlineLink.ReplaceAllString(heading, "$1")
	s = strings.NewReplacer("`", "", "*", "").Replace(s)
	s = notInID.ReplaceAllString(strings.ToLower(s), "")
	return strings.ReplaceAll(s, " ", "-")
}

// mdLines returns a Markdown file's lines with fenced code blocks blanked,
// so that nothing in code is taken for a link or a heading.
func mdLines(text string) []string {
	lines := strings.Split(text, "\n")
	in := false
	for i, l := range lines {
		if fence.MatchString(l) {
			in = !in
			lines[i] = ""
			continue
		}
		if in {
			lines[i] = ""
		}
	}
	return lines
}

// anchors returns the ids of a Markdown file's headings, numbered as GitHub
// numbers repeated ones (-1, -2, ...).
func anchors(text string) map[string]bool {
	ids := map[string]bool{}
	seen := map[string]int{}
	for _, l := range mdLines(text) {
		m := headingRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		id := anchor(m[1])
		if n := seen[id]; n > 0 {
			ids[fmt.Sprintf("%s-%d", id, n)] = true
		} else {
			ids[id] = true
		}
		seen[id]++
	}
	return ids
}

// checkLinks returns the problems of the relative links of the page at
// root/page, each as "page:line: link: what is wrong".
func checkLinks(root, page string) []string {
	b, err := os.ReadFile(filepath.Join(root, page))
	if err != nil {
		return []string{err.Error()}
	}
	cache := map[string]map[string]bool{}
	idsOf := func(file string) (map[string]bool, error) {
		if ids, ok := cache[file]; ok {
			return ids, nil
		}
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			return nil, err
		}
		cache[file] = anchors(string(b))
		return cache[file], nil
	}
	var problems []string
	for i, l := range mdLines(string(b)) {
		l = codeSpan.ReplaceAllString(l, "code")
		for _, m := range mdLink.FindAllStringSubmatch(l, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			bad := func(what string) {
				problems = append(problems, fmt.Sprintf("%s:%d: %s: %s", page, i+1, target, what))
			}
			path, frag, _ := strings.Cut(target, "#")
			file := page
			if path != "" {
				file = filepath.ToSlash(filepath.Join(filepath.Dir(page), path))
				if _, err := os.Stat(filepath.Join(root, file)); err != nil {
					bad("no such file")
					continue
				}
			}
			if frag == "" {
				continue
			}
			if !strings.HasSuffix(file, ".md") {
				if !lineAnchor.MatchString(frag) {
					bad("an anchor in a file that is not Markdown")
				}
				continue
			}
			ids, err := idsOf(file)
			if err != nil {
				bad(err.Error())
				continue
			}
			if !ids[frag] {
				bad("no such heading in " + file)
			}
		}
	}
	return problems
}
