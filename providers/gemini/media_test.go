package gemini

import (
	"net/http"
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

// TestMediaRequest: media map to the parts of Gemini's file-input guides:
// inlineData (base64 bytes and mimeType) for data, fileData (fileUri and
// mimeType) for a URI, in the order of the message's parts; a tool
// result's media follow its functionResponse in the same user turn.
func TestMediaRequest(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "gemini_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, r *http.Request) { providertest.WriteSSE(w, body) })
	req := &llm.Request{
		Model: "gemini-2.5-flash",
		Messages: []llm.Message{
			{Role: llm.RoleUser, Parts: []llm.Part{
				llm.MediaPart(llm.Media{MIMEType: "image/jpeg", Data: []byte{0xff, 0xd8, 0xff}, Name: "not sent"}),
				llm.TextPart("Caption this image."),
				llm.MediaPart(llm.Media{MIMEType: "application/pdf", URI: "https://generativelanguage.googleapis.com/v1beta/files/abc-123"}),
				llm.MediaPart(llm.Media{MIMEType: "audio/mpeg", Data: []byte("ID3")}),
			}},
			{Role: llm.RoleAssistant, Parts: []llm.Part{{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "call_0", Name: "screenshot", Arguments: "{}"}}}},
			{Role: llm.RoleTool, Parts: []llm.Part{
				{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{CallID: "call_0", Name: "screenshot", Content: "the screen", Media: []llm.Media{{MIMEType: "image/png", Data: []byte("\x89PNG")}}}},
			}},
		},
	}
	if _, err := providertest.Collect(t, t.Context(), provider(t, f), req); err != nil {
		t.Fatalf("Stream: %v", err)
	}
	providertest.EqualJSON(t, f.Bodies()[0], `{
		"generationConfig": {},
		"contents": [
			{"role": "user", "parts": [
				{"inlineData": {"mimeType": "image/jpeg", "data": "/9j/"}},
				{"text": "Caption this image."},
				{"fileData": {"mimeType": "application/pdf", "fileUri": "https://generativelanguage.googleapis.com/v1beta/files/abc-123"}},
				{"inlineData": {"mimeType": "audio/mpeg", "data": "SUQz"}}
			]},
			{"role": "model", "parts": [{"functionCall": {"id": "call_0", "name": "screenshot"}}]},
			{"role": "user", "parts": [
				{"functionResponse": {"id": "call_0", "name": "screenshot", "response": {"output": "the screen"}}},
				{"inlineData": {"mimeType": "image/png", "data": "iVBORw=="}}
			]}
		]
	}`)
}
