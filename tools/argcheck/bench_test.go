package argcheck_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/tools/argcheck"
)

// BenchmarkRedTeam: what the schemas of issue 38 cost now, refused.
func BenchmarkRedTeam(b *testing.B) {
	for name, schemas := range redTeam() {
		b.Run(strings.ReplaceAll(name, " ", "_"), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				argcheck.CheckSchemas(b.Context(), schemas)
			}
		})
	}
}

// BenchmarkCompileAtBounds: one schema at the bound of nodes (MaxNodes,
// also what the tool schemas of one request hold at most together), in
// the shapes that cost the library most per node: many subschemas, and
// subschemas nested to MaxDepth.
func BenchmarkCompileAtBounds(b *testing.B) {
	chain := nested(`{"items":`, `{}`, `}`, argcheck.MaxDepth-3)
	shapes := map[string]string{
		"booleans":      properties(argcheck.MaxNodes-2, `true`),
		"typed":         properties(argcheck.MaxNodes-2, `{"type":"string"}`),
		"nested_items":  properties((argcheck.MaxNodes-2)/(argcheck.MaxDepth-2), chain),
		"anyOf_of_refs": `{"$defs":{"d":{"type":"string"}},` + properties(argcheck.MaxRefs-2, `{"anyOf":[{"$ref":"#/$defs/d"},{"type":"null"}]}`)[1:],
	}
	for name, s := range shapes {
		b.Run(name, func(b *testing.B) {
			schemas := [][]byte{[]byte(s)}
			for i, err := range argcheck.CheckSchemas(b.Context(), schemas) {
				if err != nil {
					b.Fatalf("schema %d: %v", i, err)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				argcheck.CheckSchemas(b.Context(), schemas)
			}
		})
	}
}

// BenchmarkCheckAtBudget: replies within MaxSteps, the worst (every path
// of a chain of anyOfs failing) and a valid one as large as the bound
// takes.
func BenchmarkCheckAtBudget(b *testing.B) {
	var rows strings.Builder
	rows.WriteString("[")
	for i := range 16000 {
		if i > 0 {
			rows.WriteString(",")
		}
		fmt.Fprintf(&rows, `{"name":"row %d","count":%d}`, i, i)
	}
	rows.WriteString("]")
	cases := []struct{ name, schema, reply string }{
		{"failing_chain", `{"type":"array","items":{"$ref":"#/$defs/level0"},` + chainDefs(10) + `}`, "[" + strings.Repeat("7,", 31) + "7]"},
		{"valid_rows", `{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"},"count":{"anyOf":[{"type":"integer"},{"type":"null"}]}},"required":["name","count"]}}`, rows.String()},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			check, err := argcheck.OutputSchemas{}.Compile([]byte(c.schema))
			if err != nil {
				b.Fatal(err)
			}
			if issues := check(c.reply); len(issues) > 0 && strings.Contains(issues[0], "too costly") {
				b.Fatalf("%s: %q", c.name, issues[0])
			}
			b.SetBytes(int64(len(c.reply)))
			b.ReportAllocs()
			for b.Loop() {
				check(c.reply)
			}
		})
	}
}
