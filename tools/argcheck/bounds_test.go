package argcheck_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/tools/argcheck"
)

// nested returns open n times around inner, each closed by close.
func nested(open, inner, close string, n int) string {
	return strings.Repeat(open, n) + inner + strings.Repeat(close, n)
}

// anyOfChain is the red team's schema of issue 38: n levels of anyOf,
// each two references to the next level, and a string at the bottom. A
// value that is no string is checked against each of the 2^n paths.
func anyOfChain(n int) string { return `{"$ref":"#/$defs/level0",` + chainDefs(n) + `}` }

// chainDefs returns the "$defs" of anyOfChain(n).
func chainDefs(n int) string {
	var b strings.Builder
	b.WriteString(`"$defs":{`)
	for i := range n {
		fmt.Fprintf(&b, `"level%d":{"anyOf":[{"$ref":"#/$defs/level%d"},{"$ref":"#/$defs/level%d"}]},`, i, i+1, i+1)
	}
	fmt.Fprintf(&b, `"level%d":{"type":"string"}}`, n)
	return b.String()
}

// properties returns an object schema of n properties, each schema.
func properties(n int, schema string) string {
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"p%d":%s`, i, schema)
	}
	b.WriteString(`}}`)
	return b.String()
}

// TestSchemaBounds: a schema within every bound compiles; one past a bound
// is refused with a *LimitError naming it, before the library compiles it.
func TestSchemaBounds(t *testing.T) {
	refs := func(n int) string {
		return `{"$defs":{"d":{"type":"string"}},` + properties(n, `{"$ref":"#/$defs/d"}`)[1:]
	}
	tests := []struct {
		name   string
		schema string
		max    int // the bound passed; 0 when the schema compiles
	}{
		{name: "items nested to the depth bound", schema: nested(`{"items":`, `{}`, `}`, argcheck.MaxDepth-1)},
		{name: "items nested past the depth bound", schema: nested(`{"items":`, `{}`, `}`, argcheck.MaxDepth), max: argcheck.MaxDepth},
		{name: "the red team's items, 3,300 deep", schema: nested(`{"items":`, `{}`, `}`, 3300), max: argcheck.MaxDepth},
		{name: "the red team's properties, 1,500 deep", schema: nested(`{"type":"object","properties":{"a":`, `{}`, `}}`, 1500), max: argcheck.MaxDepth},
		{name: "a boolean at the depth bound does not nest", schema: nested(`{"items":`, `true`, `}`, argcheck.MaxDepth-1)},
		// The object, its properties and one boolean per property.
		{name: "nodes at the bound", schema: properties(argcheck.MaxNodes-2, `true`)},
		{name: "nodes past the bound", schema: properties(argcheck.MaxNodes-1, `true`), max: argcheck.MaxNodes},
		{name: "references at the bound", schema: refs(argcheck.MaxRefs)},
		{name: "references past the bound", schema: refs(argcheck.MaxRefs + 1), max: argcheck.MaxRefs},
		// Properties named like keywords hold schemas, not references.
		{name: "properties named id and $ref", schema: properties(argcheck.MaxRefs/2+1, `{"properties":{"id":{},"$ref":{}}}`)},
		// 2^(n+2)-3 subschemas for a value: 4,093 at 10 levels.
		{name: "anyOf chain within the branch bound", schema: anyOfChain(10)},
		{name: "anyOf chain past the branch bound", schema: anyOfChain(11), max: argcheck.MaxBranches},
		{name: "the red team's anyOf chain", schema: anyOfChain(21), max: argcheck.MaxBranches},
		{name: "allOf of its own references", schema: `{"$defs":{"x":{"allOf":[{"$ref":"#/$defs/y"},{"$ref":"#/$defs/y"},{"$ref":"#/$defs/y"},{"$ref":"#/$defs/y"}]},` +
			`"y":{"oneOf":[{"$ref":"#/$defs/z"},{"$ref":"#/$defs/z"},{"$ref":"#/$defs/z"},{"$ref":"#/$defs/z"}]},` +
			`"z":{"not":{"anyOf":[{"$ref":"#/$defs/w"},{"$ref":"#/$defs/w"},{"$ref":"#/$defs/w"},{"$ref":"#/$defs/w"}]}},` +
			`"w":{"if":{"$ref":"#/$defs/v"},"then":{"$ref":"#/$defs/v"},"else":{"$ref":"#/$defs/v"},"dependentSchemas":{"a":{"$ref":"#/$defs/v"}}},` +
			`"v":{"allOf":[{"$ref":"#/$defs/u"},{"$ref":"#/$defs/u"},{"$ref":"#/$defs/u"},{"$ref":"#/$defs/u"}]},"u":{"allOf":[{"type":"string"},{"type":"string"}]}},"$ref":"#/$defs/x"}`, max: argcheck.MaxBranches},
		{name: "recursion through a property", schema: `{"type":"object","properties":{"name":{"type":"string"},"children":{"type":"array","items":{"$ref":"#"}}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := argcheck.OutputSchemas{}.Compile([]byte(tt.schema))
			var limit *argcheck.LimitError
			switch {
			case tt.max == 0 && err != nil:
				t.Fatalf("Compile: %v", err)
			case tt.max == 0:
			case !errors.As(err, &limit) || limit.Max != tt.max:
				t.Fatalf("Compile = %v, want a LimitError of %d", err, tt.max)
			case !strings.HasPrefix(err.Error(), "output schema too complex: over the bound of "+fmt.Sprint(tt.max)+" "):
				t.Errorf("Compile = %q", err)
			}
		})
	}
}

