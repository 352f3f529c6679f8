package anthropic

import (
	"encoding/base64"
	"fmt"

	"github.com/anthropics/anthropic-sdk-go"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/capability"
)

// Inputs returns what a Claude model takes, from the capability table:
// text, images and PDF documents; the Messages API takes no audio. A
// model's configuration (models.ALIAS.input) overrides it.
func (p *Provider) Inputs(model string) []llm.Modality {
	return capability.Lookup(capability.Anthropic, model).Inputs
}

// FetchesURI reports that Anthropic fetches images and PDFs by URL (the
// url sources of image and document blocks).
func (p *Provider) FetchesURI(m llm.Modality) bool {
	return m == llm.ModalityImage || m == llm.ModalityPDF
}

// mediaBlock maps one media to an image block or a document block, with a
// base64 source for data and a url source for a URI; a document's name is
// its title.
func mediaBlock(m *llm.Media) (anthropic.ContentBlockParamUnion, error) {
	kind, _ := llm.ModalityOf(m.MIMEType)
	switch kind {
	case llm.ModalityImage:
		img := &anthropic.ImageBlockParam{}
		if m.URI != "" {
			img.Source.OfURL = &anthropic.URLImageSourceParam{URL: m.URI}
		} else {
			img.Source.OfBase64 = &anthropic.Base64ImageSourceParam{
				Data: base64.StdEncoding.EncodeToString(m.Data), MediaType: anthropic.Base64ImageSourceMediaType(m.MIMEType),
			}
		}
		return anthropic.ContentBlockParamUnion{OfImage: img}, nil
	case llm.ModalityPDF:
		doc := &anthropic.DocumentBlockParam{}
		if m.URI != "" {
			doc.Source.OfURL = &anthropic.URLPDFSourceParam{URL: m.URI}
		} else {
			doc.Source.OfBase64 = &anthropic.Base64PDFSourceParam{Data: base64.StdEncoding.EncodeToString(m.Data)}
		}
		if m.Name != "" {
			doc.Title = anthropic.String(m.Name)
		}
		return anthropic.ContentBlockParamUnion{OfDocument: doc}, nil
	}
	return anthropic.ContentBlockParamUnion{}, fmt.Errorf("media type %q: Claude takes images and PDF documents", m.MIMEType)
}

// toolResultBlock maps a tool result: its text, then its media as image
// and document blocks inside the tool_result's content, as the Messages
// API takes them.
func toolResultBlock(r *llm.ToolResult) (anthropic.ContentBlockParamUnion, error) {
	if len(r.Media) == 0 {
		if r.Content == "" {
			return anthropic.ContentBlockParamUnion{OfToolResult: &anthropic.ToolResultBlockParam{
				ToolUseID: r.CallID, IsError: anthropic.Bool(r.IsError),
			}}, nil
		}
		return anthropic.NewToolResultBlock(r.CallID, r.Content, r.IsError), nil
	}
	b := &anthropic.ToolResultBlockParam{ToolUseID: r.CallID, IsError: anthropic.Bool(r.IsError)}
	if r.Content != "" {
		b.Content = append(b.Content, anthropic.ToolResultBlockParamContentUnion{OfText: &anthropic.TextBlockParam{Text: r.Content}})
	}
	for i := range r.Media {
		mb, err := mediaBlock(&r.Media[i])
		if err != nil {
			return anthropic.ContentBlockParamUnion{}, fmt.Errorf("tool result %s: %w", r.CallID, err)
		}
		b.Content = append(b.Content, anthropic.ToolResultBlockParamContentUnion{OfImage: mb.OfImage, OfDocument: mb.OfDocument})
	}
	return anthropic.ContentBlockParamUnion{OfToolResult: b}, nil
}
