package config

import (
	"encoding"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// decoder walks YAML nodes into Go values by their yaml struct tags. It
// decodes into values that already hold their defaults, so a key the file
// leaves out keeps its default and a key it sets, even to 0, sets it. It
// never stops at a problem: each is recorded with its path and line, and
// the value concerned keeps its default.
type decoder struct {
	problems []Problem
	// lines maps the path of every key and list item decoded to its line.
	lines map[string]int
	// starts gives the value a new map entry of a type starts from; a type
	// not listed starts from its zero value.
	starts map[reflect.Type]func() reflect.Value
	// aliases counts alias expansions, to stop alias bombs.
	aliases int
}

// maxAliases bounds the alias expansions of one file.
const maxAliases = 1000

// nodeDecoder is implemented by types that decode themselves from a node,
// such as a provider entry whose keys depend on its type.
type nodeDecoder interface {
	decodeNode(d *decoder, n *yaml.Node, path string)
}

var (
	durationType    = reflect.TypeFor[time.Duration]()
	nodeDecoderType = reflect.TypeFor[nodeDecoder]()
	textType        = reflect.TypeFor[encoding.TextUnmarshaler]()
)

func newDecoder() *decoder {
	return &decoder{lines: map[string]int{}, starts: map[reflect.Type]func() reflect.Value{}}
}

// problem records a problem at line.
func (d *decoder) problem(line int, path, format string, args ...any) {
	d.problems = append(d.problems, Problem{Line: line, Path: path, Message: fmt.Sprintf(format, args...)})
}

// expected records that n is not the kind of value path takes.
func (d *decoder) expected(n *yaml.Node, path, what string) {
	if got := describe(n); got != "a string" {
		d.problem(n.Line, path, "expected %s, got %s", what, got)
		return
	}
	d.problem(n.Line, path, "expected %s", what)
}

// describe says what n is, in words. It quotes numbers and booleans but
// never a string, which may be a secret in the wrong place.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a block of key: value pairs"
	case yaml.SequenceNode:
		return "a list"
	}
	switch n.ShortTag() {
	case "!!null":
		return "nothing"
	case "!!int", "!!float", "!!bool":
		return n.Value
	}
	return "a string"
}

// join returns the path of key inside path.
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// resolve follows aliases; it returns nil when there are too many.
func (d *decoder) resolve(n *yaml.Node, path string) *yaml.Node {
	for n.Kind == yaml.AliasNode {
		d.aliases++
		if d.aliases > maxAliases {
			if d.aliases == maxAliases+1 {
				d.problem(n.Line, path, "too many aliases")
			}
			return nil
		}
		n = n.Alias
	}
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: n.Line}
		}
		return d.resolve(n.Content[0], path)
	}
	return n
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

// decode sets v from n; path is n's YAML path.
func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	if n = d.resolve(n, path); n == nil {
		return
	}
	if reflect.PointerTo(v.Type()).Implements(nodeDecoderType) {
		v.Addr().Interface().(nodeDecoder).decodeNode(d, n, path)
		return
	}
	if v.Type() == durationType {
		d.duration(n, v, path)
		return
	}
	if reflect.PointerTo(v.Type()).Implements(textType) {
		d.text(n, v, path)
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		if isNull(n) {
			v.SetZero()
			return
		}
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		d.decode(n, v.Elem(), path)
	case reflect.Struct:
		d.decodeStruct(n, v, path, nil, nil)
	case reflect.Map:
		d.decodeMap(n, v, path)
	case reflect.Slice:
		d.decodeSlice(n, v, path)
	case reflect.String:
		switch {
		case isNull(n):
			v.SetString("")
		case n.Kind != yaml.ScalarNode:
			d.expected(n, path, "a string")
		default:
			v.SetString(n.Value)
		}
	case reflect.Bool:
		b, err := strconv.ParseBool(n.Value)
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || err != nil {
			d.expected(n, path, "true or false")
			return
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		d.integer(n, v, path)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		d.unsigned(n, v, path)
	case reflect.Float32, reflect.Float64:
		d.float(n, v, path)
	default:
		panic(fmt.Sprintf("config: cannot decode into %s at %s", v.Type(), path))
	}
}

