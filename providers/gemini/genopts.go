package gemini

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/capability"
	"google.golang.org/genai"
)

// answerFunction is the name of the function a call asks its output
// schema through, when the model refuses a JSON response type beside
// function calling; a tool of that name makes it answerFunction_2, and so
// on.
const answerFunction = "respond"

// answerDescription tells the model what the answer function is for.
const answerDescription = "Give your final answer by calling this function with it as the arguments, once no other function is needed."

// answer is how a call that asks for its output schema through a function
// gets its answer back: the function's name ("" when the call does not),
// and whether the schema was wrapped in an object's "response" property
// (a function's parameters are an object).
type answer struct {
	function string
	wrapped  bool
}

// setGenerationOptions maps the request's output schema, tool choice and
// reasoning onto config, by what the model takes (its
// [llm.Capabilities]), and returns how the answer comes back:
//
//   - OutputSchema: responseMimeType application/json and
//     responseJsonSchema (the JSON Schema as it is; responseSchema takes
//     only OpenAPI's subset), when the call offers no tools or the model
//     takes both (Gemini 3). Gemini 2.5 and earlier refuse function
//     calling with a JSON response type, so a call offering tools asks for
//     the schema as one more function, "respond", whose parameters are the
//     schema (wrapped as the "response" property of an object when it is
//     not an object schema), with functionCallingConfig mode ANY: the
//     model calls a tool, or answers through respond, whose arguments the
//     reply's text then is. A call whose tool choice forces a tool is not
//     a final answer and is sent no schema. Name and strict are not sent;
//   - ToolChoice: toolConfig.functionCallingConfig, mode AUTO, NONE or ANY
//     (required), or ANY with allowedFunctionNames [name]; with the
//     respond function, auto is ANY and none is ANY with respond alone;
//   - Reasoning, on a model that reasons: thinkingConfig {thinkingBudget,
//     includeThoughts: true}, the budget or the effort's
//     ([llm.Reasoning.Budget]): Gemini 2.5 takes only a budget, and Gemini
//     3 takes one too (thinkingLevel is not sent with it, which the API
//     refuses); a model configured for adaptive thinking gets
//     thinkingLevel, the effort ([llm.Reasoning.Level]), instead.
//
// The end user is not sent: the Gemini API has no such field, and labels
// exist only on Vertex AI.
func setGenerationOptions(config *genai.GenerateContentConfig, req *llm.Request) (answer, error) {
	caps := capabilitiesOf(req)
	var ans answer
	if s := req.OutputSchema; s != nil {
		var schema map[string]any
		if err := json.Unmarshal(s.Schema, &schema); err != nil || schema == nil {
			return answer{}, fmt.Errorf("output schema is not a JSON object: %w", err)
		}
		c := req.ToolChoice
		switch {
		case len(config.Tools) == 0 || caps.SchemaWithTools:
			config.ResponseMIMEType = "application/json"
			config.ResponseJsonSchema = schema
		case c == nil || c.Mode == llm.ToolChoiceAuto || c.Mode == llm.ToolChoiceNone:
			ans = addAnswerFunction(config.Tools[0], schema)
		}
	}
	if c := req.ToolChoice; (c != nil || ans.function != "") && len(config.Tools) > 0 {
		fc := &genai.FunctionCallingConfig{}
		switch {
		case ans.function != "" && c != nil && c.Mode == llm.ToolChoiceNone:
			fc.Mode, fc.AllowedFunctionNames = genai.FunctionCallingConfigModeAny, []string{ans.function}
		case ans.function != "":
			fc.Mode = genai.FunctionCallingConfigModeAny
		case c.Mode == llm.ToolChoiceAuto:
			fc.Mode = genai.FunctionCallingConfigModeAuto
		case c.Mode == llm.ToolChoiceNone:
			fc.Mode = genai.FunctionCallingConfigModeNone
		case c.Mode == llm.ToolChoiceRequired:
			fc.Mode = genai.FunctionCallingConfigModeAny
		case c.Mode == llm.ToolChoiceTool:
			fc.Mode, fc.AllowedFunctionNames = genai.FunctionCallingConfigModeAny, []string{c.Name}
		}
		config.ToolConfig = &genai.ToolConfig{FunctionCallingConfig: fc}
	}
	if r := req.Reasoning; r != nil && caps.Thinking != llm.ThinkingNone {
		switch budget := r.Budget(); {
		case budget <= 0:
		case caps.Thinking == llm.ThinkingAdaptive:
			levels := map[llm.Effort]genai.ThinkingLevel{llm.EffortLow: genai.ThinkingLevelLow, llm.EffortMedium: genai.ThinkingLevelMedium, llm.EffortHigh: genai.ThinkingLevelHigh}
			config.ThinkingConfig = &genai.ThinkingConfig{IncludeThoughts: true, ThinkingLevel: levels[r.Level()]}
		default:
			config.ThinkingConfig = &genai.ThinkingConfig{IncludeThoughts: true, ThinkingBudget: genai.Ptr(int32(min(budget, 1<<31-1)))}
		}
	}
	return ans, nil
}

// addAnswerFunction declares the function the model answers through with
// schema as its parameters, named so no tool of t has its name, and
// returns how its answer comes back.
func addAnswerFunction(t *genai.Tool, schema map[string]any) answer {
	taken := func(name string) bool {
		return slices.ContainsFunc(t.FunctionDeclarations, func(d *genai.FunctionDeclaration) bool { return d.Name == name })
	}
	ans := answer{function: answerFunction}
	for i := 2; taken(ans.function); i++ {
		ans.function = answerFunction + "_" + strconv.Itoa(i)
	}
	if schema["type"] != "object" {
		schema = map[string]any{"type": "object", "properties": map[string]any{"response": schema}, "required": []any{"response"}}
		ans.wrapped = true
	}
	t.FunctionDeclarations = append(t.FunctionDeclarations, &genai.FunctionDeclaration{
		Name: ans.function, Description: answerDescription, ParametersJsonSchema: schema,
	})
	return ans
}

// capabilitiesOf returns what req's model takes: as the runtime resolved
// it, else from the table.
func capabilitiesOf(req *llm.Request) llm.Capabilities {
	if req.Capabilities != nil {
		return *req.Capabilities
	}
	return capability.Lookup(capability.Gemini, req.Model).Capabilities
}
