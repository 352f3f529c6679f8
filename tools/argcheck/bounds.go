package argcheck

import (
	"fmt"
)

// Bounds of a schema, checked on its JSON before the JSON Schema library
// sees it. Compiling validates a schema against its draft's metaschema, at
// a cost that grows with the cube of the schema's nesting and the square
// of its subschemas, so a schema past these bounds is refused before any
// of that work is done. They are far above what providers take for
// structured output (OpenAI: 10 levels of nested objects and 5,000
// properties in all; Anthropic: no recursive schemas), and a schema at all
// of them at once compiles in tens of milliseconds (docs/security.md).
const (
	// MaxDepth bounds how deep a schema's JSON nests: its objects and
	// arrays, the schema itself being the first level.
	MaxDepth = 64
	// MaxNodes bounds the JSON objects, arrays and booleans of a schema:
	// each subschema is one of them.
	MaxNodes = 4096
	// MaxRequestNodes bounds the JSON objects, arrays and booleans of the
	// input schemas of one request's tools together ([CheckSchemas]): a
	// hundred tools of ten properties each hold about a thousand.
	MaxRequestNodes = 4096
	// MaxRefs bounds a schema's references and identifiers ($ref,
	// $dynamicRef, $recursiveRef, $id, id, $anchor, $dynamicAnchor),
	// which the library resolves one against the others.
	MaxRefs = 1024
	// MaxBranches bounds, for each subschema, how many subschemas one
	// value is checked against without descending into a property or
	// an item: through $ref, $dynamicRef, $recursiveRef, allOf, anyOf,
	// oneOf, not, if, then, else, dependentSchemas and dependencies,
	// each path counted once. A chain of anyOfs whose branches refer to
	// the next level doubles it at each level.
	MaxBranches = 4096
)

// A LimitError reports a schema, or a value checked against one, past one
// of this package's bounds: it is refused before the work the bound
// guards against is done.
type LimitError struct {
	// What says what was counted, as in "levels of nesting".
	What string
	// Max is the bound. Counting stops past it: all that is known is
	// that there are more than Max.
	Max int
}

// Error says which bound was passed, never quoting the schema.
func (e *LimitError) Error() string {
	return fmt.Sprintf("over the bound of %d %s", e.Max, e.What)
}

// refKeywords are the keywords whose string value is a reference or an
// identifier, in any draft.
var refKeywords = map[string]bool{
	"$ref": true, "$dynamicRef": true, "$recursiveRef": true,
	"$id": true, "id": true, "$anchor": true, "$dynamicAnchor": true,
}

// measure checks doc, a schema's JSON as decoded, against MaxDepth,
// MaxNodes and MaxRefs, and returns its nodes. It stops at the first bound
// passed, so its own cost is bounded by them too.
func measure(doc any) (int, error) {
	m := measurer{}
	err := m.walk(doc, 1)
	return m.nodes, err
}

// measurer counts a schema's nodes and references.
type measurer struct {
	nodes, refs int
}

func (m *measurer) walk(v any, depth int) error {
	switch v := v.(type) {
	case map[string]any:
		if err := m.node(depth); err != nil {
			return err
		}
		for k, e := range v {
			// A property named "id" has a schema (an object) as its value;
			// only a string is an identifier or a reference.
			if _, ok := e.(string); ok && refKeywords[k] {
				if m.refs++; m.refs > MaxRefs {
					return &LimitError{What: "references and identifiers ($ref, $dynamicRef, $recursiveRef, $id, $anchor, $dynamicAnchor)", Max: MaxRefs}
				}
			}
			if err := m.walk(e, depth+1); err != nil {
				return err
			}
		}
	case []any:
		if err := m.node(depth); err != nil {
			return err
		}
		for _, e := range v {
			if err := m.walk(e, depth+1); err != nil {
				return err
			}
		}
	case bool:
		return m.node(0)
	}
	return nil
}

// node counts one object or array at depth, or a boolean (depth 0: it
// does not nest).
func (m *measurer) node(depth int) error {
	if depth > MaxDepth {
		return &LimitError{What: "levels of nesting (JSON objects and arrays)", Max: MaxDepth}
	}
	if m.nodes++; m.nodes > MaxNodes {
		return &LimitError{What: "JSON objects, arrays and booleans (each subschema is one)", Max: MaxNodes}
	}
	return nil
}
