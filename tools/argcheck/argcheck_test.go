package argcheck_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/tools/argcheck"
)

// countingTool records how often it ran.
type countingTool struct {
	schema string
	calls  atomic.Int32
}

func (c *countingTool) Spec() llm.ToolSpec {
	return llm.ToolSpec{Name: "lookup", Schema: json.RawMessage(c.schema)}
}

func (c *countingTool) Call(_ context.Context, call llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
	c.calls.Add(1)
	return llm.ToolOutput{Content: "ran with " + call.Arguments}, nil
}

const schema = `{
	"type": "object",
	"properties": {
		"key":   {"type": "string", "minLength": 1},
		"limit": {"type": "integer", "minimum": 1},
		"mode":  {"enum": ["fast", "exact"]},
		"tags":  {"type": "array", "items": {"type": "string"}},
		"opts":  {"type": "object", "properties": {"deep": {"type": "boolean"}}}
	},
	"required": ["key"],
	"additionalProperties": false
}`

func TestCall(t *testing.T) {
	tests := []struct {
		name    string
		args    string
		wantRun bool
		// wantIn lists fragments the error message must contain.
		wantIn []string
	}{
		{name: "valid", args: `{"key":"a","limit":3,"mode":"fast","tags":["x"],"opts":{"deep":true}}`, wantRun: true},
		{name: "valid with spaces", args: "  {\"key\":\"a\"}\n", wantRun: true},
		{name: "wrong type", args: `{"key":"a","limit":"3"}`, wantIn: []string{`property "limit"`, "want integer"}},
		{name: "missing required", args: `{"limit":3}`, wantIn: []string{"arguments", "missing property 'key'"}},
		{name: "below minimum", args: `{"key":"a","limit":0}`, wantIn: []string{`property "limit"`, "minimum"}},
		{name: "not in enum", args: `{"key":"a","mode":"slow"}`, wantIn: []string{`property "mode"`, "'fast'"}},
		{name: "nested", args: `{"key":"a","opts":{"deep":1}}`, wantIn: []string{`property "opts.deep"`, "want boolean"}},
		{name: "array item", args: `{"key":"a","tags":["x",2]}`, wantIn: []string{`property "tags[1]"`, "want string"}},
		{name: "unknown property", args: `{"key":"a","colour":"red"}`, wantIn: []string{"'colour'", "not allowed"}},
		{name: "two problems", args: `{"key":"","limit":-1}`, wantIn: []string{`property "key"`, `property "limit"`}},
		{name: "malformed JSON", args: `{"key":"a"`, wantIn: []string{"not valid JSON"}},
		{name: "trailing data", args: `{"key":"a"} {}`, wantIn: []string{"not valid JSON"}},
		{name: "not an object", args: `["a"]`, wantIn: []string{"must be a JSON object", "an array"}},
		{name: "null", args: `null`, wantIn: []string{"must be a JSON object", "null"}},
		{name: "empty means {}", args: ``, wantIn: []string{"missing property 'key'"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			inner := &countingTool{schema: schema}
			tool, err := argcheck.Wrap(inner)
			if err != nil {
				t.Fatalf("Wrap: %v", err)
			}
			out, err := tool.Call(t.Context(), llm.ToolCall{ID: "1", Name: "lookup", Arguments: tt.args}, nil)
			if err != nil {
				t.Fatalf("Call(%s) error = %v, want nil", tt.args, err)
			}
			ran := inner.calls.Load() == 1
			if ran != tt.wantRun {
				t.Fatalf("Call(%s): tool ran = %v, want %v (output %q)", tt.args, ran, tt.wantRun, out.Content)
			}
			if tt.wantRun {
				if out.IsError || !strings.HasPrefix(out.Content, "ran with") {
					t.Fatalf("Call(%s) = %+v, want the tool's own output", tt.args, out)
				}
				return
			}
			if !out.IsError {
				t.Fatalf("Call(%s).IsError = false, want true", tt.args)
			}
			if !strings.Contains(out.Content, `tool "lookup"`) {
				t.Errorf("Call(%s).Content = %q, want it to name the tool", tt.args, out.Content)
			}
			for _, frag := range tt.wantIn {
				if !strings.Contains(out.Content, frag) {
					t.Errorf("Call(%s).Content = %q, want it to contain %q", tt.args, out.Content, frag)
				}
			}
		})
	}
}

func TestWrapSchemas(t *testing.T) {
	tests := []struct {
		name    string
		schema  string
		wantErr string // "" for success
		args    string // checked when the schema compiles
		wantOK  bool
	}{
		{name: "empty schema is an object", schema: ``, args: `{"anything":1}`, wantOK: true},
		{name: "empty schema rejects arrays", schema: ``, args: `[]`, wantOK: false},
		{name: "draft-07", schema: `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"a":{"type":"string"}},"definitions":{"x":{"type":"string"}}}`, args: `{"a":1}`, wantOK: false},
		{name: "draft-04", schema: `{"$schema":"http://json-schema.org/draft-04/schema#","type":"object","properties":{"n":{"type":"integer","minimum":1,"exclusiveMinimum":true}}}`, args: `{"n":1}`, wantOK: false},
		{name: "local ref", schema: `{"type":"object","properties":{"a":{"$ref":"#/$defs/s"}},"$defs":{"s":{"type":"string"}}}`, args: `{"a":"x"}`, wantOK: true},
		{name: "not JSON", schema: `{"type":`, wantErr: "not JSON"},
		{name: "bad type name", schema: `{"type":"strnig"}`, wantErr: "invalid input schema"},
		{name: "bad type value", schema: `{"type":5}`, wantErr: "invalid input schema"},
		{name: "bad regexp", schema: `{"type":"object","properties":{"a":{"pattern":"("}}}`, wantErr: "invalid input schema"},
		{name: "dangling ref", schema: `{"type":"object","properties":{"a":{"$ref":"#/$defs/nope"}}}`, wantErr: "invalid input schema"},
		{name: "file ref is not loaded", schema: `{"type":"object","properties":{"a":{"$ref":"file:///etc/passwd"}}}`, wantErr: "invalid input schema"},
		{name: "remote ref is not fetched", schema: `{"type":"object","properties":{"a":{"$ref":"https://example.com/s.json"}}}`, wantErr: "invalid input schema"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			inner := &countingTool{schema: tt.schema}
			tool, err := argcheck.Wrap(inner)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), `"lookup"`) {
					t.Fatalf("Wrap(%s) error = %v, want one naming the tool and containing %q", tt.schema, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Wrap(%s): %v", tt.schema, err)
			}
			out, err := tool.Call(t.Context(), llm.ToolCall{Arguments: tt.args}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if ok := !out.IsError; ok != tt.wantOK {
				t.Fatalf("Call(%s) = %+v, want valid = %v", tt.args, out, tt.wantOK)
			}
		})
	}
}

func TestSpecIsUnchanged(t *testing.T) {
	inner := &countingTool{schema: schema}
	tool, err := argcheck.Wrap(inner)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tool.Spec().Name, inner.Spec().Name; got != want {
		t.Errorf("Spec().Name = %q, want %q", got, want)
	}
	if got, want := string(tool.Spec().Schema), schema; got != want {
		t.Errorf("Spec().Schema changed")
	}
}
