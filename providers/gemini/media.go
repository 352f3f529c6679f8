package gemini

import (
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/capability"
	"google.golang.org/genai"
)

// Inputs returns what a Gemini model takes, from the capability table:
// text, images, PDF documents and audio. A model's configuration
// (models.ALIAS.input) overrides it.
func (p *Provider) Inputs(model string) []llm.Modality {
	return capability.Lookup(capability.Gemini, model).Inputs
}

// Capabilities returns what the Gemini model takes, from the capability
// table: five stop sequences, a temperature from 0 to 2, thinking by
// budget (none before 2.5), its thought signatures, and an output schema
// beside tools from Gemini 3 on.
func (p *Provider) Capabilities(model string) llm.Capabilities {
	return capability.Lookup(capability.Gemini, model).Capabilities
}

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
