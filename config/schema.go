package config

//go:generate go test -run TestGenerated -update .

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/providers/registry"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/store"
)

// SchemaID is the JSON Schema's $id: where the committed copy lives.
const SchemaID = "https://raw.githubusercontent.com/turnstile-dev/turnstile/main/config/turnstile.schema.json"

// The kinds of value a key takes, as the decoder reads them.
const (
	kindObject   = "object"   // a struct: its yaml keys
	kindMap      = "map"      // a map: any key, each value the same kind
	kindList     = "list"     // a slice
	kindString   = "string"   // text
	kindInteger  = "integer"  // a whole number
	kindNumber   = "number"   // a finite number
	kindBoolean  = "boolean"  // true or false
	kindDuration = "duration" // a Go duration such as 500ms, or 0
	kindText     = "text"     // a scalar the type reads itself
)

// key is one key of the file as the decoder knows it: what it takes, its
// default, the values it allows and its help, from the Go doc comment of
// its field (fieldDocs). The schema and the reference are both rendered
// from the tree [schemaTree] walks.
type key struct {
	name    string
	kind    string
	goType  reflect.Type
	help    string
	def     any // the default, as JSON; nil when none
	enum    []string
	min     *int64
	fields  []*key // kindObject
	elem    *key   // kindMap and kindList
	entry   string // the word naming a map's key in paths: <alias>
	unsetOK bool   // a pointer: left out is unset
	// variants are the providers entry's types: each its own keys.
	variants []variant
}

// variant is one provider type's entry.
type variant struct {
	name   string
	goType reflect.Type
	fields []*key
}

// enums lists the values of keys the checks hold to a fixed set, by the
// type and yaml key of the field, or by the named string type.
var enums = map[string][]string{
	typeKey(reflect.TypeFor[Log](), "format"):                          logFormats,
	typeKey(reflect.TypeFor[Log](), "level"):                           logLevels,
	typeKey(reflect.TypeFor[store.Config](), "mode"):                   {store.ModeEmbedded, store.ModeNATS, store.ModeOff},
	reflect.TypeFor[runtime.StreamCut]().String():                      {string(runtime.StreamCutRestart), string(runtime.StreamCutContinue)},
	reflect.TypeFor[runtime.HedgeTarget]().String():                    {string(runtime.HedgeNext), string(runtime.HedgeSelf), string(runtime.HedgeDeployment)},
	reflect.TypeFor[llm.Modality]().String():                           {string(llm.ModalityText), string(llm.ModalityImage), string(llm.ModalityPDF), string(llm.ModalityAudio)},
	typeKey(reflect.TypeFor[runtime.CapabilitiesConfig](), "thinking"): names(llm.Thinkings),
	typeKey(reflect.TypeFor[runtime.CapabilitiesConfig](), "sampling"): names(llm.Samplings),
}

// names returns the names of values.
func names[T fmt.Stringer](values []T) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = v.String()
	}
	return out
}

// typeKey names the field of struct t at yaml key k in fieldDocs and enums.
func typeKey(t reflect.Type, k string) string { return t.PkgPath() + "." + t.Name() + "." + k }

// entryNames names the key of each map in paths, by the map's yaml key.
var entryNames = map[string]string{
	"providers":      "<name>",
	"models":         "<alias>",
	"mcp_servers":    "<name>",
	"tool_overrides": "<tool>",
}

// starts gives the value a map entry of a type starts from, as Parse
// does.
var starts = map[reflect.Type]func() reflect.Value{
	reflect.TypeFor[Model]():      func() reflect.Value { return reflect.ValueOf(newModel(policy.DefaultRetry())) },
	reflect.TypeFor[MCPServer]():  func() reflect.Value { return reflect.ValueOf(newMCPServer()) },
	reflect.TypeFor[Deployment](): func() reflect.Value { return reflect.ValueOf(newDeployment()) },
}

// schemaTree walks the Go types the decoder decodes a file into, from the
// defaults Parse starts from.
func schemaTree() *key {
	root := &key{kind: kindObject}
	d := defaults()
	// The generated files are the same for every user: a default that
	// depends on the environment is written as the docs write it.
	d.Store.Dir = store.DefaultDirText
	root.fields = walkFields(reflect.ValueOf(d).Elem())
	return root
}

