package sim_test

import (
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
	"github.com/turnstile-dev/turnstile/providers/sim"
	"github.com/turnstile-dev/turnstile/tools/argcheck"
)

func TestOutputSchemaReplies(t *testing.T) {
	t.Parallel()
	p, err := sim.New("sim", sim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	schemas := []string{
		`{"type":"object","properties":{"city":{"type":"string","minLength":2},"temp":{"type":"number","minimum":-40},"days":{"type":"array","items":{"type":"integer"},"minItems":2},"ok":{"type":"boolean"},"unit":{"enum":["C","F"]}},"required":["city","temp","days","ok","unit"],"additionalProperties":false}`,
		`{"type":"array","items":{"$ref":"#/$defs/p"},"$defs":{"p":{"type":"object","properties":{"name":{"type":"string"},"age":{"anyOf":[{"type":"integer"},{"type":"null"}]}},"required":["name","age"]}}}`,
		`{"type":"string","minLength":50}`,
	}
	for _, schema := range schemas {
		check, err := argcheck.OutputSchemas{}.Compile([]byte(schema))
		if err != nil {
			t.Fatal(err)
		}
		req := &llm.Request{Model: "sim-1", OutputSchema: &llm.OutputSchema{Name: "o", Schema: []byte(schema)},
			Messages: []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("weather in Oslo")}}}}
		chunks, err := providertest.Collect(t, t.Context(), p, req)
		if err != nil {
			t.Fatal(err)
		}
		text := textOf(chunks)
		if issues := check(text); issues != nil {
			t.Errorf("reply %s to schema %s: %q", text, schema, issues)
		}
	}
	// A reply directive wins: it can make a reply that does not match.
	req := &llm.Request{Model: "sim-1", OutputSchema: &llm.OutputSchema{Name: "o", Schema: []byte(schemas[0])},
		Messages: []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(`[sim reply="{\"city\":7}"] weather`)}}}}
	chunks, err := providertest.Collect(t, t.Context(), p, req)
	if err != nil {
		t.Fatal(err)
	}
	if got := textOf(chunks); got != `{"city":7}` {
		t.Errorf("reply %q, want the directive's", got)
	}
}

func textOf(chunks []llm.Chunk) string {
	var s string
	for _, c := range chunks {
		if c.Kind == llm.ChunkText {
			s += c.Text
		}
	}
	return s
}
