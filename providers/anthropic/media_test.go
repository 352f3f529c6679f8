package anthropic

import (
	"net/http"
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

// TestMediaRequest: media map to the blocks of Anthropic's vision and PDF
// guides: image blocks with a base64 or url source, document blocks with a
// base64 or url source (the name as title), in the order of the message's
// parts, and the same blocks inside a tool_result's content after its
// text.
func TestMediaRequest(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "anthropic_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	req := &llm.Request{
		Model: "claude-sonnet-4-5",
		Messages: []llm.Message{
			{Role: llm.RoleUser, Parts: []llm.Part{
				llm.MediaPart(llm.Media{MIMEType: "image/jpeg", Data: []byte{0xff, 0xd8, 0xff}}),
				llm.MediaPart(llm.Media{MIMEType: "image/png", URI: "https://upload.wikimedia.org/wikipedia/commons/a/a7/Camponotus_flavomarginatus_ant.jpg"}),
				llm.TextPart("Describe this image."),
				llm.MediaPart(llm.Media{MIMEType: "application/pdf", URI: "https://assets.anthropic.com/m/1cd9d098ac3e6467/original/Claude-3-Model-Card-October-Addendum.pdf"}),
				llm.MediaPart(llm.Media{MIMEType: "application/pdf", Data: []byte("%PDF-1.7"), Name: "report.pdf"}),
			}},
			{Role: llm.RoleAssistant, Parts: []llm.Part{{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "toolu_1", Name: "screenshot", Arguments: "{}"}}}},
			{Role: llm.RoleTool, Parts: []llm.Part{
				{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: "toolu_1", Content: "the screen", Media: []llm.Media{{MIMEType: "image/png", Data: []byte("\x89PNG")}}}},
			}},
		},
	}
	if _, err := providertest.Collect(t, t.Context(), provider(t, f), req); err != nil {
		t.Fatalf("Stream: %v", err)
	}
	providertest.EqualJSON(t, f.Bodies()[0], `{
		"model": "claude-sonnet-4-5",
		"max_tokens": 4096,
		"stream": true,
		"messages": [
			{"role": "user", "content": [
				{"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/"}},
				{"type": "image", "source": {"type": "url", "url": "https://upload.wikimedia.org/wikipedia/commons/a/a7/Camponotus_flavomarginatus_ant.jpg"}},
				{"type": "text", "text": "Describe this image."},
				{"type": "document", "source": {"type": "url", "url": "https://assets.anthropic.com/m/1cd9d098ac3e6467/original/Claude-3-Model-Card-October-Addendum.pdf"}},
				{"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjc="}, "title": "report.pdf"}
			]},
			{"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]},
			{"role": "user", "content": [
				{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": false, "content": [
					{"type": "text", "text": "the screen"},
					{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw=="}}
				]}
			]}
		]
	}`)
}

// TestMediaInputs: Claude takes text, images and PDFs, and fetches both by
// URL; audio is refused.
func TestMediaInputs(t *testing.T) {
	t.Parallel()
	var p *Provider
	if got := p.Inputs("claude-sonnet-4-5"); len(got) != 3 {
		t.Errorf("inputs %v", got)
	}
	if !p.FetchesURI(llm.ModalityImage) || !p.FetchesURI(llm.ModalityPDF) || p.FetchesURI(llm.ModalityAudio) {
		t.Error("FetchesURI")
	}
	if _, err := mediaBlock(&llm.Media{MIMEType: "audio/wav", Data: []byte("RIFF")}); err == nil {
		t.Error("audio mapped")
	}
}
