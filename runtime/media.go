package runtime

import (
	"fmt"
	"slices"
	"strings"

	"github.com/turnstile-dev/turnstile/llm"
)

// MediaTaker is a provider that takes media. Its models take the inputs
// Inputs returns, unless the model's configuration says otherwise
// ([Model].Input); a provider that does not implement it takes text only.
type MediaTaker interface {
	// Inputs returns the kinds of input the provider's model takes.
	Inputs(model string) []llm.Modality
	// FetchesURI reports whether the provider fetches media of kind m by
	// URI; when it does not, such media must be sent as data.
	FetchesURI(m llm.Modality) bool
}

// inputs returns the kinds of input m takes.
func (m *Model) inputs() []llm.Modality {
	if m.Input != nil {
		return m.Input
	}
	if mt, ok := m.Provider.(MediaTaker); ok {
		return mt.Inputs(m.ID)
	}
	return []llm.Modality{llm.ModalityText}
}

// fetchesURI reports whether m's provider fetches media of kind k by URI.
func (m *Model) fetchesURI(k llm.Modality) bool {
	mt, ok := m.Provider.(MediaTaker)
	return ok && mt.FetchesURI(k)
}

// mediaRef is one media of a request, with the field that holds it.
type mediaRef struct {
	field string
	media *llm.Media
}

// requestMedia lists the media of msgs, user parts and tool results alike.
func requestMedia(msgs []llm.Message) []mediaRef {
	var out []mediaRef
	for i, msg := range msgs {
		for j, p := range msg.Parts {
			switch {
			case p.Kind == llm.PartMedia && p.Media != nil:
				out = append(out, mediaRef{fmt.Sprintf("messages[%d].parts[%d].media", i, j), p.Media})
			case p.Kind == llm.PartToolResult && p.ToolResult != nil:
				for k := range p.ToolResult.Media {
					out = append(out, mediaRef{fmt.Sprintf("messages[%d].parts[%d].tool_result.media[%d]", i, j, k), &p.ToolResult.Media[k]})
				}
			}
		}
	}
	return out
}

// mediaProblem says why model m cannot take media, "" when it can.
func mediaProblem(m *Model, media *llm.Media) string {
	kind, ok := llm.ModalityOf(media.MIMEType)
	if !ok {
		return fmt.Sprintf("%q is not a media type turnstile passes on", media.MIMEType)
	}
	in := m.inputs()
	if !slices.Contains(in, kind) {
		names := make([]string, len(in))
		for i, k := range in {
			names[i] = string(k)
		}
		return fmt.Sprintf("model %q cannot take %s input (%s); it takes [%s] (models.%s.input)", m.Alias, kind, media.MIMEType, strings.Join(names, ", "), m.Alias)
	}
	if media.URI != "" && !m.fetchesURI(kind) {
		return fmt.Sprintf("model %q's provider does not fetch %s by URI: send it as data", m.Alias, media.MIMEType)
	}
	return ""
}

// takesAll reports whether m can take every media of refs.
func takesAll(m *Model, refs []mediaRef) bool {
	for _, r := range refs {
		if mediaProblem(m, r.media) != "" {
			return false
		}
	}
	return true
}

// mediaBytes returns the bytes of the media of results.
func mediaBytes(results []llm.ToolResult) int {
	n := 0
	for _, r := range results {
		for i := range r.Media {
			n += r.Media[i].Size()
		}
	}
	return n
}

// minResultText is what the media of a step's tool results leave for
// their text at least: their media are dropped before their text is cut
// below it.
const minResultText = 1024

// fitResultMedia drops media from the tool results of one step until
// their media leave at least minResultText bytes of the step's
// MaxToolResultBytes for text, last result first, and within a result its
// last media first. A dropped media leaves a note in its result's content
// (its type and size, never its bytes). So the message committing the
// results, and its event, stay within the bound however large a tool's
// image.
func (t *turn) fitResultMedia(results []llm.ToolResult) {
	budget := t.r.opts.limits.MaxToolResultBytes - minResultText
	over := mediaBytes(results) - budget
	for i := len(results) - 1; i >= 0 && over > 0; i-- {
		r := &results[i]
		for j := len(r.Media) - 1; j >= 0 && over > 0; j-- {
			m := r.Media[j]
			over -= m.Size()
			t.r.opts.logger.Warn("tool result media dropped to fit the step's budget", "turn_id", t.info.TurnID, "tool", r.Name,
				"call_id", r.CallID, "mime_type", m.MIMEType, "bytes", m.Size(), "max_tool_result_bytes", t.r.opts.limits.MaxToolResultBytes)
			r.Content += mediaDroppedNote(m)
			r.Media = slices.Delete(r.Media, j, j+1)
		}
		if len(r.Media) == 0 {
			r.Media = nil
		}
	}
}

func mediaDroppedNote(m llm.Media) string {
	return fmt.Sprintf("\n[turnstile: the tool's %s of %d bytes was dropped: over max_tool_result_bytes]", m.MIMEType, m.Size())
}
