package chartgen

import (
	"encoding/json"
	"strings"
	"testing"
)

const readme = "# chart\n\n" + tableStart + "old\n" + tableEnd + "after\n"

// TestREADME: the table lists every value of values.yaml in its order,
// with the schema's type and description, and refuses a value one of the
// two files lacks.
func TestREADME(t *testing.T) {
	schema := `{"properties": {
		"global": {"type": "object"},
		"image": {"type": "object", "properties": {
			"tag": {"type": "string", "description": "The tag."},
			"pullPolicy": {"enum": ["Always", "Never"], "description": "Pull | not."}}},
		"resources": {"$ref": "#/$defs/resources", "description": "Requests."},
		"labels": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Labels."}}}`
	for _, tc := range []struct {
		name, values string
		want         []string // lines of the table, in order; or the error's words
		err          bool
	}{
		{"all", "image:\n  tag: v1\n  pullPolicy: Never\nresources: {limits: {memory: 1Gi}}\nlabels: {}\n", []string{
			"| `image.tag` | string | `\"v1\"` | The tag. |",
			"| `image.pullPolicy` | Always \\| Never | `\"Never\"` | Pull \\| not. |",
			"| `resources` | ResourceRequirements | `{\"limits\":{\"memory\":\"1Gi\"}}` | Requests. |",
			"| `labels` | map of string | `{}` | Labels. |",
		}, false},
		{"a value the schema lacks", "image: {tag: v1, pullPolicy: Never, extra: 1}\nresources: {}\nlabels: {}\n", []string{"image.extra: in values.yaml, not in values.schema.json"}, true},
		{"a value values.yaml lacks", "image: {tag: v1, pullPolicy: Never}\nresources: {}\n", []string{"labels: in values.schema.json, not in values.yaml"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := README([]byte(readme), []byte(schema), []byte(tc.values))
			if tc.err {
				if err == nil || !strings.Contains(err.Error(), tc.want[0]) {
					t.Errorf("README: %v, want an error saying %q", err, tc.want[0])
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := "# chart\n\n" + tableStart + "| value | type | default | description |\n|---|---|---|---|\n" + strings.Join(tc.want, "\n") + "\n" + tableEnd + "after\n"
			if string(got) != want {
				t.Errorf("README:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// TestSchemaOfKubernetesTypes: a pass-through value's schema is the API
// type's fields and no other, quantities and int-or-strings as the API
// server takes them.
func TestSchemaOfKubernetesTypes(t *testing.T) {
	b, err := Schema([]byte(`{"properties": {}}`), []byte(`{"$schema": "x", "$id": "y", "type": "object"}`))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Defs map[string]map[string]any `json:"$defs"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if _, ok := doc.Defs["config"]["$schema"]; ok {
		t.Error("the config definition keeps the server schema's $schema")
	}
	rr := doc.Defs["k8s.api.core.v1.ResourceRequirements"]
	props, _ := rr["properties"].(map[string]any)
	if rr["additionalProperties"] != false || props["limits"] == nil || props["requests"] == nil || props["limit"] != nil {
		t.Errorf("ResourceRequirements: %v", rr)
	}
	limits, _ := props["limits"].(map[string]any)
	q, _ := limits["additionalProperties"].(map[string]any)
	if types, _ := q["type"].([]any); len(types) != 2 || types[0] != "string" || types[1] != "number" {
		t.Errorf("a quantity: %v, want a string or a number", q)
	}
	sc := doc.Defs["k8s.api.core.v1.SecurityContext"]["properties"].(map[string]any)
	for _, f := range []string{"runAsUser", "readOnlyRootFilesystem", "capabilities", "seccompProfile"} {
		if sc[f] == nil {
			t.Errorf("SecurityContext has no %s", f)
		}
	}
}
