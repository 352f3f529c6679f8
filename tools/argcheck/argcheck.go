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
//
// What a schema may cost is bounded: its JSON is held to [MaxDepth],
// [MaxNodes] and [MaxRefs] before the library compiles it, the compiled
// schema to [MaxBranches], and a value whose check would take more than
// [MaxSteps] is refused before it is checked. The library compiles at a
// cost that grows with the cube of a schema's depth, and checks a value
// against every path through anyOf, oneOf and $ref, keeping the error of
// each: without the bounds, a 1.7 KB schema made one check of the reply
// "7" cost 2^21 paths and the process its memory.
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
// schema rejects, or that cost more than [MaxSteps] to check, produce a
// [llm.ToolOutput] with IsError set and a message naming each failing
// property; t is not called. Wrap compiles the schema once and fails if
// it is not a valid JSON Schema or is past this package's bounds
// ([MaxDepth], [MaxNodes], [MaxRefs], [MaxBranches]).
//
// The returned tool is safe for concurrent use if t is.
func Wrap(t llm.Tool) (llm.Tool, error) {
	spec := t.Spec()
	sch, err := compile(spec.Schema, inputSchema)
	if err != nil {
		return nil, fmt.Errorf("argcheck: tool %q: %w", spec.Name, err)
	}
	return &checked{tool: t, name: spec.Name, schema: sch}, nil
}

// CheckSchemas checks the input schemas of one request's tools: each must
// be a JSON Schema that [Wrap] accepts for a tool's arguments, under the
// same rules (drafts, no references outside the document, the bounds;
// empty is valid), and together they may hold at most [MaxRequestNodes]
// JSON objects, arrays and booleans. It returns one error per schema, nil
// for each that passes; an error says what is wrong without quoting the
// schema, and is a *[LimitError] for a schema past a bound, which is found
// before the schema is compiled. Once ctx is done, the schemas not checked
// yet get its error: no compile outlives the request by more than the one
// under way.
func CheckSchemas(ctx context.Context, schemas [][]byte) []error {
	errs := make([]error, len(schemas))
	total := 0
	for i, schema := range schemas {
		if err := ctx.Err(); err != nil {
			errs[i] = err
			continue
		}
		p, err := parse(schema, inputSchema)
		if err != nil {
			errs[i] = err
			continue
		}
		if total += p.nodes; total > MaxRequestNodes {
			errs[i] = fmt.Errorf("%s too complex: %w", inputSchema, &LimitError{
				What: "JSON objects, arrays and booleans in the input schemas of one request's tools together", Max: MaxRequestNodes,
			})
			continue
		}
		_, errs[i] = p.compile(inputSchema)
	}
	return errs
}

// What a schema is, in errors.
const (
	inputSchema  = "input schema"
	outputSchema = "output schema"
)

// compiled is a schema ready to check values against.
type compiled struct {
	schema *jsonschema.Schema
	plan   *plan
}

// compile compiles a schema; what names it in errors.
func compile(schema []byte, what string) (*compiled, error) {
	p, err := parse(schema, what)
	if err != nil {
		return nil, err
	}
	return p.compile(what)
}

// parsed is a schema's JSON, decoded and within MaxDepth, MaxNodes and
// MaxRefs.
type parsed struct {
	doc   any
	nodes int
}

// parse decodes a schema and checks it against the bounds that come
// before the library's work, whose cost they bound; what names it in
// errors. Empty means {"type":"object"}.
func parse(schema []byte, what string) (parsed, error) {
	raw := bytes.TrimSpace(schema)
	if len(raw) == 0 {
		raw = []byte(`{"type":"object"}`)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return parsed{}, fmt.Errorf("%s is not JSON: %w", what, err)
	}
	nodes, err := measure(doc)
	if err != nil {
		return parsed{}, fmt.Errorf("%s too complex: %w", what, err)
	}
	return parsed{doc: doc, nodes: nodes}, nil
}

// compile compiles p and plans the checks against it; what names it in
// errors.
func (p parsed) compile(what string) (*compiled, error) {
	c := jsonschema.NewCompiler()
	// An empty loader map refuses every URL: a tool's schema comes from a
	// possibly untrusted server or client and must not make us read files
	// or fetch URLs. The drafts' meta-schemas are built in and still
	// resolve.
	c.UseLoader(jsonschema.SchemeURLLoader{})
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource(schemaURL, p.doc); err != nil {
		return nil, fmt.Errorf("invalid %s: %w", what, err)
	}
	sch, err := c.Compile(schemaURL)
	if err != nil {
		return nil, fmt.Errorf("invalid %s: %w", what, err)
	}
	pl, err := newPlan(sch)
	var limit *LimitError
	switch {
	case errors.As(err, &limit):
		return nil, fmt.Errorf("%s too complex: %w", what, err)
	case err != nil:
		return nil, fmt.Errorf("invalid %s: %w", what, err)
	}
	return &compiled{schema: sch, plan: pl}, nil
}

// validate checks inst: nil when the schema accepts it, a
// *jsonschema.ValidationError when it does not, and a *[LimitError] when
// checking it would take more than [MaxSteps], counted before the check.
func (c *compiled) validate(inst any) error {
	if _, ok := c.plan.cost(inst, MaxSteps); !ok {
		return &LimitError{What: "steps of checking (evaluations of a subschema against a part of the value)", Max: MaxSteps}
	}
	return c.schema.Validate(inst)
}

// checked is a tool whose arguments are validated before it runs.
type checked struct {
	tool   llm.Tool
	name   string
	schema *compiled
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
	err = c.schema.validate(inst)
	if err == nil {
		return ""
	}
	var limit *LimitError
	if errors.As(err, &limit) {
		return fmt.Sprintf("Invalid arguments for tool %q: they are too costly to check against its input schema (%v). Send simpler arguments.", c.name, err)
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
