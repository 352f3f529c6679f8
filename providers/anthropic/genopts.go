package anthropic

import (
	"encoding/json"
	"fmt"

	"github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/packages/param"
	"github.com/turnstile-dev/turnstile/llm"
)

// setGenerationOptions maps the request's output schema, tool choice,
// reasoning, sampling options and end user onto params, by what the model
// takes (its [llm.Capabilities]):
//
//   - OutputSchema: the Messages API's own structured outputs,
//     output_config {format: {type: json_schema, schema}} (no forced tool:
//     the reply stays text, streamed as text deltas, and tools stay
//     usable). The schema is first converted by the SDK's own converter
//     to the subset the API takes (unsupported keywords such as minLength
//     move into the description, every object gets additionalProperties
//     false); the server still validates the reply against the schema as
//     given. Its name and strict are not sent: the API always constrains
//     the reply to the schema;
//   - ToolChoice: {type: auto | none | any | tool, name} (required is
//     any);
//   - Reasoning, on a model that reasons: for adaptive thinking (Claude
//     4.6 and later), thinking {type: adaptive, display: summarized} (the
//     thinking is streamed, which Opus 4.7 and later omit by default) and
//     output_config.effort, the effort asked or the one its budget stands
//     for ([llm.Reasoning.Level]); for budget thinking, thinking {type:
//     enabled, budget_tokens}, the budget or the effort's
//     ([llm.Reasoning.Budget]), and as the API wants max_tokens above the
//     budget, max_tokens becomes budget + max_tokens when it is not, so
//     the answer keeps the room it was given. The API refuses a forced
//     tool (any or tool) with thinking, so a call forcing a tool goes
//     without thinking;
//   - Temperature and TopP: not sent on a call that thinks (the API takes
//     neither with thinking), nor to a model that takes neither (Claude
//     Opus 4.7 and later);
//   - EndUser: metadata.user_id.
func setGenerationOptions(params *anthropic.MessageNewParams, req *llm.Request) error {
	caps := capabilitiesOf(req)
	if s := req.OutputSchema; s != nil {
		var schema map[string]any
		if err := json.Unmarshal(s.Schema, &schema); err != nil || schema == nil {
			return fmt.Errorf("output schema is not a JSON object: %w", err)
		}
		if converted, ok := anthropic.BetaJSONSchemaOutputFormat(schema).Schema.(map[string]any); ok && converted != nil {
			schema = converted
		}
		params.OutputConfig.Format = anthropic.JSONOutputFormatParam{Schema: schema}
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
	thinks := false
	if r := req.Reasoning; r != nil && !forced && caps.Thinking != llm.ThinkingNone {
		switch budget := int64(r.Budget()); {
		case budget <= 0:
		case caps.Thinking == llm.ThinkingAdaptive:
			params.Thinking = anthropic.ThinkingConfigParamUnion{OfAdaptive: &anthropic.ThinkingConfigAdaptiveParam{
				Display: anthropic.ThinkingConfigAdaptiveDisplaySummarized,
			}}
			params.OutputConfig.Effort = anthropic.OutputConfigEffort(r.Level().String())
			thinks = true
		default:
			params.Thinking = anthropic.ThinkingConfigParamOfEnabled(budget)
			if params.MaxTokens <= budget {
				params.MaxTokens += budget
			}
			thinks = true
		}
	}
	if thinks || !caps.SendsSampling(false) {
		params.Temperature, params.TopP = param.Opt[float64]{}, param.Opt[float64]{}
	}
	if req.EndUser != "" {
		params.Metadata = anthropic.MetadataParam{UserID: anthropic.String(req.EndUser)}
	}
	return nil
}