// TestSchemasRefused: what no bound can price is refused as invalid.
func TestSchemasRefused(t *testing.T) {
	tests := []struct{ name, schema, want string }{
		{
			name:   "a reference cycle in place",
			schema: `{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"anyOf":[{"type":"string"},{"$ref":"#/$defs/a"}]}},"$ref":"#/$defs/a"}`,
			want:   "invalid output schema: a subschema refers to itself without descending into a property or an item",
		},
		{
			name:   "a dynamic reference",
			schema: `{"$dynamicAnchor":"node","type":"object","properties":{"next":{"$dynamicRef":"#node"}}}`,
			want:   "invalid output schema: $dynamicRef and $recursiveRef are not supported",
		},
		{
			name:   "a recursive reference",
			schema: `{"$schema":"https://json-schema.org/draft/2019-09/schema","$recursiveAnchor":true,"type":"object","properties":{"next":{"$recursiveRef":"#"}}}`,
			want:   "invalid output schema: $dynamicRef and $recursiveRef are not supported",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := argcheck.OutputSchemas{}.Compile([]byte(tt.schema))
			var limit *argcheck.LimitError
			if err == nil || errors.As(err, &limit) || !strings.HasPrefix(err.Error(), tt.want) {
				t.Fatalf("Compile = %v, want %q", err, tt.want)
			}
		})
	}
}

// TestCheckSchemas: the tool schemas of one request are checked each, and
// bounded together.
func TestCheckSchemas(t *testing.T) {
	t.Parallel()
	big := properties(argcheck.MaxRequestNodes/2-2, `true`) // half the bound
	small := `{"type":"object"}`
	bad := `{"type":"nonsense"}`
	errs := argcheck.CheckSchemas(t.Context(), [][]byte{[]byte(small), []byte(bad), []byte(big), []byte(big), []byte(small)})
	if len(errs) != 5 {
		t.Fatalf("%d errors", len(errs))
	}
	if errs[0] != nil || errs[2] != nil {
		t.Errorf("errors %v, want the first schema and the first large one taken", errs)
	}
	if errs[1] == nil || !strings.HasPrefix(errs[1].Error(), "invalid input schema") {
		t.Errorf("invalid schema: %v", errs[1])
	}
	// 1 + 1 + 2048 + 2048 nodes: the second large one passes the bound, and
	// so does every schema after it.
	for _, err := range errs[3:] {
		var limit *argcheck.LimitError
		if !errors.As(err, &limit) || limit.Max != argcheck.MaxRequestNodes {
			t.Errorf("error %v, want a LimitError of %d", err, argcheck.MaxRequestNodes)
		}
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for i, err := range argcheck.CheckSchemas(ctx, [][]byte{[]byte(small), []byte(big)}) {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("schema %d after the request ended: %v, want context.Canceled", i, err)
		}
	}
}

