package gemini

import (
	"encoding/base64"
	"encoding/json"
	"fmt"

	"google.golang.org/genai"

	"github.com/turnstile-dev/turnstile/runtime"
)

// encodeSignature turns a thought signature into the runtime's text form.
func encodeSignature(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// decodeSignature reverses encodeSignature.
func decodeSignature(s string) ([]byte, error) { return base64.StdEncoding.DecodeString(s) }

// toContents maps the conversation to Gemini contents. Consecutive
// messages that map to the same role are merged, since Gemini expects the
// turns to alternate; tool results become functionResponse parts of a user
// turn, named after their calls.
func toContents(msgs []runtime.Message) ([]*genai.Content, error) {
	names := map[string]string{} // call id -> tool name
	var out []*genai.Content
	for i, m := range msgs {
		role := genai.RoleUser
		if m.Role == runtime.RoleAssistant {
			role = genai.RoleModel
		}
		var parts []*genai.Part
		var pending []byte // a signature waiting for the part it belongs to
		for j, p := range m.Parts {
			var part *genai.Part
			switch p.Kind {
			case runtime.PartText:
				if p.Text == "" {
					continue
				}
				part = &genai.Part{Text: p.Text}
			case runtime.PartThinking:
				sig, err := decodeSignature(p.Signature)
				if err != nil {
					return nil, fmt.Errorf("messages[%d].parts[%d]: the thinking signature is not from Gemini", i, j)
				}
				if p.Text == "" {
					// The signature of the part that follows.
					pending = sig
					continue
				}
				part = &genai.Part{Text: p.Text, Thought: true, ThoughtSignature: sig}
			case runtime.PartToolCall:
				args := map[string]any{}
				if p.ToolCall.Arguments != "" {
					if err := json.Unmarshal([]byte(p.ToolCall.Arguments), &args); err != nil {
						return nil, fmt.Errorf("messages[%d].parts[%d]: tool call arguments are not a JSON object", i, j)
					}
				}
				names[p.ToolCall.ID] = p.ToolCall.Name
				part = &genai.Part{FunctionCall: &genai.FunctionCall{ID: p.ToolCall.ID, Name: p.ToolCall.Name, Args: args}}
			case runtime.PartToolResult:
				r := p.ToolResult
				name := r.Name
				if name == "" {
					name = names[r.CallID]
				}
				if name == "" {
					return nil, fmt.Errorf("messages[%d].parts[%d]: tool result %q answers no tool call", i, j, r.CallID)
				}
				key := "output"
				if r.IsError {
					key = "error"
				}
				part = &genai.Part{FunctionResponse: &genai.FunctionResponse{ID: r.CallID, Name: name, Response: map[string]any{key: r.Content}}}
			default:
				continue
			}
			if pending != nil {
				part.ThoughtSignature, pending = pending, nil
			}
			parts = append(parts, part)
		}
		if len(parts) == 0 {
			continue
		}
		if n := len(out); n > 0 && out[n-1].Role == role {
			out[n-1].Parts = append(out[n-1].Parts, parts...)
			continue
		}
		out = append(out, &genai.Content{Role: role, Parts: parts})
	}
	return out, nil
}

// toConfig maps the request's system prompt, tools and generation options.
func toConfig(req *runtime.Request) (*genai.GenerateContentConfig, error) {
	cfg := &genai.GenerateContentConfig{StopSequences: req.StopSequences}
	if req.System != "" {
		cfg.SystemInstruction = &genai.Content{Parts: []*genai.Part{{Text: req.System}}}
	}
	if req.MaxOutputTokens > 0 {
		cfg.MaxOutputTokens = int32(req.MaxOutputTokens)
	}
	if req.Temperature != nil {
		t := float32(*req.Temperature)
		cfg.Temperature = &t
	}
	if len(req.Tools) > 0 {
		var decls []*genai.FunctionDeclaration
		for _, t := range req.Tools {
			var schema any = map[string]any{"type": "object"}
			if len(t.Schema) > 0 {
				if err := json.Unmarshal(t.Schema, &schema); err != nil {
					return nil, fmt.Errorf("tool %q: the input schema is not JSON", t.Name)
				}
			}
			decls = append(decls, &genai.FunctionDeclaration{Name: t.Name, Description: t.Description, ParametersJsonSchema: schema})
		}
		cfg.Tools = []*genai.Tool{{FunctionDeclarations: decls}}
	}
	return cfg, nil
}