// walkFields returns the keys of struct value v, each with v's value as
// its default.
func walkFields(v reflect.Value) []*key {
	var out []*key
	for _, f := range fields(v.Type()) {
		owner := v.Type()
		if len(f.index) > 1 {
			owner = v.Type().FieldByIndex(f.index[:len(f.index)-1]).Type
		}
		fv := v.FieldByIndex(f.index)
		k := walk(fv, f.key)
		k.help = fieldDocs[typeKey(owner, f.key)]
		if e, ok := enums[typeKey(owner, f.key)]; ok {
			k.enum = e
		}
		out = append(out, k)
	}
	return out
}

// walk returns the key name of value v, v's value as its default.
func walk(v reflect.Value, name string) *key {
	t := v.Type()
	k := &key{name: name, goType: t}
	if e, ok := enums[t.String()]; ok && t.Kind() == reflect.String {
		k.enum = e
	}
	switch {
	case t == reflect.TypeFor[map[string]Provider]():
		k.kind, k.entry = kindMap, entryNames[name]
		k.elem = &key{kind: kindObject, goType: reflect.TypeFor[Provider]()}
		for _, n := range registry.Names() {
			typ, _ := registry.Lookup(n)
			v := reflect.ValueOf(typ.New()).Elem()
			k.elem.variants = append(k.elem.variants, variant{name: n, goType: v.Type(), fields: walkFields(v)})
		}
		return k
	case t == durationType:
		k.kind, k.def = kindDuration, formatDuration(time.Duration(v.Int()))
		return k
	case reflect.PointerTo(t).Implements(textType):
		k.kind = kindText
		return k
	}
	switch t.Kind() {
	case reflect.Pointer:
		e := reflect.New(t.Elem()).Elem()
		k = walk(e, name)
		k.goType, k.unsetOK, k.def = t, true, nil
	case reflect.Struct:
		k.kind, k.fields = kindObject, walkFields(v)
	case reflect.Map:
		k.kind, k.entry = kindMap, entryNames[name]
		if k.entry == "" {
			k.entry = "<key>"
		}
		e := reflect.New(t.Elem()).Elem()
		if start, ok := starts[t.Elem()]; ok {
			e.Set(start())
		}
		k.elem = walk(e, "")
		k.elem.def = nil
	case reflect.Slice:
		k.kind = kindList
		e := reflect.New(t.Elem()).Elem()
		if start, ok := starts[t.Elem()]; ok {
			e.Set(start())
		}
		k.elem = walk(e, "")
		k.elem.def = nil
		if v.Len() > 0 {
			k.def = v.Interface()
		}
	case reflect.String:
		k.kind, k.def = kindString, v.String()
	case reflect.Bool:
		k.kind, k.def = kindBoolean, v.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		k.kind, k.def = kindInteger, v.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		zero := int64(0)
		k.kind, k.def, k.min = kindInteger, v.Uint(), &zero
	case reflect.Float32, reflect.Float64:
		k.kind, k.def = kindNumber, v.Float()
	default:
		panic(fmt.Sprintf("config: no schema for %s at %s", t, name))
	}
	return k
}

// formatDuration writes d as the file would: 30s, 5m, 24h, 0.
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	if s == "0s" {
		return "0"
	}
	return s
}

// durationPattern matches what time.ParseDuration reads.
const durationPattern = `^[-+]?(0|([0-9]*(\.[0-9]*)?(ns|us|µs|μs|ms|s|m|h))+)$`

// Schema returns the JSON Schema (draft 2020-12) of the configuration
// file: every key the decoder knows, with its type, default, allowed values
// and help. config/turnstile.schema.json is a copy, kept fresh by a test.
func Schema() []byte {
	s := objectSchema(schemaTree())
	s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	s["$id"] = SchemaID
	s["title"] = "turnstile.yaml"
	s["description"] = "The configuration file of turnstile serve (see docs/config-reference.md)."
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(orderedMap(s)); err != nil {
		panic(fmt.Sprintf("config: encoding the schema: %v", err))
	}
	return b.Bytes()
}

