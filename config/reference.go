package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Reference returns the configuration reference in Markdown: a table of
// every key the decoder knows, with its type, default, allowed values and
// help, rendered from the same walk as [Schema]. docs/config-reference.md
// is a copy, kept fresh by a test.
func Reference() []byte {
	var b bytes.Buffer
	b.WriteString(`# Configuration reference

<!-- Generated from the decoder's schema (config/schema.go) and the Go doc
comments of the fields: run "go generate ./config" or
"turnstile config reference"; do not edit. -->

Every key of ` + "`turnstile.yaml`" + `, as ` + "`turnstile serve`" + ` decodes it. A key the file
leaves out keeps its default; a key it sets means what it says, 0 included.
` + "`turnstile config check FILE`" + ` runs the server's checks on a file without
starting it, and ` + "`turnstile config schema`" + ` prints the JSON Schema
(config/turnstile.schema.json) that editors use to complete and check the
file: start a file with

    # yaml-language-server: $schema=https://raw.githubusercontent.com/turnstile-dev/turnstile/main/config/turnstile.schema.json

Paths write a map's keys as ` + "`<name>`, `<alias>` or `<key>`" + `; ` + "`[]`" + ` is a list item.
`)
	root := schemaTree()
	for _, top := range root.fields {
		fmt.Fprintf(&b, "\n## %s\n\n", top.name)
		if top.help != "" {
			fmt.Fprintf(&b, "%s\n\n", top.help)
		}
		if top.elem != nil && top.elem.variants != nil {
			providerReference(&b, top)
			continue
		}
		tableHead(&b)
		if top.kind == kindObject {
			// The section's paragraph is the block's row.
			for _, f := range top.fields {
				rows(&b, f, top.name+"."+f.name)
			}
			continue
		}
		rows(&b, top, top.name)
	}
	return b.Bytes()
}

// providerReference writes the providers section: one table per type.
func providerReference(b *bytes.Buffer, k *key) {
	path := k.name + "." + k.entry
	tableHead(b)
	fmt.Fprintf(b, "| `%s.type` | string | required | %s | The provider type. |\n", path, codes(variantNames(k.elem)))
	for _, v := range k.elem.variants {
		fmt.Fprintf(b, "\n### type: %s\n\n", v.name)
		tableHead(b)
		for _, f := range v.fields {
			rows(b, f, path+"."+f.name)
		}
	}
}

func variantNames(k *key) []string {
	var out []string
	for _, v := range k.variants {
		out = append(out, v.name)
	}
	return out
}

func tableHead(b *bytes.Buffer) {
	b.WriteString("| Key | Type | Default | Allowed | Description |\n|---|---|---|---|---|\n")
}

// rows writes the row of k at path, then those of the keys inside it.
func rows(b *bytes.Buffer, k *key, path string) {
	fmt.Fprintf(b, "| `%s` | %s | %s | %s | %s |\n", path, typeName(k), defaultText(k), codes(k.enum), cell(k.help))
	switch k.kind {
	case kindObject:
		for _, f := range k.fields {
			rows(b, f, path+"."+f.name)
		}
	case kindMap:
		if k.elem.kind == kindObject {
			for _, f := range k.elem.fields {
				rows(b, f, path+"."+k.entry+"."+f.name)
			}
		}
	case kindList:
		if k.elem.kind == kindObject {
			for _, f := range k.elem.fields {
				rows(b, f, path+"[]."+f.name)
			}
		}
	}
}

// typeName says what k takes, in words.
func typeName(k *key) string {
	switch k.kind {
	case kindObject:
		return "block"
	case kindMap:
		if k.elem.kind == kindObject {
			return "map of `" + k.entry + "` to block"
		}
		return "map of `" + k.entry + "` to " + typeName(k.elem)
	case kindList:
		return "list of " + typeName(k.elem)
	case kindText:
		if k.goType.Name() == "HedgeDelay" {
			return "duration or quantile (p95)"
		}
	}
	return k.kind
}

// defaultText writes k's default; a block's defaults are those of its
// keys.
func defaultText(k *key) string {
	switch {
	case k.def == nil:
		return ""
	case k.def == "":
		return `""`
	}
	j, err := json.Marshal(k.def)
	if err != nil {
		return fmt.Sprint(k.def)
	}
	return "`" + strings.Trim(string(j), `"`) + "`"
}

// codes writes values as code, comma separated.
func codes(vs []string) string {
	var out []string
	for _, v := range vs {
		out = append(out, "`"+v+"`")
	}
	return strings.Join(out, ", ")
}

// cell makes text fit a table cell.
func cell(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "|", `\|`), "\n", " ")
}
