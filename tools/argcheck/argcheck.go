// Package argcheck validates a tool call's arguments against the tool's JSON
// Schema before the tool runs, so that a model that sent malformed or
// mistyped arguments gets a clear error result it can correct, and the tool
// never sees them.
//
// It imports llm and a JSON Schema library, nothing else of turnstile.
// Schemas may be written in JSON Schema drafts 4, 6, 7, 2019-09 or 2020-12
// (by their "$schema"; 2020-12 when absent). References to other documents
// are never fetched: a schema whose "$ref" leaves the document is rejected at
// [Wrap] time.
package argcheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/turnstile-dev/turnstile/llm"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// schemaURL names the schema document inside the compiler; it never leaves
// this package.
const schemaURL = "urn:turnstile:tool-arguments"

// maxIssues bounds how many schema violations one error result lists.
const maxIssues = 8

var printer = message.NewPrinter(language.English)

// Wrap returns a tool that behaves like t but first checks each call's
// arguments against t.Spec().Schema (an empty schema means
// {"type":"object"}). Arguments that are not one JSON object, or that the
// schema rejects, produce a [llm.ToolOutput] with IsError set and a
// message naming each failing property; t is not called. Wrap compiles the
// schema once and fails if it is not a valid JSON Schema.
//
// The returned tool is safe for concurrent use if t is.
func Wrap(t llm.Tool) (llm.Tool, error) {
	spec := t.Spec()
	sch, err := compile(spec.Schema)
	if err != nil {
		return nil, fmt.Errorf("argcheck: tool %q: %w", spec.Name, err)
	}
	return &checked{tool: t, name: spec.Name, schema: sch}, nil
}

// CheckSchema reports whether schema is a JSON Schema that [Wrap] accepts
// for a tool's arguments, under the same rules (drafts, no references
// outside the document); an empty schema is valid. The error says what is
// wrong without quoting the schema.
func CheckSchema(schema []byte) error {
	_, err := compile(schema)
	return err
}

// compile compiles a tool's input schema; empty means {"type":"object"}.
func compile(schema []byte) (*jsonschema.Schema, error) {
	raw := bytes.TrimSpace(schema)
	if len(raw) == 0 {
		raw = []byte(`{"type":"object"}`)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("input schema is not JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	// An empty loader map refuses every URL: a tool's schema comes from a
	// possibly untrusted server or client and must not make us read files
	// or fetch URLs. The drafts' meta-schemas are built in and still
	// resolve.
	c.UseLoader(jsonschema.SchemeURLLoader{})
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, err
	}
	sch, err := c.Compile(schemaURL)
	if err != nil {
		return nil, fmt.Errorf("invalid input schema: %w", err)
	}
	return sch, nil
}

// checked is a tool whose arguments are validated before it runs.
type checked struct {
	tool   llm.Tool
	name   string
	schema *jsonschema.Schema
}

// Spec returns the wrapped tool's spec unchanged.
func (c *checked) Spec() llm.ToolSpec { return c.tool.Spec() }

// Call validates call.Arguments and, if they pass, calls the wrapped tool.
func (c *checked) Call(ctx context.Context, call llm.ToolCall, progress func(llm.ToolProgress)) (llm.ToolOutput, error) {
	if msg := c.check(call.Arguments); msg != "" {
		return llm.ToolOutput{Content: msg, IsError: true}, nil
	}
	return c.tool.Call(ctx, call, progress)
}

// Timeout forwards the wrapped tool's own time limit, if it has one, so
// the runtime still sees it; zero means the runtime's default.
func (c *checked) Timeout() time.Duration {
	if t, ok := c.tool.(interface{ Timeout() time.Duration }); ok {
		return t.Timeout()
	}
	return 0
}

// check returns "" when args are valid, else the message for the model.
func (c *checked) check(args string) string {
	args = strings.TrimSpace(args)
	if args == "" {
		args = "{}"
	}
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(args))
	if err != nil {
		return fmt.Sprintf("Invalid arguments for tool %q: they are not valid JSON (%v). Send the arguments as a single JSON object.", c.name, err)
	}
	if _, ok := inst.(map[string]any); !ok {
		return fmt.Sprintf("Invalid arguments for tool %q: they must be a JSON object, not %s.", c.name, jsonKind(inst))
	}
	err = c.schema.Validate(inst)
	if err == nil {
		return ""
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return fmt.Sprintf("Invalid arguments for tool %q: %v", c.name, err)
	}
	issues := leafIssues(ve)
	var b strings.Builder
	fmt.Fprintf(&b, "Invalid arguments for tool %q; they do not match its input schema:", c.name)
	for i, s := range issues {
		if i == maxIssues {
			fmt.Fprintf(&b, "\n- and %d more", len(issues)-maxIssues)
			break
		}
		b.WriteString("\n- ")
		b.WriteString(s)
	}
	b.WriteString("\nFix the arguments and call the tool again.")
	return b.String()
}

// leafIssues flattens a validation error tree into one line per innermost
// failure, each naming the property it concerns.
func leafIssues(ve *jsonschema.ValidationError) []string {
	var out []string
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) > 0 {
			for _, cause := range e.Causes {
				walk(cause)
			}
			return
		}
		out = append(out, location(e.InstanceLocation)+": "+e.ErrorKind.LocalizedString(printer))
	}
	walk(ve)
	return slices.Compact(out)
}

// location names an instance location for the model: the arguments object
// itself, or a property path such as "items[2].name".
func location(path []string) string {
	if len(path) == 0 {
		return "arguments"
	}
	var b strings.Builder
	for i, tok := range path {
		if isIndex(tok) {
			fmt.Fprintf(&b, "[%s]", tok)
			continue
		}
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(tok)
	}
	return fmt.Sprintf("property %q", b.String())
}

func isIndex(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case string:
		return "a string"
	case []any:
		return "an array"
	default:
		return "a number"
	}
}
