package anthropic

import (
	"encoding/json"
	"fmt"

	"github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/packages/param"
	"github.com/turnstile-dev/turnstile/llm"
)

// setGenerationOptions maps the request's output schema, tool choice,
// reasoning and end user onto params:
//
//   - OutputSchema: the Messages API's own structured outputs,
//     output_config {format: {type: json_schema, schema}}, which the
//     pinned SDK has (no forced tool: the reply stays text, streamed as
//     text deltas, and tools stay usable). Its name and strict are not
//     sent: the API always constrains the reply to the schema;
//   - ToolChoice: {type: auto | none | any | tool, name} (required is
//     any);
//   - Reasoning: thinking {type: enabled, budget_tokens}, the budget or
//     the effort's ([llm.Reasoning.Budget]). The API wants max_tokens above
//     the budget: when it is not, max_tokens becomes budget + max_tokens,
//     so the answer keeps the room it was given. It takes no temperature
//     with thinking, so none is sent; and it refuses a forced tool (any or
//     tool) with thinking, so a call forcing a tool goes without thinking;
//   - EndUser: metadata.user_id.
func setGenerationOptions(params *anthropic.MessageNewParams, req *llm.Request) error {
	if s := req.OutputSchema; s != nil {
		var schema map[string]any
		if err := json.Unmarshal(s.Schema, &schema); err != nil || schema == nil {
			return fmt.Errorf("output schema is not a JSON object: %w", err)
		}
		params.OutputConfig = anthropic.OutputConfigParam{Format: anthropic.JSONOutputFormatParam{Schema: schema}}
	}
	forced := false
	if c := req.ToolChoice; c != nil && len(params.Tools) > 0 {
		switch c.Mode {
		case llm.ToolChoiceAuto:
			params.ToolChoice = anthropic.ToolChoiceUnionParam{OfAuto: &anthropic.ToolChoiceAutoParam{}}
		case llm.ToolChoiceNone:
			params.ToolChoice = anthropic.ToolChoiceUnionParam{OfNone: &anthropic.ToolChoiceNoneParam{}}
		case llm.ToolChoiceRequired:
			params.ToolChoice, forced = anthropic.ToolChoiceUnionParam{OfAny: &anthropic.ToolChoiceAnyParam{}}, true
		case llm.ToolChoiceTool:
			params.ToolChoice, forced = anthropic.ToolChoiceParamOfTool(c.Name), true
		}
	}
	if r := req.Reasoning; r != nil && !forced {
		if budget := int64(r.Budget()); budget > 0 {
			params.Thinking = anthropic.ThinkingConfigParamOfEnabled(budget)
			if params.MaxTokens <= budget {
				params.MaxTokens += budget
			}
			params.Temperature = param.Opt[float64]{}
		}
	}
	if req.EndUser != "" {
		params.Metadata = anthropic.MetadataParam{UserID: anthropic.String(req.EndUser)}
	}
	return nil
}
