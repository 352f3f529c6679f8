package argcheck

import (
	"errors"
	"fmt"
	"slices"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// errDynamicRef refuses the references resolved while a value is checked:
// where they lead depends on the path taken, so their cost cannot be
// bounded before the check.
var errDynamicRef = errors.New("$dynamicRef and $recursiveRef are not supported (where they lead is known only while a value is checked)")

// plan is a compiled schema as this package bounds the cost of checking a
// value against it: its subschemas, each with the subschemas it checks the
// same value against (in place) and those it checks the value's
// properties and items against. The JSON Schema library evaluates every
// branch of anyOf and oneOf and keeps the error of each, and evaluates a
// subschema as often as paths lead to it, so what one value costs is the
// number of paths to each subschema, which a plan counts without taking
// them.
type plan struct {
	nodes []node
	// order lists the nodes so that each comes after every node that
	// checks its value against it in place.
	order []int
}

// node is one subschema of a plan.
type node struct {
	// inPlace lists the subschemas the same value is checked against, once
	// per path ({"anyOf":[X,X]} lists X twice).
	inPlace []int
	// rank is the node's position in plan.order.
	rank int
	// properties, patterns, additional and unevaluatedProps are checked
	// against an object's properties; propertyNames against their names.
	// Every pattern is taken to match, and additional and
	// unevaluatedProps to apply to each property not in properties.
	properties       map[string]int
	patterns         []int
	additional       int
	unevaluatedProps int
	propertyNames    int
	// prefix is checked against an array's first items, one each; rest
	// against each item after them; eachItem (contains,
	// unevaluatedItems) against every item.
	prefix   []int
	rest     []int
	eachItem []int
	// own is what a check against the node costs besides the value's
	// size: its required, enum and dependent keywords.
	own uint64
	// scansStrings, readsNumbers and hashesItems say whether a check
	// reads a string through (pattern, format, lengths), parses a number
	// (integer type, bounds, multipleOf, enum, const) or hashes an
	// array's items (uniqueItems).
	scansStrings, readsNumbers, hashesItems bool
}

// none marks an absent subschema.
const none = -1

// newPlan returns the plan of the schema compiled as root. It refuses an
// in-place reference cycle (a value checked against itself for ever, which
// the library reports on every value), dynamic references, and a
// subschema past MaxBranches.
func newPlan(root *jsonschema.Schema) (*plan, error) {
	p := &plan{}
	index := map[*jsonschema.Schema]int{}
	var queue []*jsonschema.Schema
	add := func(s *jsonschema.Schema) int {
		if s == nil {
			return none
		}
		if i, ok := index[s]; ok {
			return i
		}
		i := len(p.nodes)
		index[s] = i
		p.nodes = append(p.nodes, node{additional: none, unevaluatedProps: none, propertyNames: none})
		queue = append(queue, s)
		return i
	}
	add(root)
	for i := 0; i < len(queue); i++ {
		s := queue[i]
		if s.DynamicRef != nil || s.RecursiveRef != nil {
			return nil, errDynamicRef
		}
		var n node
		n.additional, n.unevaluatedProps, n.propertyNames = none, none, none
		inPlace := []*jsonschema.Schema{s.Ref, s.Not, s.If, s.Then, s.Else}
		inPlace = append(inPlace, s.AllOf...)
		inPlace = append(inPlace, s.AnyOf...)
		inPlace = append(inPlace, s.OneOf...)
		for _, d := range sortedKeys(s.DependentSchemas) {
			inPlace = append(inPlace, s.DependentSchemas[d])
		}
		for _, d := range sortedKeys(s.Dependencies) {
			if ds, ok := s.Dependencies[d].(*jsonschema.Schema); ok {
				inPlace = append(inPlace, ds)
			}
		}
		for _, c := range inPlace {
			if j := add(c); j != none {
				n.inPlace = append(n.inPlace, j)
			}
		}
		if len(s.Properties) > 0 {
			n.properties = make(map[string]int, len(s.Properties))
			for name, c := range s.Properties {
				n.properties[name] = add(c)
			}
		}
		for _, c := range s.PatternProperties {
			n.patterns = append(n.patterns, add(c))
		}
		if c, ok := s.AdditionalProperties.(*jsonschema.Schema); ok {
			n.additional = add(c)
		}
		n.unevaluatedProps = add(s.UnevaluatedProperties)
		n.propertyNames = add(s.PropertyNames)
		n.prefix, n.rest = itemSchemas(s, add)
		for _, c := range []*jsonschema.Schema{s.Contains, s.UnevaluatedItems, s.ContentSchema} {
			if j := add(c); j != none {
				n.eachItem = append(n.eachItem, j)
			}
		}
		n.own = 1 + uint64(len(s.Required)+len(s.Dependencies)+len(s.DependentSchemas))
		for _, r := range s.DependentRequired {
			n.own += 1 + uint64(len(r))
		}
		if s.Enum != nil {
			n.own += uint64(valueNodes(s.Enum.Values))
		}
		if s.Const != nil {
			n.own += uint64(valueNodes(*s.Const))
		}
		n.scansStrings = s.Pattern != nil || s.Format != nil || s.MinLength != nil || s.MaxLength != nil || s.ContentEncoding != nil
		n.readsNumbers = s.Types != nil && slices.Contains(s.Types.ToStrings(), "integer") ||
			s.Minimum != nil || s.Maximum != nil || s.ExclusiveMinimum != nil || s.ExclusiveMaximum != nil ||
			s.MultipleOf != nil || s.Enum != nil || s.Const != nil
		n.hashesItems = s.UniqueItems
		p.nodes[i] = n
	}
	if err := p.sort(); err != nil {
		return nil, err
	}
	if err := p.checkBranches(); err != nil {
		return nil, err
	}
	return p, nil
}

// itemSchemas returns the subschemas of s checked against an array's
// first items, one each, and against each item after them, under the
// rules of s's draft.
func itemSchemas(s *jsonschema.Schema, add func(*jsonschema.Schema) int) (prefix, rest []int) {
	addAll := func(ss []*jsonschema.Schema) []int {
		out := make([]int, len(ss))
		for i, c := range ss {
			out[i] = add(c)
		}
		return out
	}
	if s.DraftVersion >= 2020 {
		prefix = addAll(s.PrefixItems)
		if j := add(s.Items2020); j != none {
			rest = []int{j}
		}
		return prefix, rest
	}
	switch items := s.Items.(type) {
	case *jsonschema.Schema:
		// Every item; additionalItems applies to none.
		return nil, []int{add(items)}
	case []*jsonschema.Schema:
		prefix = addAll(items)
	}
	if c, ok := s.AdditionalItems.(*jsonschema.Schema); ok {
		rest = []int{add(c)}
	}
	return prefix, rest
}

// sort orders the nodes so that each comes after those that reach it in
// place, and fails on an in-place cycle.
func (p *plan) sort() error {
	const (
		unseen = iota
		open
		done
	)
	state := make([]byte, len(p.nodes))
	post := make([]int, 0, len(p.nodes))
	// An explicit stack: the in-place graph may be as deep as the
	// schema has subschemas.
	type frame struct{ n, next int }
	for start := range p.nodes {
		if state[start] != unseen {
			continue
		}
		stack := []frame{{n: start}}
		state[start] = open
		for len(stack) > 0 {
			f := &stack[len(stack)-1]
			if f.next < len(p.nodes[f.n].inPlace) {
				c := p.nodes[f.n].inPlace[f.next]
				f.next++
				switch state[c] {
				case open:
					return errors.New("a subschema refers to itself without descending into a property or an item (a reference cycle that fails on every value)")
				case unseen:
					state[c] = open
					stack = append(stack, frame{n: c})
				}
				continue
			}
			state[f.n] = done
			post = append(post, f.n)
			stack = stack[:len(stack)-1]
		}
	}
	slices.Reverse(post)
	p.order = post
	for rank, n := range post {
		p.nodes[n].rank = rank
	}
	return nil
}

// checkBranches checks that no subschema has a value checked against more
// than MaxBranches subschemas in place.
func (p *plan) checkBranches() error {
	paths := make([]uint64, len(p.nodes))
	for i := len(p.order) - 1; i >= 0; i-- {
		n := p.order[i]
		sum := uint64(1)
		for _, c := range p.nodes[n].inPlace {
			sum = satAdd(sum, paths[c], MaxBranches+1)
		}
		if sum > MaxBranches {
			return &LimitError{What: fmt.Sprintf("subschemas checked against one value in place (through %s)", inPlaceKeywords), Max: MaxBranches}
		}
		paths[n] = sum
	}
	return nil
}

// inPlaceKeywords names the keywords that check a value against another
// subschema.
const inPlaceKeywords = "$ref, allOf, anyOf, oneOf, not, if, then, else, dependentSchemas, dependencies"

// valueNodes counts the JSON values v holds, itself included.
func valueNodes(v any) int {
	switch v := v.(type) {
	case map[string]any:
		n := 1
		for _, e := range v {
			n += valueNodes(e)
		}
		return n
	case []any:
		n := 1
		for _, e := range v {
			n += valueNodes(e)
		}
		return n
	}
	return 1
}

// sortedKeys returns m's keys in order, so that a plan is the same on
// every run.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// satAdd returns a+b, or limit when that is more.
func satAdd(a, b, limit uint64) uint64 {
	if a >= limit || b >= limit || a+b >= limit {
		return limit
	}
	return a + b
}

// satMul returns a*b, or limit when that is more.
func satMul(a, b, limit uint64) uint64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a >= limit || b >= limit || a > limit/b {
		return limit
	}
	return a * b
}
