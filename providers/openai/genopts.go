package openai

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/shared"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/capability"
)

// setGenerationOptions maps the request's output schema, tool choice,
// reasoning, sampling options and end user onto params, by what the model
// takes (its [llm.Capabilities]):
//
//   - OutputSchema: response_format {type: json_schema, json_schema: {name,
//     strict, schema}}; strict is sent true only when asked and the schema
//     is in OpenAI's strict subset ([strictable]), else false;
//   - ToolChoice: "auto", "none", "required" or {type: function,
//     function: {name}};
//   - Reasoning: reasoning_effort, its effort, or the effort its budget
//     stands for ([llm.Reasoning.Level]); not sent to a model that does
//     not reason (the GPT-4 family refuses it);
//   - Temperature and TopP: not sent to a model that refuses them while
//     it reasons (the o-series and GPT-5 always reason; GPT-5.1 and later
//     when reasoning_effort is sent);
//   - EndUser: safety_identifier (user is deprecated for it).
func setGenerationOptions(params *openai.ChatCompletionNewParams, req *llm.Request) error {
	if s := req.OutputSchema; s != nil {
		var schema map[string]any
		if err := json.Unmarshal(s.Schema, &schema); err != nil || schema == nil {
			return fmt.Errorf("output schema is not a JSON object: %w", err)
		}
		params.ResponseFormat = openai.ChatCompletionNewParamsResponseFormatUnion{
			OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{
				Name: s.Name, Strict: param.NewOpt(s.Strict && strictable(schema)), Schema: schema,
			}},
		}
	}
	if c := req.ToolChoice; c != nil && len(params.Tools) > 0 {
		switch c.Mode {
		case llm.ToolChoiceAuto, llm.ToolChoiceNone, llm.ToolChoiceRequired:
			params.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: param.NewOpt(c.Mode.String())}
		case llm.ToolChoiceTool:
			params.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{
				OfFunctionToolChoice: &openai.ChatCompletionNamedToolChoiceParam{Function: openai.ChatCompletionNamedToolChoiceFunctionParam{Name: c.Name}},
			}
		}
	}
	caps := capabilitiesOf(req)
	if r := req.Reasoning; r != nil && caps.Thinking != llm.ThinkingNone {
		if e := r.Level(); e != llm.EffortUnspecified {
			params.ReasoningEffort = shared.ReasoningEffort(e.String())
		}
	}
	if !caps.SendsSampling(params.ReasoningEffort != "") {
		params.Temperature, params.TopP = param.Opt[float64]{}, param.Opt[float64]{}
	}
	if req.EndUser != "" {
		params.SafetyIdentifier = param.NewOpt(req.EndUser)
	}
	return nil
}

// capabilitiesOf returns what req's model takes: as the runtime resolved
// it, else from the table.
func capabilitiesOf(req *llm.Request) llm.Capabilities {
	if req.Capabilities != nil {
		return *req.Capabilities
	}
	return capability.Lookup(capability.OpenAI, req.Model).Capabilities
}

// strictKeywords are the keywords a schema in OpenAI's strict subset may
// use; any other makes the request's strict false.
var strictKeywords = []string{
	"type", "properties", "required", "additionalProperties", "items", "anyOf", "enum", "const",
	"description", "title", "$defs", "definitions", "$ref", "$schema", "$id", "default",
	"pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
	"minItems", "maxItems",
}

// strictable reports whether schema is in OpenAI's strict subset of JSON
// Schema: the root is an object, every object lists all its properties
// as required and sets additionalProperties false, and only the keywords
// of strictKeywords are used.
func strictable(schema map[string]any) bool {
	return schema["type"] == "object" && strictNode(schema)
}

func strictNode(node map[string]any) bool {
	for k := range node {
		if !slices.Contains(strictKeywords, k) {
			return false
		}
	}
	props, _ := node["properties"].(map[string]any)
	if node["type"] == "object" || props != nil {
		if node["additionalProperties"] != false {
			return false
		}
		required, _ := node["required"].([]any)
		if len(required) != len(props) {
			return false
		}
		for _, r := range required {
			name, _ := r.(string)
			if _, ok := props[name]; !ok {
				return false
			}
		}
	}
	sub := func(v any) bool {
		m, ok := v.(map[string]any)
		return ok && strictNode(m)
	}
	for _, p := range props {
		if !sub(p) {
			return false
		}
	}
	for _, key := range []string{"$defs", "definitions"} {
		if defs, ok := node[key]; ok {
			m, ok := defs.(map[string]any)
			if !ok {
				return false
			}
			for _, d := range m {
				if !sub(d) {
					return false
				}
			}
		}
	}
	if items, ok := node["items"]; ok && !sub(items) {
		return false
	}
	if anyOf, ok := node["anyOf"]; ok {
		list, ok := anyOf.([]any)
		if !ok {
			return false
		}
		for _, s := range list {
			if !sub(s) {
				return false
			}
		}
	}
	return true
}
