package wire

import (
	"fmt"
	"net/url"
	"strings"
	"unicode/utf8"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
)

// Bounds of a request's media. The bytes travel in the request, so
// max_request_bytes (default 4 MiB) binds first; these bound what a server
// whose max_request_bytes was raised for media takes.
const (
	// DefaultMaxMediaBytes bounds one media part: Anthropic's limit for an
	// image (5 MB), below OpenAI's and Gemini's.
	DefaultMaxMediaBytes = 5 << 20
	// DefaultMaxRequestMediaBytes bounds the media of one request, all
	// parts together.
	DefaultMaxRequestMediaBytes = 16 << 20
	maxMediaURIBytes            = 2048
	maxMediaNameBytes           = 256
)

// mediaLimits bounds the media of one request.
type mediaLimits struct {
	// perPart and perRequest are the bounds; zero takes the defaults.
	perPart, perRequest int
	// total is what the request's media hold so far.
	total int
}

// toMedia validates the media at field and converts it. It reports each
// problem naming its field under field (e.g. "messages[0].parts[1].media").
func toMedia(bad *violations, lim *mediaLimits, field string, m *turnstilev1.Media) llm.Media {
	perPart, perRequest := lim.perPart, lim.perRequest
	if perPart <= 0 {
		perPart = DefaultMaxMediaBytes
	}
	if perRequest <= 0 {
		perRequest = DefaultMaxRequestMediaBytes
	}
	out := llm.Media{MIMEType: llm.NormalizeMediaType(m.GetMimeType()), Name: m.GetName()}
	switch _, ok := llm.ModalityOf(out.MIMEType); {
	case m.GetMimeType() == "":
		bad.add(field+".mime_type", "required: one of %s", strings.Join(llm.MediaTypes(), ", "))
	case !ok:
		bad.add(field+".mime_type", "%s is not a media type turnstile passes on; one of %s", quote(clip(m.GetMimeType(), 64)), strings.Join(llm.MediaTypes(), ", "))
	}
	switch s := m.GetSource().(type) {
	case *turnstilev1.Media_Data:
		switch n := len(s.Data); {
		case n == 0:
			bad.add(field+".data", "must not be empty")
		case n > perPart:
			bad.add(field+".data", "must be at most %d bytes (server.max_media_bytes), got %d", perPart, n)
		}
		out.Data = s.Data
	case *turnstilev1.Media_Uri:
		if msg := uriProblem(s.Uri); msg != "" {
			bad.add(field+".uri", "%s", msg)
		}
		out.URI = s.Uri
	default:
		bad.add(field, "one of data or uri must be set")
	}
	if len(out.Name) > maxMediaNameBytes || !utf8.ValidString(out.Name) {
		bad.add(field+".name", "must be valid UTF-8 of at most %d bytes", maxMediaNameBytes)
	}
	if len(out.Data) > perPart {
		return out // refused above; not counted again in the request's total
	}
	before := lim.total
	lim.total += out.Size()
	if before <= perRequest && lim.total > perRequest {
		bad.add(field, "the request's media are over %d bytes (server.max_request_media_bytes)", perRequest)
	}
	return out
}

// uriProblem says what is wrong with a media URI, "" when nothing is.
// Only https is taken: the provider fetches the URI, never this server,
// so no other scheme (file, a private network's http) reaches anything;
// credentials in a URI would end up in a provider's logs.
func uriProblem(s string) string {
	if len(s) > maxMediaURIBytes {
		return fmt.Sprintf("must be at most %d bytes", maxMediaURIBytes)
	}
	u, err := url.Parse(s)
	switch {
	case err != nil || !u.IsAbs() || u.Host == "":
		return "must be an absolute https URI"
	case u.Scheme != "https":
		return "must be an https URI (the provider fetches it; no other scheme is passed on)"
	case u.User != nil:
		return "must not hold credentials"
	}
	return ""
}

// fromMedia converts media for the wire.
func fromMedia(m llm.Media) *turnstilev1.Media {
	out := &turnstilev1.Media{MimeType: m.MIMEType, Name: m.Name}
	if m.URI != "" {
		out.Source = &turnstilev1.Media_Uri{Uri: m.URI}
	} else {
		out.Source = &turnstilev1.Media_Data{Data: m.Data}
	}
	return out
}

// fromMediaList converts the media of a tool result for the wire.
func fromMediaList(ms []llm.Media) []*turnstilev1.Media {
	if len(ms) == 0 {
		return nil
	}
	out := make([]*turnstilev1.Media, len(ms))
	for i, m := range ms {
		out[i] = fromMedia(m)
	}
	return out
}

// maxResultMedia bounds the media of one tool result in a request.
const maxResultMedia = 100

// toResultMedia validates and converts the media of a tool result.
func toResultMedia(bad *violations, lim *mediaLimits, field string, ms []*turnstilev1.Media) []llm.Media {
	if len(ms) > maxResultMedia {
		bad.add(field, "at most %d are allowed, got %d", maxResultMedia, len(ms))
		return nil
	}
	var out []llm.Media
	for i, m := range ms {
		out = append(out, toMedia(bad, lim, fmt.Sprintf("%s[%d]", field, i), m))
	}
	return out
}
