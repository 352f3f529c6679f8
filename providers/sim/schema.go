package sim

import (
	"encoding/json"
	"strings"
)

// maxInstanceDepth bounds how deep [instance] follows a schema: a
// recursive schema gets null below it.
const maxInstanceDepth = 8

// schemaReply returns the reply to a request with an output schema: a
// JSON value the schema accepts, its strings taken from text; "" when the
// schema is not a JSON object.
func schemaReply(schema []byte, text string) string {
	var root map[string]any
	if err := json.Unmarshal(schema, &root); err != nil || root == nil {
		return ""
	}
	b, err := json.Marshal(instance(root, root, text, 0))
	if err != nil {
		return ""
	}
	return string(b)
}

// instance makes a value that schema s (of the document root) accepts,
// for the common keywords: $ref to the document's $defs or definitions,
// const, enum, anyOf and oneOf (the first), type, properties (every one),
// items and minItems, minimum, minLength.
func instance(root, s map[string]any, text string, depth int) any {
	if depth > maxInstanceDepth || s == nil {
		return nil
	}
	if ref, ok := s["$ref"].(string); ok {
		for _, prefix := range []string{"#/$defs/", "#/definitions/"} {
			if name, ok := strings.CutPrefix(ref, prefix); ok {
				defs, _ := root[strings.Trim(prefix[1:], "/")].(map[string]any)
				sub, _ := defs[name].(map[string]any)
				return instance(root, sub, text, depth+1)
			}
		}
		return nil
	}
	if c, ok := s["const"]; ok {
		return c
	}
	if e, ok := s["enum"].([]any); ok && len(e) > 0 {
		return e[0]
	}
	for _, key := range []string{"anyOf", "oneOf"} {
		if list, ok := s[key].([]any); ok && len(list) > 0 {
			sub, _ := list[0].(map[string]any)
			return instance(root, sub, text, depth+1)
		}
	}
	typ := s["type"]
	if list, ok := typ.([]any); ok && len(list) > 0 {
		typ = list[0]
	}
	if typ == nil && s["properties"] != nil {
		typ = "object"
	}
	switch typ {
	case "object":
		out := map[string]any{}
		props, _ := s["properties"].(map[string]any)
		for name, p := range props {
			sub, _ := p.(map[string]any)
			out[name] = instance(root, sub, text, depth+1)
		}
		return out
	case "array":
		n, _ := s["minItems"].(float64)
		out := make([]any, 0, int(min(max(n, 1), 16)))
		sub, _ := s["items"].(map[string]any)
		for range cap(out) {
			out = append(out, instance(root, sub, text, depth+1))
		}
		return out
	case "string":
		if text == "" {
			text = "sim"
		}
		n, _ := s["minLength"].(float64)
		out := text
		for len([]rune(out)) < int(n) {
			out += " " + text
		}
		return out
	case "integer":
		v, _ := s["minimum"].(float64)
		return int64(max(v, 1))
	case "number":
		v, _ := s["minimum"].(float64)
		return max(v, 1)
	case "boolean":
		return true
	}
	return nil
}
