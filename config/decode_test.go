package config

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"gopkg.in/yaml.v3"
)

type inner struct {
	Name string `yaml:"name"`
	Port uint16 `yaml:"port"`
}

type sample struct {
	inner   `yaml:",inline"`
	Enabled bool              `yaml:"enabled"`
	Count   int8              `yaml:"count"`
	Ratio   float64           `yaml:"ratio"`
	Wait    time.Duration     `yaml:"wait"`
	Limit   *int              `yaml:"limit"`
	Tags    []string          `yaml:"tags"`
	Labels  map[string]string `yaml:"labels"`
	Nested  inner             `yaml:"nested"`
	Ignored string            `yaml:"-"`
	Plain   string
}

// decodeSample decodes src into a sample that starts from start.
func decodeSample(t *testing.T, start sample, src string) (sample, []Problem, map[string]int) {
	t.Helper()
	var root yaml.Node
	if err := yaml.Unmarshal([]byte(src), &root); err != nil {
		t.Fatal(err)
	}
	d := newDecoder()
	d.decode(&root, reflect.ValueOf(&start).Elem(), "")
	return start, d.problems, d.lines
}

func TestDecodeValues(t *testing.T) {
	seven := 7
	start := sample{Enabled: true, Count: 3, Ratio: 0.5, Wait: time.Second, Tags: []string{"x"}}
	got, problems, lines := decodeSample(t, start, `
name: api
port: 0x1F90
enabled: false
count: -128
ratio: 0
wait: 0
limit: 7
tags: [a, b]
labels: {a: "1", b: two}
nested: {name: n}
plain: p
`)
	if len(problems) > 0 {
		t.Fatalf("problems: %v", problems)
	}
	want := sample{
		inner: inner{Name: "api", Port: 8080}, Enabled: false, Count: -128, Ratio: 0, Wait: 0, Limit: &seven,
		Tags: []string{"a", "b"}, Labels: map[string]string{"a": "1", "b": "two"}, Nested: inner{Name: "n"}, Plain: "p",
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(sample{})); diff != "" {
		t.Errorf("decoded (-want +got):\n%s", diff)
	}
	if lines["name"] != 2 || lines["tags[1]"] != 9 || lines["labels.b"] != 10 || lines["nested.name"] != 11 {
		t.Errorf("lines = %v", lines)
	}
}

// TestDecodeKeepsDefaults: keys left out, and null blocks, keep the value
// decoding started from.
func TestDecodeKeepsDefaults(t *testing.T) {
	start := sample{Enabled: true, Count: 3, Wait: time.Second, Nested: inner{Port: 1}}
	got, problems, _ := decodeSample(t, start, "nested:\nlabels:\n")
	if len(problems) > 0 {
		t.Fatalf("problems: %v", problems)
	}
	if diff := cmp.Diff(start, got, cmp.AllowUnexported(sample{})); diff != "" {
		t.Errorf("decoded (-want +got):\n%s", diff)
	}
}

func TestDecodeProblems(t *testing.T) {
	tests := []struct {
		name, src string
		want      []Problem
	}{
		{"bool", "enabled: yes", []Problem{{1, "enabled", "expected true or false"}}},
		{"bool from number", "enabled: 1", []Problem{{1, "enabled", "expected true or false, got 1"}}},
		{"int range", "count: 300", []Problem{{1, "count", "expected a whole number from -128 to 127, got 300"}}},
		{"int from float", "count: 2.5", []Problem{{1, "count", "expected a whole number, got 2.5"}}},
		{"uint negative", "port: -1", []Problem{{1, "port", "expected a whole number from 0 to 65535, got -1"}}},
		{"nan", "ratio: .nan", []Problem{{1, "ratio", "expected a finite number, got .nan"}}},
		{"inf", "ratio: -.inf", []Problem{{1, "ratio", "expected a finite number, got -.inf"}}},
		{"float from string", "ratio: half", []Problem{{1, "ratio", "expected a number"}}},
		{"duration unit", "wait: 1.5", []Problem{{1, "wait", "expected a duration such as 500ms or 2s, got 1.5 without a unit (write 1.5s for seconds)"}}},
		{"duration null", "wait:", []Problem{{1, "wait", "expected a duration such as 500ms or 2s, got nothing"}}},
		{"list", "tags: a", []Problem{{1, "tags", "expected a list"}}},
		{"mapping", "labels: [a]", []Problem{{1, "labels", "expected a block of key: value pairs, got a list"}}},
		{"string", "name: {a: b}", []Problem{{1, "name", "expected a string, got a block of key: value pairs"}}},
		{"nested key", "port: 1\nnested: {name: a, prot: 2}", []Problem{{2, "nested.prot", "unknown key; did you mean port?"}}},
		{"ignored", "ignored: x", []Problem{{1, "ignored", "unknown key (known keys: name, port, enabled, count, ratio, wait, limit, tags, labels, nested, plain)"}}},
		{"twice", "name: a\nname: b", []Problem{{2, "name", "appears twice (first on line 1)"}}},
		{"key not scalar", "? [a]\n: b", []Problem{{1, "", "a key must be a plain name, not a list"}}},
		{"all at once", "count: x\nratio: y\nwait: z", []Problem{
			{1, "count", "expected a whole number"}, {2, "ratio", "expected a number"}, {3, "wait", "expected a duration such as 500ms or 2s"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, got, _ := decodeSample(t, sample{}, tt.src)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeAliasesAndMerge(t *testing.T) {
	got, problems, _ := decodeSample(t, sample{}, `
labels: &l {a: "1"}
nested: &n {name: base, port: 1}
tags: [*n]
`)
	if len(problems) != 1 || problems[0].Path != "tags[0]" {
		t.Errorf("problems = %v, want one at tags[0]", problems)
	}
	if got.Nested.Name != "base" {
		t.Errorf("nested = %+v", got.Nested)
	}

	got, problems, _ = decodeSample(t, sample{}, `
nested: &n {name: base, port: 1}
<<: *n
name: own
`)
	if len(problems) > 0 {
		t.Fatalf("problems: %v", problems)
	}
	if got.Name != "own" || got.Port != 1 {
		t.Errorf("merged = %+v, want name own, port 1", got.inner)
	}
}

// tree nests without end, as an alias bomb needs.
type tree struct {
	Kids []tree `yaml:"kids"`
}

func TestDecodeAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("a0: &a0 {kids: []}\n")
	for i := 1; i <= 9; i++ {
		fmt.Fprintf(&b, "a%d: &a%d {kids: [%s]}\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*a%d, ", i-1), 10), ", "))
	}
	var root yaml.Node
	if err := yaml.Unmarshal([]byte(b.String()), &root); err != nil {
		t.Fatal(err)
	}
	d := newDecoder()
	var got map[string]tree
	d.decode(&root, reflect.ValueOf(&got).Elem(), "")
	if len(d.problems) != 1 || d.problems[0].Message != "too many aliases" {
		t.Errorf("problems = %v, want one: too many aliases", d.problems)
	}
}
