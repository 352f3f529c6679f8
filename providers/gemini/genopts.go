package gemini

import (
	"encoding/json"
	"fmt"

	"github.com/turnstile-dev/turnstile/llm"
	"google.golang.org/genai"
)

// setGenerationOptions maps the request's output schema, tool choice and
// reasoning onto config:
//
//   - OutputSchema: responseMimeType application/json and
//     responseJsonSchema (the JSON Schema as it is; responseSchema takes
//     only OpenAPI's subset). Name and strict are not sent;
//   - ToolChoice: toolConfig.functionCallingConfig, mode AUTO, NONE or ANY
//     (required), or ANY with allowedFunctionNames [name];
//   - Reasoning: thinkingConfig {thinkingBudget, includeThoughts: true},
//     the budget or the effort's ([llm.Reasoning.Budget]): Gemini 2.5
//     takes only a budget, and Gemini 3 takes one too (thinkingLevel is
//     not sent with it, which the API refuses).
//
// The end user is not sent: the Gemini API has no such field, and labels
// exist only on Vertex AI.
func setGenerationOptions(config *genai.GenerateContentConfig, req *llm.Request) error {
	if s := req.OutputSchema; s != nil {
		var schema map[string]any
		if err := json.Unmarshal(s.Schema, &schema); err != nil || schema == nil {
			return fmt.Errorf("output schema is not a JSON object: %w", err)
		}
		config.ResponseMIMEType = "application/json"
		config.ResponseJsonSchema = schema
	}
	if c := req.ToolChoice; c != nil && len(config.Tools) > 0 {
		fc := &genai.FunctionCallingConfig{}
		switch c.Mode {
		case llm.ToolChoiceAuto:
			fc.Mode = genai.FunctionCallingConfigModeAuto
		case llm.ToolChoiceNone:
			fc.Mode = genai.FunctionCallingConfigModeNone
		case llm.ToolChoiceRequired:
			fc.Mode = genai.FunctionCallingConfigModeAny
		case llm.ToolChoiceTool:
			fc.Mode, fc.AllowedFunctionNames = genai.FunctionCallingConfigModeAny, []string{c.Name}
		}
		config.ToolConfig = &genai.ToolConfig{FunctionCallingConfig: fc}
	}
	if r := req.Reasoning; r != nil {
		if budget := r.Budget(); budget > 0 {
			config.ThinkingConfig = &genai.ThinkingConfig{IncludeThoughts: true, ThinkingBudget: genai.Ptr(int32(min(budget, 1<<31-1)))}
		}
	}
	return nil
}
