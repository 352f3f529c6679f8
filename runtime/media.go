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
// MaxToolResultBytes for text, the largest first (so as many as fit are
// kept). A dropped media leaves a note in its result's content (its type
// and size, never its bytes). So the message committing the results, and
// its event, stay within the bound however large a tool's image.
func (tc *toolCalls) fitResultMedia(results []llm.ToolResult) {
	budget := tc.t.r.opts.limits.MaxToolResultBytes - minResultText
	over := mediaBytes(results) - budget
	if over <= 0 {
		return
	}
	type ref struct{ result, media, size int }
	var refs []ref
	for i, r := range results {
		for j := range r.Media {
			refs = append(refs, ref{i, j, r.Media[j].Size()})
		}
	}
	slices.SortStableFunc(refs, func(a, b ref) int { return b.size - a.size })
	drop := map[[2]int]bool{}
	for _, rf := range refs {
		if over <= 0 {
			break
		}
		drop[[2]int{rf.result, rf.media}] = true
		over -= rf.size
	}
	for i := range results {
		r := &results[i]
		var kept []llm.Media
		for j, m := range r.Media {
			if !drop[[2]int{i, j}] {
				kept = append(kept, m)
				continue
			}
			tc.t.r.opts.logger.Warn("tool result media dropped to fit the step's budget", "turn_id", tc.t.info.TurnID, "tool", r.Name,
				"call_id", r.CallID, "mime_type", m.MIMEType, "bytes", m.Size(), "max_tool_result_bytes", tc.t.r.opts.limits.MaxToolResultBytes)
			r.Content += mediaDroppedNote(m)
		}
		r.Media = kept
	}
}

func mediaDroppedNote(m llm.Media) string {
	return fmt.Sprintf("\n[turnstile: the tool's %s of %d bytes was dropped: over max_tool_result_bytes]", m.MIMEType, m.Size())
}

// mediaFor returns msgs as model m can take them: the media m cannot take
// (a server-side tool's image for a model configured without images, or
// reached by a fallback) are left out of the tool results holding them,
// each leaving a note in the result's content. The request's own media
// were checked for the model and its fallbacks before the turn; msgs is
// returned as is, without a copy, when m takes every media in it.
func mediaFor(m *Model, msgs []llm.Message) []llm.Message {
	var out []llm.Message
	for i, msg := range msgs {
		if msg.Role != llm.RoleTool || !slices.ContainsFunc(msg.Parts, func(p llm.Part) bool { return refusesSome(m, p.ToolResult) }) {
			continue
		}
		if out == nil {
			out = slices.Clone(msgs)
		}
		parts := slices.Clone(msg.Parts)
		for j, p := range parts {
			if !refusesSome(m, p.ToolResult) {
				continue
			}
			r := *p.ToolResult
			r.Media = nil
			for _, media := range p.ToolResult.Media {
				if why := mediaProblem(m, &media); why != "" {
					r.Content += fmt.Sprintf("\n[turnstile: the tool's %s of %d bytes was left out: %s]", media.MIMEType, media.Size(), why)
					continue
				}
				r.Media = append(r.Media, media)
			}
			parts[j].ToolResult = &r
		}
		out[i].Parts = parts
	}
	if out == nil {
		return msgs
	}
	return out
}

// refusesSome reports whether r holds media model m cannot take.
func refusesSome(m *Model, r *llm.ToolResult) bool {
	if r == nil {
		return false
	}
	for i := range r.Media {
		if mediaProblem(m, &r.Media[i]) != "" {
			return true
		}
	}
	return false
}
