package argcheck

import (
	"fmt"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// TestCostCounts: what a check is counted, in steps: one per evaluation of
// a subschema against a part of the value, path by path, and what the
// evaluation reads of that part.
func TestCostCounts(t *testing.T) {
	defs := func(n int) string {
		var b strings.Builder
		b.WriteString(`"$defs":{`)
		for i := range n {
			fmt.Fprintf(&b, `"l%d":{"anyOf":[{"$ref":"#/$defs/l%d"},{"$ref":"#/$defs/l%d"}]},`, i, i+1, i+1)
		}
		fmt.Fprintf(&b, `"l%d":{"type":"string"}}`, n)
		return b.String()
	}
	chain := func(n int) string { return `{"$ref":"#/$defs/l0",` + defs(n) + `}` }
	// depth is the steps of an array nested n deep against
	// {"items":{"$ref":"#"}}: at each level, 1 for the evaluation, 1 per
	// 16 levels of depth, 1 of the schema's own and 1 for the item read,
	// at the first level by the root, at the others by the items schema
	// and the root it refers to; the last level reads no item.
	depth := func(n int) uint64 {
		steps := uint64(3)
		for d := 2; d <= n; d++ {
			steps += 2 * (3 + uint64(d)/16)
		}
		return steps - 2
	}
	tests := []struct {
		name, schema, value string
		want                uint64
	}{
		// One evaluation: 1, and 1 for being one level deep.
		{name: "a string", schema: `{"type":"string"}`, value: `"x"`, want: 2},
		// The root reads 2 properties (4); a is checked against {} (2);
		// b against nothing.
		{name: "properties", schema: `{"properties":{"a":{}}}`, value: `{"a":1,"b":2}`, want: 6},
		// The root and the 2^(n+2)-3 paths of a chain of n levels, each
		// an evaluation of 2.
		{name: "a chain of 3", schema: chain(3), value: `7`, want: 2 * (1<<5 - 2)},
		{name: "a chain of 10", schema: chain(10), value: `7`, want: 2 * (1<<12 - 2)},
		// The array (2, and 3 items read) and each item against the
		// items schema and the chain it refers to.
		{name: "items of a chain", schema: `{"items":{"$ref":"#/$defs/l0"},` + defs(3) + `}`, value: `[7,7,7]`, want: 5 + 3*2*(1<<5-2)},
		// The required list and the enum's values (the array, the object
		// and its two values, and 3) are read by each check.
		{name: "required and enum", schema: `{"required":["a","b"],"enum":[{"a":1,"b":2},3]}`, value: `{"a":1,"b":2}`, want: 1 + 1 + 2 + 5 + 2},
		// 64 bytes of a string scanned by a pattern: 4 steps.
		{name: "a pattern", schema: `{"pattern":"^a"}`, value: `"` + strings.Repeat("a", 64) + `"`, want: 2 + 4},
		// A number read as a rational: its length and exponent, by 16.
		{name: "an exponent", schema: `{"type":"integer"}`, value: `1e318`, want: 2 + 20},
		{name: "a number not read", schema: `{"type":"number"}`, value: `1e318`, want: 2},
		{name: "depth", schema: `{"items":{"$ref":"#"}}`, value: strings.Repeat("[", 40) + strings.Repeat("]", 40), want: depth(40)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := compile([]byte(tt.schema), outputSchema)
			if err != nil {
				t.Fatal(err)
			}
			v, err := jsonschema.UnmarshalJSON(strings.NewReader(tt.value))
			if err != nil {
				t.Fatal(err)
			}
			got, ok := c.plan.cost(v, MaxSteps)
			if !ok || got != tt.want {
				t.Errorf("cost = %d, %v; want %d", got, ok, tt.want)
			}
			if _, ok := c.plan.cost(v, tt.want-1); ok {
				t.Errorf("cost within %d, want it over", tt.want-1)
			}
		})
	}
}
