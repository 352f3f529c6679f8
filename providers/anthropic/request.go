package anthropic

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"

	"github.com/anthropics/anthropic-sdk-go"
	"github.com/turnstile-dev/turnstile/llm"
)

// buildParams maps req to the Messages request. It fails only on a request
// the API could not accept, such as a tool schema that is not a JSON object.
func buildParams(req *llm.Request) (anthropic.MessageNewParams, error) {
	maxTokens := int64(DefaultMaxTokens)
	if req.MaxOutputTokens > 0 {
		maxTokens = int64(req.MaxOutputTokens)
	}
	params := anthropic.MessageNewParams{
		Model:         anthropic.Model(req.Model),
		MaxTokens:     maxTokens,
		StopSequences: req.StopSequences,
	}
	if req.Temperature != nil {
		params.Temperature = anthropic.Float(*req.Temperature)
	}
	if req.TopP != nil {
		params.TopP = anthropic.Float(*req.TopP)
	}
	if req.System != "" {
		params.System = []anthropic.TextBlockParam{{Text: req.System}}
	}
	for i, m := range req.Messages {
		role, blocks, err := turn(m)
		if err != nil {
			return params, fmt.Errorf("message %d: %w", i, err)
		}
		if len(blocks) == 0 {
			continue
		}
		// The API wants turns to alternate: merge a turn into the last one
		// of the same role (tool results follow user text, for example).
		if n := len(params.Messages); n > 0 && params.Messages[n-1].Role == role {
			params.Messages[n-1].Content = append(params.Messages[n-1].Content, blocks...)
			continue
		}
		params.Messages = append(params.Messages, anthropic.MessageParam{Role: role, Content: blocks})
	}
	for _, t := range req.Tools {
		tool, err := toolParam(t)
		if err != nil {
			return params, err
		}
		params.Tools = append(params.Tools, anthropic.ToolUnionParam{OfTool: tool})
	}
	if err := setGenerationOptions(&params, req); err != nil {
		return params, err
	}
	if req.CachePrompt {
		setCacheBreakpoints(&params)
	}
	return params, nil
}

// turn maps one message to a role and its content blocks. Empty text is
// dropped (the API rejects it), as is thinking without a signature.
func turn(m llm.Message) (anthropic.MessageParamRole, []anthropic.ContentBlockParamUnion, error) {
	var role anthropic.MessageParamRole
	switch m.Role {
	case llm.RoleUser, llm.RoleTool:
		role = anthropic.MessageParamRoleUser
	case llm.RoleAssistant:
		role = anthropic.MessageParamRoleAssistant
	default:
		return "", nil, fmt.Errorf("unknown role %v", m.Role)
	}
	var blocks []anthropic.ContentBlockParamUnion
	for _, p := range m.Parts {
		switch p.Kind {
		case llm.PartText:
			if p.Text != "" {
				blocks = append(blocks, anthropic.NewTextBlock(p.Text))
			}
		case llm.PartThinking:
			if p.Signature != "" && m.Role == llm.RoleAssistant {
				blocks = append(blocks, anthropic.NewThinkingBlock(p.Signature, p.Text))
			}
		case llm.PartToolCall:
			if p.ToolCall == nil {
				return "", nil, errors.New("tool call part without a call")
			}
			args := p.ToolCall.Arguments
			if args == "" {
				args = "{}"
			}
			if !json.Valid([]byte(args)) {
				return "", nil, fmt.Errorf("tool call %q: arguments are not JSON", p.ToolCall.Name)
			}
			blocks = append(blocks, anthropic.NewToolUseBlock(p.ToolCall.ID, json.RawMessage(args), p.ToolCall.Name))
		case llm.PartToolResult:
			r := p.ToolResult
			if r == nil {
				return "", nil, errors.New("tool result part without a result")
			}
			b, err := toolResultBlock(r)
			if err != nil {
				return "", nil, err
			}
			blocks = append(blocks, b)
		case llm.PartMedia:
			if p.Media == nil || m.Role != llm.RoleUser {
				return "", nil, errors.New("media part outside a user message")
			}
			b, err := mediaBlock(p.Media)
			if err != nil {
				return "", nil, err
			}
			blocks = append(blocks, b)
		default:
			return "", nil, fmt.Errorf("unknown part kind %d", p.Kind)
		}
	}
	return role, blocks, nil
}

// toolParam maps a tool spec; the schema's properties and required go to
// their fields, any other keyword rides along as is.
func toolParam(t llm.ToolSpec) (*anthropic.ToolParam, error) {
	schema := map[string]any{}
	if len(t.Schema) > 0 {
		if err := json.Unmarshal(t.Schema, &schema); err != nil {
			return nil, fmt.Errorf("tool %q: schema is not a JSON object: %w", t.Name, err)
		}
		if schema == nil {
			return nil, fmt.Errorf("tool %q: schema is null, not a JSON object", t.Name)
		}
	}
	in := anthropic.ToolInputSchemaParam{ExtraFields: map[string]any{}}
	maps.Copy(in.ExtraFields, schema)
	delete(in.ExtraFields, "type")
	if props, ok := schema["properties"]; ok {
		in.Properties = props
		delete(in.ExtraFields, "properties")
	}
	if req, ok := schema["required"].([]any); ok {
		for _, r := range req {
			if s, ok := r.(string); ok {
				in.Required = append(in.Required, s)
			}
		}
		delete(in.ExtraFields, "required")
	}
	tool := &anthropic.ToolParam{Name: t.Name, InputSchema: in}
	if t.Description != "" {
		tool.Description = anthropic.String(t.Description)
	}
	return tool, nil
}
