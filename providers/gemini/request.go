package gemini

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/turnstile-dev/turnstile/llm"
	"google.golang.org/genai"
)

// call is one generateContent request.
type call struct {
	model    string
	contents []*genai.Content
	config   *genai.GenerateContentConfig
	// answer is how the call asks for its output schema, when it does so
	// through a function (see [answer]).
	answer answer
}

// buildCall maps req to its call (see buildRequest).
func buildCall(req *llm.Request) (call, error) {
	contents, config, ans, err := buildRequest(req)
	return call{model: req.Model, contents: contents, config: config, answer: ans}, err
}

// buildRequest maps req to contents and a generation config, and says how
// the reply's answer comes back when the output schema is asked for
// through a function. It fails only on a request the API could not
// accept, such as a tool schema that is not a JSON object.
func buildRequest(req *llm.Request) ([]*genai.Content, *genai.GenerateContentConfig, answer, error) {
	config := &genai.GenerateContentConfig{
		// A dropped stream is the runtime's to retry, not the SDK's to resume.
		AutomaticContinuation: genai.Ptr(false),
		StopSequences:         req.StopSequences,
	}
	if req.System != "" {
		config.SystemInstruction = &genai.Content{Parts: []*genai.Part{{Text: req.System}}}
	}
	if req.MaxOutputTokens > 0 {
		config.MaxOutputTokens = int32(min(req.MaxOutputTokens, 1<<31-1))
	}
	if req.Temperature != nil {
		config.Temperature = genai.Ptr(float32(*req.Temperature))
	}
	if req.TopP != nil {
		config.TopP = genai.Ptr(float32(*req.TopP))
	}
	var decls []*genai.FunctionDeclaration
	for _, t := range req.Tools {
		schema := map[string]any{"type": "object"}
		if len(t.Schema) > 0 {
			schema = nil
			if err := json.Unmarshal(t.Schema, &schema); err != nil {
				return nil, nil, answer{}, fmt.Errorf("tool %q: schema is not a JSON object: %w", t.Name, err)
			}
			if schema == nil {
				return nil, nil, answer{}, fmt.Errorf("tool %q: schema is null, not a JSON object", t.Name)
			}
		}
		decls = append(decls, &genai.FunctionDeclaration{Name: t.Name, Description: t.Description, ParametersJsonSchema: schema})
	}
	if len(decls) > 0 {
		config.Tools = []*genai.Tool{{FunctionDeclarations: decls}}
	}
	ans, err := setGenerationOptions(config, req)
	if err != nil {
		return nil, nil, answer{}, err
	}
	names := callNames(req.Messages)
	var contents []*genai.Content
	for i, m := range req.Messages {
		c, err := content(m, names)
		if err != nil {
			return nil, nil, answer{}, fmt.Errorf("message %d: %w", i, err)
		}
		if len(c.Parts) == 0 {
			continue
		}
		if n := len(contents); n > 0 && contents[n-1].Role == c.Role {
			contents[n-1].Parts = append(contents[n-1].Parts, c.Parts...)
			continue
		}
		contents = append(contents, c)
	}
	if capabilitiesOf(req).SignedCalls {
		signCalls(contents)
	}
	return contents, config, ans, nil
}

// unsignedCall is the thought signature Gemini documents for a function
// call it did not make (a conversation begun with another model, or one
// whose signatures were lost): the API skips its check of that call. The
// field is bytes, read from base64, and the placeholder is given as its
// base64 text; these are its bytes.
var unsignedCall, _ = base64.URLEncoding.DecodeString("skip_thought_signature_validator")

