package openai

import (
	"net/http"
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

// TestMediaRequest: media map to the content parts of OpenAI's chat
// guides (images: image_url with a URL or a data: URL; PDFs: file with
// file_data as a data: URL and a filename; audio: input_audio with base64
// data and its format), in the order of the message's parts; a tool
// result's media follow the tool messages in a user message, since a
// tool message's content is text only.
func TestMediaRequest(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "openai_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	req := &llm.Request{
		Model: "gpt-4o-audio-preview",
		Messages: []llm.Message{
			{Role: llm.RoleUser, Parts: []llm.Part{
				llm.TextPart("What is in this image?"),
				llm.MediaPart(llm.Media{MIMEType: "image/jpeg", URI: "https://upload.wikimedia.org/wikipedia/commons/a/a7/Camponotus_flavomarginatus_ant.jpg"}),
				llm.MediaPart(llm.Media{MIMEType: "image/png", Data: []byte("\x89PNG")}),
				llm.TextPart("And these?"),
				llm.MediaPart(llm.Media{MIMEType: "application/pdf", Data: []byte("%PDF-1.7"), Name: "draconomicon.pdf"}),
				llm.MediaPart(llm.Media{MIMEType: "audio/mpeg", Data: []byte("ID3")}),
			}},
			{Role: llm.RoleAssistant, Parts: []llm.Part{{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "call_1", Name: "screenshot", Arguments: "{}"}}}},
			{Role: llm.RoleTool, Parts: []llm.Part{{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{
				CallID: "call_1", Name: "screenshot", Content: "the screen", Media: []llm.Media{{MIMEType: "image/webp", Data: []byte("RIFF")}},
			}}}},
		},
	}
	if _, err := providertest.Collect(t, t.Context(), provider(t, f), req); err != nil {
		t.Fatalf("Stream: %v", err)
	}
	providertest.EqualJSON(t, f.Bodies()[0], `{
		"model": "gpt-4o-audio-preview",
		"stream": true,
		"stream_options": {"include_usage": true},
		"messages": [
			{"role": "user", "content": [
				{"type": "text", "text": "What is in this image?"},
				{"type": "image_url", "image_url": {"url": "https://upload.wikimedia.org/wikipedia/commons/a/a7/Camponotus_flavomarginatus_ant.jpg"}},
				{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}},
				{"type": "text", "text": "And these?"},
				{"type": "file", "file": {"filename": "draconomicon.pdf", "file_data": "data:application/pdf;base64,JVBERi0xLjc="}},
				{"type": "input_audio", "input_audio": {"data": "SUQz", "format": "mp3"}}
			]},
			{"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}]},
			{"role": "tool", "tool_call_id": "call_1", "content": "the screen"},
			{"role": "user", "content": [
				{"type": "text", "text": "[the result of tool call call_1 (screenshot) holds these media]"},
				{"type": "image_url", "image_url": {"url": "data:image/webp;base64,UklGRg=="}}
			]}
		]
	}`)
}

// TestMediaInputs: what the adapter says its models take, and fetch.
func TestMediaInputs(t *testing.T) {
	t.Parallel()
	var p *Provider
	if got := p.Inputs("gpt-4.1"); len(got) != 3 || got[1] != llm.ModalityImage || got[2] != llm.ModalityPDF {
		t.Errorf("gpt-4.1 takes %v", got)
	}
	if got := p.Inputs("gpt-4o-audio-preview"); got[len(got)-1] != llm.ModalityAudio {
		t.Errorf("gpt-4o-audio-preview takes %v", got)
	}
	if !p.FetchesURI(llm.ModalityImage) || p.FetchesURI(llm.ModalityPDF) || p.FetchesURI(llm.ModalityAudio) {
		t.Error("OpenAI fetches images by URL, and nothing else")
	}
	if _, err := mediaPart(&llm.Media{MIMEType: "application/pdf", URI: "https://example.com/a.pdf"}); err == nil || !strings.Contains(err.Error(), "only images") {
		t.Errorf("a PDF by URI: %v", err)
	}
}
