package wire

import (
	"fmt"
	"regexp"
	"slices"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// Bounds of the generation options and metadata of a request.
const (
	maxOutputSchemaBytes = 64 << 10
	maxMetadataEntries   = 16
	maxMetadataKeyBytes  = 64
	maxMetadataValue     = 256
	maxEndUserBytes      = 64 // OpenAI's limit of safety_identifier
	defaultSchemaName    = "output"
)

var metadataKeyRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// signerRE is what a thinking part's signer may be: an API's name, or
// empty.
var signerRE = regexp.MustCompile(`^[A-Za-z0-9_-]{0,32}$`)

// toGenerationOptions checks and converts the top_p, output schema, tool
// choice and reasoning of g into tr. Whether the schema compiles, the tool
// is offered and the model takes the options is the runner's to check
// ([runtime.Runner.Validate]).
func toGenerationOptions(bad *violations, g *turnstilev1.GenerationOptions, tr *runtime.TurnRequest) {
	if g.TopP != nil {
		p := g.GetTopP()
		// NaN fails every comparison: test for the valid range.
		if !(p >= 0 && p <= 1) {
			bad.add("generation.top_p", "must be a number from 0 to 1")
		}
		tr.TopP = &p
	}
	if s := g.GetOutputSchema(); s != nil {
		out := &llm.OutputSchema{Name: s.GetName(), Strict: s.GetStrict()}
		switch {
		case out.Name == "":
			out.Name = defaultSchemaName
		case !toolNameRE.MatchString(out.Name):
			bad.add("generation.output_schema.name", "must be 1 to 64 letters, digits, '_' or '-'")
		}
		if s.GetSchema() == nil {
			bad.add("generation.output_schema.schema", "is required")
		} else {
			b, err := protojson.Marshal(s.GetSchema())
			switch {
			case err != nil:
				bad.add("generation.output_schema.schema", "cannot be encoded as JSON: %s", clip(err.Error(), 200))
			case len(b) > maxOutputSchemaBytes:
				bad.add("generation.output_schema.schema", "must be at most %d bytes as JSON", maxOutputSchemaBytes)
			default:
				out.Schema = b
			}
		}
		tr.OutputSchema = out
	}
	if c := g.GetToolChoice(); c != nil {
		tc := &llm.ToolChoice{Name: c.GetToolName()}
		switch c.GetMode() {
		case turnstilev1.ToolChoiceMode_TOOL_CHOICE_MODE_AUTO:
			tc.Mode = llm.ToolChoiceAuto
		case turnstilev1.ToolChoiceMode_TOOL_CHOICE_MODE_NONE:
			tc.Mode = llm.ToolChoiceNone
		case turnstilev1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED:
			tc.Mode = llm.ToolChoiceRequired
		case turnstilev1.ToolChoiceMode_TOOL_CHOICE_MODE_TOOL:
			tc.Mode = llm.ToolChoiceTool
		default:
			bad.add("generation.tool_choice.mode", "must be TOOL_CHOICE_MODE_AUTO, _NONE, _REQUIRED or _TOOL")
		}
		switch {
		case tc.Mode == llm.ToolChoiceTool && tc.Name == "":
			bad.add("generation.tool_choice.tool_name", "is required with TOOL_CHOICE_MODE_TOOL")
		case tc.Mode == llm.ToolChoiceTool && !toolNameRE.MatchString(tc.Name):
			bad.add("generation.tool_choice.tool_name", "must be 1 to %d letters, digits, '_' or '-'", maxToolNameLength)
		case tc.Mode != llm.ToolChoiceTool && tc.Name != "":
			bad.add("generation.tool_choice.tool_name", "must be empty unless mode is TOOL_CHOICE_MODE_TOOL")
		}
		tr.ToolChoice = tc
	}
	if r := g.GetReasoning(); r != nil {
		rs := &llm.Reasoning{}
		switch r.GetEffort() {
		case turnstilev1.ReasoningEffort_REASONING_EFFORT_UNSPECIFIED:
		case turnstilev1.ReasoningEffort_REASONING_EFFORT_LOW:
			rs.Effort = llm.EffortLow
		case turnstilev1.ReasoningEffort_REASONING_EFFORT_MEDIUM:
			rs.Effort = llm.EffortMedium
		case turnstilev1.ReasoningEffort_REASONING_EFFORT_HIGH:
			rs.Effort = llm.EffortHigh
		default:
			bad.add("generation.reasoning.effort", "must be REASONING_EFFORT_LOW, _MEDIUM or _HIGH")
		}
		if r.BudgetTokens != nil {
			if n := r.GetBudgetTokens(); n < llm.MinBudgetTokens || n > llm.MaxBudgetTokens {
				bad.add("generation.reasoning.budget_tokens", "must be from %d to %d", llm.MinBudgetTokens, llm.MaxBudgetTokens)
			}
			rs.BudgetTokens = int(r.GetBudgetTokens())
		}
		if rs.Effort == llm.EffortUnspecified && rs.BudgetTokens == 0 && r.BudgetTokens == nil {
			bad.add("generation.reasoning", "must set effort or budget_tokens")
		}
		tr.Reasoning = rs
	}
}

// toMetadata checks the request's metadata and returns it; nil when empty.
// Problems name the key (never the value, which is user data).
func toMetadata(bad *violations, md map[string]string) map[string]string {
	if len(md) == 0 {
		return nil
	}
	if len(md) > maxMetadataEntries {
		bad.add("metadata", "at most %d entries are allowed, got %d", maxMetadataEntries, len(md))
		return nil
	}
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	slices.Sort(keys) // problems in a stable order
	for _, k := range keys {
		v := md[k]
		if !metadataKeyRE.MatchString(k) {
			bad.add("metadata", "key %.64q must be 1 to %d letters, digits, '_', '-' or '.'", k, maxMetadataKeyBytes)
			continue
		}
		field := fmt.Sprintf("metadata[%s]", k)
		switch {
		case !utf8.ValidString(v):
			bad.add(field, "must be valid UTF-8")
		case len(v) > maxMetadataValue:
			bad.add(field, "must be at most %d bytes", maxMetadataValue)
		case k == runtime.MetadataEndUser && len(v) > maxEndUserBytes:
			bad.add(field, "must be at most %d bytes (a stable hash of the user is best)", maxEndUserBytes)
		}
	}
	return md
}
