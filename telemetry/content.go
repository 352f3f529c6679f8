package telemetry

import (
	"encoding/json"
	"slices"

	"go.opentelemetry.io/otel/attribute"

	"github.com/turnstile-dev/turnstile/llm"
)

// The opt-in content attributes (telemetry.capture_content) hold messages
// as JSON strings in the shapes the GenAI conventions' schemas give
// (gen-ai-input-messages.json, gen-ai-output-messages.json,
// gen-ai-system-instructions.json). Thinking signatures are provider
// tokens, not content, and are left out.

// chatMessage is one message of gen_ai.input.messages or
// gen_ai.output.messages.
type chatMessage struct {
	Role         string        `json:"role"`
	Parts        []messagePart `json:"parts"`
	FinishReason string        `json:"finish_reason,omitempty"`
}

// messagePart is a text, reasoning, tool_call, tool_call_response or media
// part. A media part (the conventions' generic part, type "media") holds
// the media's modality, type and size: never its bytes, nor its URI,
// which may carry a token.
type messagePart struct {
	Type      string          `json:"type"`
	Content   string          `json:"content,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	Response  any             `json:"response,omitempty"`
	Modality  string          `json:"modality,omitempty"`
	MIMEType  string          `json:"mime_type,omitempty"`
	Size      int             `json:"size,omitempty"`
	ByURI     bool            `json:"by_uri,omitempty"`
}

// mediaPart describes a media without its content.
func mediaPart(m *llm.Media) messagePart {
	kind, _ := llm.ModalityOf(m.MIMEType)
	return messagePart{Type: "media", Modality: string(kind), MIMEType: m.MIMEType, Size: len(m.Data), ByURI: m.URI != ""}
}

// mediaAttrs returns the media count and sorted types of msgs, none when
// they hold no media.
func mediaAttrs(msgs []llm.Message) []attribute.KeyValue {
	n := 0
	var types []string
	see := func(m *llm.Media) {
		n++
		if !slices.Contains(types, m.MIMEType) {
			types = append(types, m.MIMEType)
		}
	}
	for _, msg := range msgs {
		for _, p := range msg.Parts {
			switch {
			case p.Kind == llm.PartMedia && p.Media != nil:
				see(p.Media)
			case p.Kind == llm.PartToolResult && p.ToolResult != nil:
				for i := range p.ToolResult.Media {
					see(&p.ToolResult.Media[i])
				}
			}
		}
	}
	if n == 0 {
		return nil
	}
	slices.Sort(types)
	return []attribute.KeyValue{keyMediaCount.Int(n), keyMediaTypes.StringSlice(types)}
}

func parts(m llm.Message) []messagePart {
	out := make([]messagePart, 0, len(m.Parts))
	for _, p := range m.Parts {
		switch p.Kind {
		case llm.PartText:
			out = append(out, messagePart{Type: "text", Content: p.Text})
		case llm.PartThinking:
			if p.Text != "" {
				out = append(out, messagePart{Type: "reasoning", Content: p.Text})
			}
		case llm.PartToolCall:
			if c := p.ToolCall; c != nil {
				mp := messagePart{Type: "tool_call", ID: c.ID, Name: c.Name}
				if json.Valid([]byte(c.Arguments)) {
					mp.Arguments = json.RawMessage(c.Arguments)
				} else if b, err := json.Marshal(c.Arguments); err == nil {
					mp.Arguments = b
				}
				out = append(out, mp)
			}
		case llm.PartToolResult:
			if r := p.ToolResult; r != nil {
				out = append(out, messagePart{Type: "tool_call_response", ID: r.CallID, Response: r.Content})
				for i := range r.Media {
					out = append(out, mediaPart(&r.Media[i]))
				}
			}
		case llm.PartMedia:
			if p.Media != nil {
				out = append(out, mediaPart(p.Media))
			}
		}
	}
	return out
}

func marshal(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(b)
}

// inputMessages returns gen_ai.input.messages for the conversation sent.
func inputMessages(msgs []llm.Message) string {
	out := make([]chatMessage, 0, len(msgs))
	for _, m := range msgs {
		out = append(out, chatMessage{Role: m.Role.String(), Parts: parts(m)})
	}
	return marshal(out)
}

// outputMessages returns gen_ai.output.messages for the reply.
func outputMessages(m llm.Message, stop llm.StopReason) string {
	return marshal([]chatMessage{{Role: "assistant", Parts: parts(m), FinishReason: finishReason(stop)}})
}

// systemInstructions returns gen_ai.system_instructions for a system
// prompt.
func systemInstructions(system string) string {
	return marshal([]messagePart{{Type: "text", Content: system}})
}
