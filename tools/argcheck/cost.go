package argcheck

import (
	"encoding/json"
	"slices"
	"strings"
)

// MaxSteps bounds the work of checking one value (a tool call's arguments,
// a reply) against a schema, in steps: a step is one evaluation of a
// subschema against one part of the value, and the reading it does of
// that part (its properties, 16 bytes of a string or of a number, one
// level of its depth in the locations of errors). The library evaluates
// every branch of anyOf and oneOf and keeps the error of each, so what a
// value costs can grow with the number of paths through the schema to
// each of its parts; a value over the bound is refused before it is
// checked. Checking one in this bound takes milliseconds and holds a few
// megabytes (docs/security.md).
const MaxSteps = 1 << 18

// Bounds of a number in a value that is read as an exact rational (by
// the integer type, the numeric bounds, multipleOf, enum and const): its
// cost grows with its decimal exponent, and with the square of its
// length. A number past them costs more than MaxSteps.
const (
	maxExponent  = 1 << 16
	maxNumberLen = 1 << 12
)

// cost returns the steps of checking v against p's first node, and false
// when they are more than limit: it counts no further then.
func (p *plan) cost(v any, limit uint64) (uint64, bool) {
	c := &counter{p: p, limit: limit, mult: make([]uint64, len(p.nodes)), seen: make([]bool, len(p.nodes))}
	ok := c.value(v, 1, []entry{{node: 0, count: 1}})
	return c.spent, ok && c.spent <= limit
}

// entry is a node reached by count paths.
type entry struct {
	node  int
	count uint64
}

// counter counts the steps of one check.
type counter struct {
	p            *plan
	limit, spent uint64
	// mult and seen are scratch of closure, by node; all zero between
	// calls.
	mult    []uint64
	seen    []bool
	touched []int
}

// charge adds n paths of per steps each, and reports whether the count is
// still within the limit.
func (c *counter) charge(n, per uint64) bool {
	c.spent = satAdd(c.spent, satMul(n, per, c.limit+1), c.limit+1)
	return c.spent <= c.limit
}

// value counts the steps of checking v, at depth in the whole value,
// against the nodes of entries (each reached by its count of paths), and
// reports whether the count is still within the limit.
func (c *counter) value(v any, depth int, entries []entry) bool {
	reached := c.closure(entries)
	// Each evaluation may make an error, which copies the value's
	// location.
	base := 1 + uint64(depth)/16
	for _, e := range reached {
		n := &c.p.nodes[e.node]
		if !c.charge(e.count, base+n.own+c.own(n, v)) {
			return false
		}
	}
	switch v := v.(type) {
	case map[string]any:
		for _, k := range sortedKeys(v) {
			var next []entry
			for _, e := range reached {
				n := &c.p.nodes[e.node]
				j, named := n.properties[k]
				if named {
					next = append(next, entry{j, e.count})
				}
				for _, j := range n.patterns {
					next = append(next, entry{j, e.count})
				}
				if !named && n.additional != none {
					next = append(next, entry{n.additional, e.count})
				}
				if n.unevaluatedProps != none {
					next = append(next, entry{n.unevaluatedProps, e.count})
				}
				if n.propertyNames != none && !c.value(k, 1, []entry{{n.propertyNames, e.count}}) {
					return false
				}
			}
			if len(next) > 0 && !c.value(v[k], depth+1, next) {
				return false
			}
		}
	case []any:
		for i, item := range v {
			var next []entry
			for _, e := range reached {
				n := &c.p.nodes[e.node]
				if i < len(n.prefix) {
					next = append(next, entry{n.prefix[i], e.count})
				} else {
					for _, j := range n.rest {
						next = append(next, entry{j, e.count})
					}
				}
				for _, j := range n.eachItem {
					next = append(next, entry{j, e.count})
				}
			}
			if len(next) > 0 && !c.value(item, depth+1, next) {
				return false
			}
		}
	}
	return true
}

// own returns the steps one evaluation of n spends reading v itself.
func (c *counter) own(n *node, v any) uint64 {
	switch v := v.(type) {
	case map[string]any:
		// Each property is looked up, and matched against each pattern.
		steps := uint64(len(v))
		if len(n.patterns) > 0 {
			names := 0
			for k := range v {
				names += len(k)
			}
			steps += uint64(len(n.patterns)) * (uint64(len(v)) + uint64(names)/16)
		}
		return steps
	case []any:
		steps := uint64(len(v))
		if n.hashesItems {
			steps += uint64(valueNodes(v))
		}
		return steps
	case string:
		if n.scansStrings {
			return uint64(len(v)) / 16
		}
	case json.Number:
		if n.readsNumbers {
			return numberSteps(string(v))
		}
	}
	return 0
}

// numberSteps is what reading the number lit as an exact rational costs:
// its digits and its decimal exponent, which the library expands.
func numberSteps(lit string) uint64 {
	if len(lit) > maxNumberLen {
		return MaxSteps + 1
	}
	exp := uint64(0)
	if i := strings.IndexAny(lit, "eE"); i >= 0 {
		for _, r := range strings.TrimLeft(lit[i+1:], "+-") {
			exp = exp*10 + uint64(r-'0')
			if exp > maxExponent {
				return MaxSteps + 1
			}
		}
	}
	return (uint64(len(lit)) + exp) / 16
}

// closure returns the nodes reached in place from entries, each with the
// number of paths to it, in plan order.
func (c *counter) closure(entries []entry) []entry {
	if len(entries) == 1 && len(c.p.nodes[entries[0].node].inPlace) == 0 {
		return entries
	}
	c.touched = c.touched[:0]
	var stack []int
	for _, e := range entries {
		c.mult[e.node] = satAdd(c.mult[e.node], e.count, c.limit+1)
		if !c.seen[e.node] {
			c.seen[e.node] = true
			stack = append(stack, e.node)
		}
	}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		c.touched = append(c.touched, n)
		for _, j := range c.p.nodes[n].inPlace {
			if !c.seen[j] {
				c.seen[j] = true
				stack = append(stack, j)
			}
		}
	}
	slices.SortFunc(c.touched, func(a, b int) int { return c.p.nodes[a].rank - c.p.nodes[b].rank })
	out := make([]entry, 0, len(c.touched))
	for _, n := range c.touched {
		m := c.mult[n]
		for _, j := range c.p.nodes[n].inPlace {
			c.mult[j] = satAdd(c.mult[j], m, c.limit+1)
		}
		out = append(out, entry{n, m})
	}
	for _, n := range c.touched {
		c.mult[n], c.seen[n] = 0, false
	}
	return out
}
