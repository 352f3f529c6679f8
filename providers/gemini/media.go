package gemini

import (
	"github.com/turnstile-dev/turnstile/llm"
	"google.golang.org/genai"
)

// Inputs returns what a Gemini model takes: text, images, PDF documents and
// audio. A model's configuration (models.ALIAS.input) overrides it.
func (p *Provider) Inputs(string) []llm.Modality { return llm.Modalities }

// FetchesURI reports that Gemini takes media of every kind by URI, as
// file_data (a file of the Files API, or another URI the API fetches).
func (p *Provider) FetchesURI(llm.Modality) bool { return true }

// mediaPart maps one media to an inline_data part (its bytes) or a
// file_data part (its URI). The name is not sent: the Gemini API refuses
// display names, which only Vertex AI takes.
func mediaPart(m *llm.Media) *genai.Part {
	if m.URI != "" {
		return &genai.Part{FileData: &genai.FileData{FileURI: m.URI, MIMEType: m.MIMEType}}
	}
	return &genai.Part{InlineData: &genai.Blob{Data: m.Data, MIMEType: m.MIMEType}}
}
