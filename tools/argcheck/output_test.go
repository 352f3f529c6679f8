package argcheck_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/tools/argcheck"
)

func TestOutputSchemas(t *testing.T) {
	t.Parallel()
	const schema = `{"type":"object","properties":{"city":{"type":"string"},"temp":{"type":"number"}},"required":["city","temp"],"additionalProperties":false}`
	check, err := argcheck.OutputSchemas{}.Compile([]byte(schema))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, text string
		want       []string
	}{
		{"valid", `{"city":"Oslo","temp":3.5}`, nil},
		{"valid with white space", " \n{\"city\":\"Oslo\",\"temp\":3}\n", nil},
		{"missing property", `{"city":"Oslo"}`, []string{"the reply: missing property 'temp'"}},
		{"wrong type", `{"city":"Oslo","temp":"warm"}`, []string{`property "temp": got string, want number`}},
		{"extra property", `{"city":"Oslo","temp":1,"wind":2}`, []string{"the reply: additional properties 'wind' not allowed"}},
		{"not JSON", `The weather in Oslo is mild.`, []string{"the reply is not one JSON value (invalid character 'T' looking for beginning of value)"}},
		{"two values", `{"city":"a","temp":1} {}`, []string{"the reply is not one JSON value (invalid character after top-level value)"}},
		{"fenced", "```json\n{\"city\":\"a\",\"temp\":1}\n```", []string{"the reply is not one JSON value (invalid character '`' looking for beginning of value)"}},
	}
	for _, tt := range tests {
		if got := check(tt.text); !slices.Equal(got, tt.want) {
			t.Errorf("%s: check = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestOutputSchemasRefusesBadSchemas(t *testing.T) {
	t.Parallel()
	for _, schema := range []string{``, `{"type":"nonsense"}`, `{"$ref":"https://example.com/s.json"}`, `not json`} {
		_, err := argcheck.OutputSchemas{}.Compile([]byte(schema))
		if err == nil {
			t.Errorf("Compile(%q) succeeded, want an error", schema)
			continue
		}
		if strings.Contains(err.Error(), "input schema") {
			t.Errorf("Compile(%q) = %v, which names an input schema", schema, err)
		}
	}
	// Any JSON value may be asked for, not only an object.
	check, err := argcheck.OutputSchemas{}.Compile([]byte(`{"type":"array","items":{"type":"integer"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := check(`[1,2,3]`); got != nil {
		t.Errorf("check([1,2,3]) = %q", got)
	}
}