func (d *decoder) integer(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		d.expected(n, path, "a whole number")
		return
	}
	i, err := strconv.ParseInt(n.Value, 0, v.Type().Bits())
	if err != nil {
		bits := v.Type().Bits()
		d.problem(n.Line, path, "expected a whole number from %d to %d, got %s", int64(-1)<<(bits-1), int64(1)<<(bits-1)-1, n.Value)
		return
	}
	v.SetInt(i)
}

func (d *decoder) unsigned(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		d.expected(n, path, "a whole number")
		return
	}
	u, err := strconv.ParseUint(n.Value, 0, v.Type().Bits())
	if err != nil {
		d.problem(n.Line, path, "expected a whole number from 0 to %d, got %s", uint64(1)<<v.Type().Bits()-1, n.Value)
		return
	}
	v.SetUint(u)
}

func (d *decoder) float(n *yaml.Node, v reflect.Value, path string) {
	tag := n.ShortTag()
	if n.Kind != yaml.ScalarNode || tag != "!!int" && tag != "!!float" {
		d.expected(n, path, "a number")
		return
	}
	f, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64)
	if tag == "!!int" && err != nil {
		// Integers in other bases, such as 0x10.
		i, ierr := strconv.ParseInt(n.Value, 0, 64)
		f, err = float64(i), ierr
	}
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || v.OverflowFloat(f) {
		d.problem(n.Line, path, "expected a finite number, got %s", n.Value)
		return
	}
	v.SetFloat(f)
}

func (d *decoder) duration(n *yaml.Node, v reflect.Value, path string) {
	const what = "a duration such as 500ms or 2s"
	if n.Kind != yaml.ScalarNode || isNull(n) {
		d.expected(n, path, what)
		return
	}
	switch n.ShortTag() {
	case "!!int", "!!float":
		if f, err := strconv.ParseFloat(n.Value, 64); err == nil && f == 0 {
			v.SetInt(0)
			return
		}
		d.problem(n.Line, path, "expected %s, got %s without a unit (write %ss for seconds)", what, n.Value, n.Value)
		return
	}
	dur, err := time.ParseDuration(n.Value)
	if err != nil {
		d.expected(n, path, what)
		return
	}
	v.SetInt(int64(dur))
}

// text decodes a scalar into a value that reads itself from text. Its
// error is reported as it says, without the value, which may be a secret.
func (d *decoder) text(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		d.expected(n, path, "a value")
		return
	}
	if err := v.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(n.Value)); err != nil {
		d.problem(n.Line, path, "%v", err)
	}
}

// pair is one key and its value in a mapping; merged is true for those
// brought in by a merge key.
type pair struct {
	key, value *yaml.Node
	merged     bool
}

// pairs returns the entries of mapping n, those brought in by merge keys
// (<<) first, so the mapping's own keys override them.
func (d *decoder) pairs(n *yaml.Node, path string) []pair {
	var merged, own []pair
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			v = d.resolve(v, path)
			if v == nil {
				continue
			}
			srcs := []*yaml.Node{v}
			if v.Kind == yaml.SequenceNode {
				srcs = v.Content
			}
			for _, src := range srcs {
				if src = d.resolve(src, path); src == nil {
					continue
				}
				if src.Kind != yaml.MappingNode {
					d.expected(src, path, "a block of key: value pairs to merge")
					continue
				}
				for _, p := range d.pairs(src, path) {
					p.merged = true
					merged = append(merged, p)
				}
			}
			continue
		}
		own = append(own, pair{key: k, value: v})
	}
	return append(merged, own...)
}

// keyName returns the key of a mapping entry as text, or false after
// recording a problem when it is not a scalar.
func (d *decoder) keyName(k *yaml.Node, path string) (string, bool) {
	if k = d.resolve(k, path); k == nil {
		return "", false
	}
	if k.Kind != yaml.ScalarNode {
		d.problem(k.Line, path, "a key must be a plain name, not %s", describe(k))
		return "", false
	}
	return k.Value, true
}

// field is a struct field and its yaml key.
type field struct {
	key   string
	index []int
}