// signCalls gives the first function call of each model step of the
// current turn — the steps after the last user content that answers no
// function call — the placeholder signature when it has none: Gemini 3
// refuses such a call (400 "Function call is missing a
// thought_signature"). A call made by another model before a fallback has
// none, and neither has one whose signature was another API's (dropped in
// content). Later calls of a step carry none, as Gemini's own parallel
// calls do; earlier turns are not checked.
func signCalls(contents []*genai.Content) {
	start := 0
	for i, c := range contents {
		if c.Role == genai.RoleUser && !slices.ContainsFunc(c.Parts, func(p *genai.Part) bool { return p.FunctionResponse != nil }) {
			start = i + 1
		}
	}
	for _, c := range contents[start:] {
		if c.Role != genai.RoleModel {
			continue
		}
		if i := slices.IndexFunc(c.Parts, func(p *genai.Part) bool { return p.FunctionCall != nil }); i >= 0 && c.Parts[i].ThoughtSignature == nil {
			c.Parts[i].ThoughtSignature = unsignedCall
		}
	}
}

// callNames maps the id of every tool call of msgs to its tool's name: a
// functionResponse needs the name of the call it answers, which a result
// may not carry.
func callNames(msgs []llm.Message) map[string]string {
	names := map[string]string{}
	for _, m := range msgs {
		for _, c := range m.ToolCalls() {
			names[c.ID] = c.Name
		}
	}
	return names
}

// content maps one message; names holds the tool name of each call id of
// the conversation. A thinking part with a signature but no text carries
// the signature of the part after it. A signature that is not base64 did
// not come from Gemini (the runtime keeps another API's signatures from
// Gemini; one without a signer, from an older client, may still be one):
// it is dropped, as the API would refuse it.
func content(m llm.Message, names map[string]string) (*genai.Content, error) {
	c := &genai.Content{}
	switch m.Role {
	case llm.RoleUser, llm.RoleTool:
		c.Role = genai.RoleUser
	case llm.RoleAssistant:
		c.Role = genai.RoleModel
	default:
		return nil, fmt.Errorf("unknown role %v", m.Role)
	}
	var pending []byte
	add := func(p *genai.Part) {
		if pending != nil && p.ThoughtSignature == nil {
			p.ThoughtSignature, pending = pending, nil
		}
		c.Parts = append(c.Parts, p)
	}
	for _, p := range m.Parts {
		var sig []byte
		if p.Signature != "" {
			if b, err := base64.StdEncoding.DecodeString(p.Signature); err == nil {
				sig = b
			}
		}
		switch p.Kind {
		case llm.PartText:
			if p.Text != "" {
				add(&genai.Part{Text: p.Text, ThoughtSignature: sig})
			}
		case llm.PartThinking:
			if m.Role != llm.RoleAssistant || sig == nil && p.Signature != "" {
				continue
			}
			if p.Text == "" {
				pending = sig
				continue
			}
			add(&genai.Part{Text: p.Text, Thought: true, ThoughtSignature: sig})
		case llm.PartToolCall:
			tc := p.ToolCall
			if tc == nil {
				return nil, errors.New("tool call part without a call")
			}
			var args map[string]any
			if tc.Arguments != "" {
				if err := json.Unmarshal([]byte(tc.Arguments), &args); err != nil {
					return nil, fmt.Errorf("tool call %q: arguments are not a JSON object: %w", tc.Name, err)
				}
			}
			add(&genai.Part{FunctionCall: &genai.FunctionCall{ID: tc.ID, Name: tc.Name, Args: args}, ThoughtSignature: sig})
		case llm.PartToolResult:
			r := p.ToolResult
			if r == nil {
				return nil, errors.New("tool result part without a result")
			}
			key := "output"
			if r.IsError {
				key = "error"
			}
			name := r.Name
			if name == "" {
				name = names[r.CallID]
			}
			add(&genai.Part{FunctionResponse: &genai.FunctionResponse{
				ID: r.CallID, Name: name, Response: map[string]any{key: r.Content},
			}})
			// The result's media follow it in the same turn, as parts of
			// their own: every Gemini model takes them there, while media
			// inside a functionResponse are for Gemini 3 only.
			for i := range r.Media {
				add(mediaPart(&r.Media[i]))
			}
		case llm.PartMedia:
			if p.Media == nil || m.Role != llm.RoleUser {
				return nil, errors.New("media part outside a user message")
			}
			add(mediaPart(p.Media))
		default:
			return nil, fmt.Errorf("unknown part kind %d", p.Kind)
		}
	}
	return c, nil
}