// jsonSchema returns k's schema.
func jsonSchema(k *key) map[string]any {
	var s map[string]any
	switch k.kind {
	case kindObject:
		s = objectSchema(k)
	case kindMap:
		s = map[string]any{"type": "object", "additionalProperties": jsonSchema(k.elem)}
	case kindList:
		s = map[string]any{"type": "array", "items": jsonSchema(k.elem)}
	case kindString:
		s = map[string]any{"type": "string"}
	case kindInteger:
		s = map[string]any{"type": "integer"}
		if k.min != nil {
			s["minimum"] = *k.min
		}
	case kindNumber:
		s = map[string]any{"type": "number"}
	case kindBoolean:
		s = map[string]any{"type": "boolean"}
	case kindDuration:
		s = map[string]any{"anyOf": []any{
			map[string]any{"type": "string", "pattern": durationPattern},
			map[string]any{"const": 0},
		}}
	case kindText:
		s = map[string]any{"type": []any{"string", "number"}}
	}
	if t, ok := s["type"].(string); ok && k.unsetOK {
		// null leaves a block or value that may be unset unset.
		s["type"] = []any{t, "null"}
	}
	if k.enum != nil {
		s["enum"] = k.enum
	}
	if k.help != "" {
		s["description"] = k.help
	}
	if k.def != nil {
		s["default"] = k.def
	}
	return s
}

// objectSchema returns the schema of a block of keys.
func objectSchema(k *key) map[string]any {
	if k.variants != nil {
		return providerSchema(k)
	}
	props := map[string]any{}
	var order []string
	for _, f := range k.fields {
		props[f.name] = jsonSchema(f)
		order = append(order, f.name)
	}
	return map[string]any{"type": "object", "properties": props, "additionalProperties": false, keyOrder: order}
}

// providerSchema returns the schema of a providers entry: a type, and the
// keys of that type.
func providerSchema(k *key) map[string]any {
	var names []any
	var cases []any
	for _, v := range k.variants {
		names = append(names, v.name)
		props := map[string]any{"type": map[string]any{"const": v.name}}
		order := []string{"type"}
		for _, f := range v.fields {
			props[f.name] = jsonSchema(f)
			order = append(order, f.name)
		}
		cases = append(cases, map[string]any{
			"if":   map[string]any{"properties": map[string]any{"type": map[string]any{"const": v.name}}, "required": []any{"type"}},
			"then": map[string]any{"properties": props, "additionalProperties": false, keyOrder: order},
		})
	}
	return map[string]any{
		"type":        "object",
		"description": "A provider: its type, and that type's keys.",
		"required":    []any{"type"},
		"properties":  map[string]any{"type": map[string]any{"enum": names, "description": "The provider type."}},
		"allOf":       cases,
	}
}

// keyOrder is the entry of a schema map listing its properties' order; it
// is not written.
const keyOrder = "\x00order"

// orderedMap turns a schema map into one that encodes its keys in a fixed
// order: the schema keywords first, properties in declaration order.
func orderedMap(v any) any {
	switch v := v.(type) {
	case map[string]any:
		var keys []string
		for _, k := range []string{"$schema", "$id", "title", "description", "type", "enum", "const", "default", "minimum", "pattern", "required", "properties", "additionalProperties", "items", "anyOf", "allOf", "if", "then"} {
			if _, ok := v[k]; ok {
				keys = append(keys, k)
			}
		}
		if len(keys) != len(v)-boolInt(v[keyOrder] != nil) {
			panic(fmt.Sprintf("config: a schema keyword is missing from orderedMap: %v", v))
		}
		o := ordered{}
		for _, k := range keys {
			val := v[k]
			if k == "properties" && v[keyOrder] != nil {
				props := ordered{}
				for _, name := range v[keyOrder].([]string) {
					props = append(props, kv{name, orderedMap(val.(map[string]any)[name])})
				}
				o = append(o, kv{k, props})
				continue
			}
			o = append(o, kv{k, orderedMap(val)})
		}
		return o
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = orderedMap(e)
		}
		return out
	}
	return v
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// kv is one entry of an ordered JSON object.
type kv struct {
	k string
	v any
}

// ordered is a JSON object that keeps its keys' order.
type ordered []kv

// MarshalJSON writes o's entries in order.
func (o ordered) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, e := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(e.k)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		var v bytes.Buffer
		enc := json.NewEncoder(&v)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(e.v); err != nil {
			return nil, err
		}
		b.Write(bytes.TrimSuffix(v.Bytes(), []byte("\n")))
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}