// fields returns the yaml keys of struct type t in declaration order,
// those of ,inline embedded structs included.
func fields(t reflect.Type) []field {
	var out []field
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		inline := f.Anonymous && f.Type.Kind() == reflect.Struct && slices.Contains(strings.Split(opts, ","), "inline")
		if !f.IsExported() && !inline || name == "-" {
			continue
		}
		if inline {
			for _, in := range fields(f.Type) {
				out = append(out, field{key: in.key, index: append([]int{i}, in.index...)})
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out = append(out, field{key: name, index: []int{i}})
	}
	return out
}

// keys returns the yaml keys of struct type t.
func keys(t reflect.Type) []string {
	var out []string
	for _, f := range fields(t) {
		out = append(out, f.key)
	}
	return out
}

// decodeStruct sets the fields of struct v from mapping n. handled lists
// keys the caller decodes itself; hint, when not nil, may add a note to
// the message about an unknown key.
func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, path string, handled []string, hint func(key string) string) {
	if isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		d.expected(n, path, "a block of key: value pairs")
		return
	}
	fs := fields(v.Type())
	var known []string
	for _, k := range handled {
		if !slices.Contains(keys(v.Type()), k) {
			known = append(known, k)
		}
	}
	known = append(known, keys(v.Type())...)
	seen := map[string]int{}
	for _, p := range d.pairs(n, path) {
		key, ok := d.keyName(p.key, path)
		if !ok {
			continue
		}
		at := join(path, key)
		if d.repeated(seen, key, p, at) || slices.Contains(handled, key) {
			continue
		}
		i := slices.IndexFunc(fs, func(f field) bool { return f.key == key })
		if msg, ok := retiredKeys[v.Type()][key]; ok && i < 0 {
			d.problem(p.key.Line, at, "%s", msg)
			continue
		}
		if i < 0 {
			d.problem(p.key.Line, at, "unknown key%s", d.unknownNote(key, known, v.Type(), hint))
			continue
		}
		d.lines[at] = p.key.Line
		d.decode(p.value, v.FieldByIndex(fs[i].index), at)
	}
}

// repeated reports whether the mapping's own key was already seen in it,
// recording a problem if so. Keys brought in by a merge key are not
// recorded: the mapping's own keys override them.
func (d *decoder) repeated(seen map[string]int, key string, p pair, at string) bool {
	if p.merged {
		return false
	}
	if first, ok := seen[key]; ok {
		d.problem(p.key.Line, at, "appears twice (first on line %d)", first)
		return true
	}
	seen[key] = p.key.Line
	return false
}

// unknownNote explains an unknown key: the known key it is likely a typo
// of, or the nested key it belongs under, or hint's note, or the keys that
// are known.
func (d *decoder) unknownNote(key string, known []string, t reflect.Type, hint func(string) string) string {
	if s := didYouMean(key, known); s != "" {
		return s
	}
	for _, f := range fields(t) {
		ft := t.FieldByIndex(f.index).Type
		if ft.Kind() == reflect.Struct && ft != durationType && slices.Contains(keys(ft), key) {
			return "; did you mean " + f.key + "." + key + "?"
		}
	}
	if hint != nil {
		if h := hint(key); h != "" {
			return "; " + h
		}
	}
	return " (known keys: " + strings.Join(known, ", ") + ")"
}

// decodeMap sets the entries of map v from mapping n, each entry starting
// from the value d.starts gives for its type.
func (d *decoder) decodeMap(n *yaml.Node, v reflect.Value, path string) {
	if isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		d.expected(n, path, "a block of key: value pairs")
		return
	}
	if v.IsNil() {
		v.Set(reflect.MakeMap(v.Type()))
	}
	et := v.Type().Elem()
	seen := map[string]int{}
	for _, p := range d.pairs(n, path) {
		key, ok := d.keyName(p.key, path)
		if !ok {
			continue
		}
		at := join(path, key)
		if d.repeated(seen, key, p, at) {
			continue
		}
		d.lines[at] = p.key.Line
		e := reflect.New(et).Elem()
		if start, ok := d.starts[et]; ok {
			e.Set(start())
		}
		d.decode(p.value, e, at)
		v.SetMapIndex(reflect.ValueOf(key).Convert(v.Type().Key()), e)
	}
}

// decodeSlice sets slice v from sequence n, replacing what it held, each
// item starting from the value d.starts gives for its type.
func (d *decoder) decodeSlice(n *yaml.Node, v reflect.Value, path string) {
	if isNull(n) {
		v.SetZero()
		return
	}
	if n.Kind != yaml.SequenceNode {
		d.expected(n, path, "a list")
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	start := d.starts[v.Type().Elem()]
	for i, item := range n.Content {
		at := fmt.Sprintf("%s[%d]", path, i)
		d.lines[at] = item.Line
		if start != nil {
			s.Index(i).Set(start())
		}
		d.decode(item, s.Index(i), at)
	}
	v.Set(s)
}