// TestCheckTooCostly: a value whose check would cost more than MaxSteps is
// refused before it is checked, for replies and tool arguments alike.
func TestCheckTooCostly(t *testing.T) {
	// Each object is checked against both branches, each of which checks
	// its property a against the whole schema again.
	const doubling = `{"anyOf":[{"properties":{"a":{"$ref":"#"}}},{"properties":{"a":{"$ref":"#"}}}]}`
	deep := func(n int) string { return nested(`{"a":`, `7`, `}`, n) }
	items := `{"type":"array","items":{"$ref":"#/$defs/level0"},` + chainDefs(10) + `}`
	tests := []struct {
		name, schema, reply string
		costly              bool
	}{
		{name: "doubling, shallow", schema: doubling, reply: deep(10)},
		{name: "doubling, deep", schema: doubling, reply: deep(40), costly: true},
		{name: "the chain against 7", schema: anyOfChain(10), reply: `7`},
		{name: "the chain against many 7s", schema: items, reply: "[" + strings.Repeat("7,", 100) + "7]", costly: true},
		{name: "an exponent within the bound", schema: `{"type":"integer"}`, reply: `1e300`},
		{name: "an exponent past the bound", schema: `{"type":"integer"}`, reply: `1e70000`, costly: true},
		{name: "an exponent not read", schema: `{"type":"number"}`, reply: `1e70000`},
		{name: "a long number", schema: `{"type":"integer"}`, reply: strings.Repeat("9", 5000), costly: true},
		{name: "a deep array", schema: `{"type":"array","items":{"$ref":"#"},"minItems":1}`, reply: nested(`[`, ``, `]`, 9000), costly: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			check, err := argcheck.OutputSchemas{}.Compile([]byte(tt.schema))
			if err != nil {
				t.Fatal(err)
			}
			issues := check(tt.reply)
			costly := len(issues) == 1 && strings.HasPrefix(issues[0], "the reply is too costly to check against the output schema (over the bound of ")
			if costly != tt.costly {
				t.Errorf("check = %q, want too costly %v", issues, tt.costly)
			}
		})
	}

	t.Run("tool arguments", func(t *testing.T) {
		t.Parallel()
		inner := &countingTool{schema: `{"type":"object","properties":{"a":` + doubling + `}}`}
		tool, err := argcheck.Wrap(inner)
		if err != nil {
			t.Fatal(err)
		}
		out, err := tool.Call(t.Context(), llm.ToolCall{Name: "lookup", Arguments: `{"a":` + deep(40) + `}`}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !out.IsError || inner.calls.Load() != 0 ||
			!strings.HasPrefix(out.Content, `Invalid arguments for tool "lookup": they are too costly to check against its input schema (over the bound of `) {
			t.Errorf("Call = %+v (tool ran %d times)", out, inner.calls.Load())
		}
	})
}

// redTeam returns the schemas of issue 38 that took the server down, each
// as the tool schemas of one request: a chain of 21 anyOfs (1,680 bytes)
// as output schema, items 3,300 deep, properties 1,500 deep, and four tools
// 2,000 deep.
func redTeam() map[string][][]byte {
	chain := anyOfChain(21)
	// Padded to the red team's 1,680 bytes.
	chain = chain[:len(chain)-1] + `,"title":"` + strings.Repeat("x", 1680-len(chain)-len(`,"title":""`)) + `"}`
	deep := []byte(`{"type":"object","properties":{"a":` + nested(`{"type":"array","items":`, `{}`, `}`, 2000) + `}}`)
	return map[string][][]byte{
		"anyOf chain 21":       {[]byte(chain)},
		"items 3300 deep":      {[]byte(nested(`{"items":`, `{}`, `}`, 3300))},
		"properties 1500 deep": {[]byte(nested(`{"type":"object","properties":{"a":`, `{}`, `}}`, 1500))},
		"4 tools 2000 deep":    {deep, deep, deep, deep},
	}
}

// TestRedTeamSchemasHoldLittle: the schemas that took 2.9 to 4.1 GB and up
// to 54 s of CPU to compile are refused having allocated a few megabytes
// (measured alone: the test does not run in parallel).
func TestRedTeamSchemasHoldLittle(t *testing.T) {
	const bound = 8 << 20
	for name, schemas := range redTeam() {
		if name == "anyOf chain 21" && len(schemas[0]) != 1680 {
			t.Fatalf("the chain is %d bytes", len(schemas[0]))
		}
		var errs []error
		alloc := allocated(func() { errs = argcheck.CheckSchemas(t.Context(), schemas) })
		for _, err := range errs {
			var limit *argcheck.LimitError
			if !errors.As(err, &limit) {
				t.Errorf("%s: %v, want a LimitError", name, err)
			}
		}
		t.Logf("%s: %d bytes allocated", name, alloc)
		if alloc > bound {
			t.Errorf("%s: %d bytes allocated, want at most %d", name, alloc, bound)
		}
	}

	// A reply at the bound of steps: an array of 32 values, each checked
	// against the 4,094 paths of a chain of 10 anyOfs, and failing on
	// each path.
	check, err := argcheck.OutputSchemas{}.Compile([]byte(`{"type":"array","items":{"$ref":"#/$defs/level0"},` + chainDefs(10) + `}`))
	if err != nil {
		t.Fatal(err)
	}
	reply := "[" + strings.Repeat("7,", 31) + "7]"
	var issues []string
	alloc := allocated(func() { issues = check(reply) })
	if len(issues) == 0 || strings.Contains(issues[0], "too costly") {
		t.Fatalf("issues %q, want the reply checked", issues)
	}
	t.Logf("a reply at the bound of steps: %d bytes allocated", alloc)
	if alloc > 96<<20 {
		t.Errorf("checking the reply allocated %d bytes, want at most %d", alloc, 96<<20)
	}
	if issues = check("[" + strings.Repeat("7,", 32) + "7]"); len(issues) != 1 || !strings.Contains(issues[0], "too costly") {
		t.Errorf("one value more: %q, want it too costly", issues)
	}
}

// allocated returns the bytes f allocates on the heap.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
