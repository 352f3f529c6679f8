package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/shared"
	"github.com/turnstile-dev/turnstile/llm"
)

// buildParams maps req to the chat completion request. It fails only on a
// request no server could accept, such as a tool schema that is not JSON.
func buildParams(req *llm.Request) (openai.ChatCompletionNewParams, error) {
	params := openai.ChatCompletionNewParams{
		Model: req.Model,
		// Ask for the usage chunk that follows the finish reason.
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: param.NewOpt(true)},
	}
	if req.System != "" {
		params.Messages = append(params.Messages, openai.SystemMessage(req.System))
	}
	for i, m := range req.Messages {
		msgs, err := messages(m)
		if err != nil {
			return params, fmt.Errorf("message %d: %w", i, err)
		}
		params.Messages = append(params.Messages, msgs...)
	}
	for _, t := range req.Tools {
		schema := shared.FunctionParameters{"type": "object"}
		if len(t.Schema) > 0 {
			schema = shared.FunctionParameters{}
			if err := json.Unmarshal(t.Schema, &schema); err != nil {
				return params, fmt.Errorf("tool %q: schema is not a JSON object: %w", t.Name, err)
			}
		}
		def := shared.FunctionDefinitionParam{Name: t.Name, Parameters: schema}
		if t.Description != "" {
			def.Description = param.NewOpt(t.Description)
		}
		params.Tools = append(params.Tools, openai.ChatCompletionFunctionTool(def))
	}
	if req.MaxOutputTokens > 0 {
		params.MaxCompletionTokens = param.NewOpt(int64(req.MaxOutputTokens))
	}
	if req.Temperature != nil {
		params.Temperature = param.NewOpt(*req.Temperature)
	}
	if req.TopP != nil {
		params.TopP = param.NewOpt(*req.TopP)
	}
	if len(req.StopSequences) > 0 {
		params.Stop = openai.ChatCompletionNewParamsStopUnion{OfStringArray: req.StopSequences}
	}
	if err := setGenerationOptions(&params, req); err != nil {
		return params, err
	}
	if req.PromptCacheKey != "" {
		params.PromptCacheKey = param.NewOpt(req.PromptCacheKey)
	}
	return params, nil
}

// messages maps one conversation message to chat messages: tool results
// become one tool message each, whatever the role that carries them.
func messages(m llm.Message) ([]openai.ChatCompletionMessageParamUnion, error) {
	var (
		out   []openai.ChatCompletionMessageParamUnion
		texts []string
		calls []openai.ChatCompletionMessageToolCallUnionParam
		// content holds a user message's parts in order once it has media.
		content []openai.ChatCompletionContentPartUnionParam
	)
	for _, p := range m.Parts {
		switch p.Kind {
		case llm.PartText:
			texts = append(texts, p.Text)
			if content != nil {
				content = append(content, openai.TextContentPart(p.Text))
			}
		case llm.PartMedia:
			if p.Media == nil || m.Role != llm.RoleUser {
				return nil, errors.New("media part outside a user message")
			}
			if content == nil {
				for _, t := range texts {
					content = append(content, openai.TextContentPart(t))
				}
			}
			mp, err := mediaPart(p.Media)
			if err != nil {
				return nil, err
			}
			content = append(content, mp)
		case llm.PartThinking:
			// Chat Completions takes no reasoning back.
		case llm.PartToolCall:
			if p.ToolCall == nil {
				return nil, errors.New("tool call part without a call")
			}
			args := p.ToolCall.Arguments
			if args == "" {
				args = "{}"
			}
			calls = append(calls, openai.ChatCompletionMessageToolCallUnionParam{
				OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
					ID: p.ToolCall.ID,
					Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{
						Name: p.ToolCall.Name, Arguments: args,
					},
				},
			})
		case llm.PartToolResult:
			if p.ToolResult == nil {
				return nil, errors.New("tool result part without a result")
			}
			out = append(out, openai.ToolMessage(p.ToolResult.Content, p.ToolResult.CallID))
		default:
			return nil, fmt.Errorf("unknown part kind %d", p.Kind)
		}
	}
	media, err := toolMediaMessage(m)
	if err != nil {
		return nil, err
	}
	if media != nil {
		out = append(out, *media)
	}
	switch m.Role {
	case llm.RoleUser, llm.RoleTool:
		switch {
		case content != nil:
			out = append(out, openai.UserMessage(content))
		case len(texts) > 0:
			out = append(out, userMessage(texts))
		}
	case llm.RoleAssistant:
		if len(texts) == 0 && len(calls) == 0 {
			break
		}
		a := &openai.ChatCompletionAssistantMessageParam{ToolCalls: calls}
		if len(texts) > 0 {
			a.Content.OfString = param.NewOpt(strings.Join(texts, ""))
		}
		out = append(out, openai.ChatCompletionMessageParamUnion{OfAssistant: a})
	default:
		return nil, fmt.Errorf("unknown role %v", m.Role)
	}
	return out, nil
}

// userMessage sends one text part as a plain string, which every
// compatible server accepts, and several as content parts.
func userMessage(texts []string) openai.ChatCompletionMessageParamUnion {
	if len(texts) == 1 {
		return openai.UserMessage(texts[0])
	}
	parts := make([]openai.ChatCompletionContentPartUnionParam, len(texts))
	for i, t := range texts {
		parts[i] = openai.TextContentPart(t)
	}
	return openai.UserMessage(parts)
}
