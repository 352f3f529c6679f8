package argcheck

import (
	"errors"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// OutputSchemas compiles the JSON Schemas that a turn's final reply must
// match (a request's output schema), under the rules of tool schemas:
// drafts 4 to 2020-12, no references outside the document, the bounds
// ([MaxDepth], [MaxNodes], [MaxRefs], [MaxBranches]). Unlike a tool's
// schema it may describe any JSON value, not only an object. Its zero
// value is ready to use.
type OutputSchemas struct{}

// Compile compiles schema and returns the check of a reply's text: the
// text must be one JSON value (surrounding white space allowed) that the
// schema accepts. The check lists each problem, naming the property it
// concerns, and none when the text matches; a text that would cost more
// than [MaxSteps] to check is not checked, and gets one problem saying so.
// It is safe for concurrent use. An empty schema is refused.
func (OutputSchemas) Compile(schema []byte) (func(text string) []string, error) {
	if len(strings.TrimSpace(string(schema))) == 0 {
		return nil, errors.New("the schema is empty")
	}
	sch, err := compile(schema, outputSchema)
	if err != nil {
		return nil, err
	}
	return func(text string) []string {
		inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
		if err != nil {
			return []string{fmt.Sprintf("the reply is not one JSON value (%v)", err)}
		}
		err = sch.validate(inst)
		if err == nil {
			return nil
		}
		var limit *LimitError
		if errors.As(err, &limit) {
			return []string{fmt.Sprintf("the reply is too costly to check against the output schema (%v)", err)}
		}
		var ve *jsonschema.ValidationError
		if !errors.As(err, &ve) {
			return []string{err.Error()}
		}
		out := leafIssues(ve)
		for i, s := range out {
			if rest, ok := strings.CutPrefix(s, "arguments:"); ok {
				out[i] = "the reply:" + rest
			}
		}
		return out
	}, nil
}
