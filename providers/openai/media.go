package openai

import (
	"encoding/base64"
	"fmt"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/capability"
)

// Inputs returns what a Chat Completions model takes, from the capability
// table: text, images and PDF files, and audio for the audio models
// (gpt-4o-audio-preview, gpt-4o-mini-audio-preview, gpt-audio), the only
// ones whose chat API takes input_audio; a model of a compatible server,
// which the table does not know, text, images and PDF files. A model's
// configuration (models.ALIAS.input) overrides it.
func (p *Provider) Inputs(model string) []llm.Modality {
	return capability.Lookup(capability.OpenAI, model).Inputs
}

// Capabilities returns what the model takes, from the capability table:
// the GPT-4 family does not reason and takes four stop sequences; the
// o-series and GPT-5 always reason, and take no stop sequences and no
// temperature or top_p; GPT-5.1 and later take temperature and top_p when
// they do not reason. A compatible server's model is not known: its
// options are sent as asked.
func (p *Provider) Capabilities(model string) llm.Capabilities {
	return capability.Lookup(capability.OpenAI, model).Capabilities
}

// FetchesURI reports that OpenAI fetches images by URL (image_url); a file
// part takes only inline data or an uploaded file's id, and input_audio
// only data.
func (p *Provider) FetchesURI(m llm.Modality) bool { return m == llm.ModalityImage }

// mediaPart maps one media to a content part: image_url (a URL, or the
// data as a data: URL), file (a PDF as a data: URL with its file name) or
// input_audio (base64, format wav or mp3).
func mediaPart(m *llm.Media) (openai.ChatCompletionContentPartUnionParam, error) {
	kind, _ := llm.ModalityOf(m.MIMEType)
	switch {
	case kind == llm.ModalityImage:
		u := m.URI
		if u == "" {
			u = dataURL(m)
		}
		return openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: u}), nil
	case m.URI != "":
		return openai.ChatCompletionContentPartUnionParam{}, fmt.Errorf("%s by URI: OpenAI fetches only images", m.MIMEType)
	case kind == llm.ModalityPDF:
		name := m.Name
		if name == "" {
			name = "document.pdf"
		}
		return openai.FileContentPart(openai.ChatCompletionContentPartFileFileParam{
			FileData: param.NewOpt(dataURL(m)), Filename: param.NewOpt(name),
		}), nil
	case kind == llm.ModalityAudio:
		format := "wav"
		if m.MIMEType == "audio/mpeg" {
			format = "mp3"
		}
		return openai.InputAudioContentPart(openai.ChatCompletionContentPartInputAudioInputAudioParam{
			Data: base64.StdEncoding.EncodeToString(m.Data), Format: format,
		}), nil
	}
	return openai.ChatCompletionContentPartUnionParam{}, fmt.Errorf("media type %q", m.MIMEType)
}

func dataURL(m *llm.Media) string {
	return "data:" + m.MIMEType + ";base64," + base64.StdEncoding.EncodeToString(m.Data)
}

// toolMediaMessage carries the media of a message's tool results, which a
// Chat Completions tool message cannot hold (its content is text only):
// a user message right after the tool messages, each result's media
// introduced by a text part naming its call. nil when there are none.
func toolMediaMessage(m llm.Message) (*openai.ChatCompletionMessageParamUnion, error) {
	var parts []openai.ChatCompletionContentPartUnionParam
	for _, p := range m.Parts {
		r := p.ToolResult
		if p.Kind != llm.PartToolResult || r == nil || len(r.Media) == 0 {
			continue
		}
		parts = append(parts, openai.TextContentPart(fmt.Sprintf("[the result of tool call %s (%s) holds these media]", r.CallID, r.Name)))
		for i := range r.Media {
			mp, err := mediaPart(&r.Media[i])
			if err != nil {
				return nil, fmt.Errorf("tool result %s: %w", r.CallID, err)
			}
			parts = append(parts, mp)
		}
	}
	if parts == nil {
		return nil, nil
	}
	msg := openai.UserMessage(parts)
	return &msg, nil
}
