package llm

import (
	"encoding/json"
	"slices"
	"strings"
)

// Role says who authored a [Message].
type Role uint8

// The roles of a conversation.
const (
	// RoleUser is a message written by the person or program driving the turn.
	RoleUser Role = iota + 1
	// RoleAssistant is a message produced by the model.
	RoleAssistant
	// RoleTool is a message carrying the results of tool calls.
	RoleTool
)

// String returns the role's lower-case name.
func (r Role) String() string {
	switch r {
	case RoleUser:
		return "user"
	case RoleAssistant:
		return "assistant"
	case RoleTool:
		return "tool"
	}
	return "unspecified"
}

// Message is one entry of a conversation.
type Message struct {
	Role  Role
	Parts []Part
}

// PartKind says which field of a [Part] is set.
type PartKind uint8

// The kinds of [Part].
const (
	// PartText is plain text in Part.Text.
	PartText PartKind = iota + 1
	// PartThinking is model reasoning in Part.Text, with the provider's
	// opaque Part.Signature that must be sent back unchanged, to the API
	// that made it (Part.Signer).
	PartThinking
	// PartToolCall is a request from the model to run Part.ToolCall.
	PartToolCall
	// PartToolResult is the outcome of a tool call, in Part.ToolResult.
	PartToolResult
	// PartMedia is an image, a document or audio in Part.Media.
	PartMedia
)

// Part is one piece of a [Message]. Kind says which fields are meaningful.
type Part struct {
	Kind      PartKind
	Text      string
	Signature string
	// Signer names the API that made a thinking part's Signature
	// ([Capabilities].Signer); empty when unknown.
	Signer     string
	ToolCall   *ToolCall
	ToolResult *ToolResult
	Media      *Media
}

// TextPart returns a text part.
func TextPart(s string) Part { return Part{Kind: PartText, Text: s} }

// MediaPart returns a media part.
func MediaPart(m Media) Part { return Part{Kind: PartMedia, Media: &m} }

// Media is an image, a document or audio shown to the model: its bytes, or
// a URI the provider fetches (exactly one is set).
type Media struct {
	// MIMEType is the media's type, e.g. image/png.
	MIMEType string
	// Data is the media's bytes.
	Data []byte
	// URI locates the media for the provider to fetch.
	URI string
	// Name is an optional file name.
	Name string
}

// Modality is a kind of model input.
type Modality string

// The kinds of input a model may take.
const (
	ModalityText  Modality = "text"
	ModalityImage Modality = "image"
	ModalityPDF   Modality = "pdf"
	ModalityAudio Modality = "audio"
)

// Modalities lists every [Modality], in order.
var Modalities = []Modality{ModalityText, ModalityImage, ModalityPDF, ModalityAudio}

// mediaTypes maps each media type turnstile passes on to its modality.
var mediaTypes = map[string]Modality{
	"image/png":       ModalityImage,
	"image/jpeg":      ModalityImage,
	"image/gif":       ModalityImage,
	"image/webp":      ModalityImage,
	"application/pdf": ModalityPDF,
	"audio/wav":       ModalityAudio,
	"audio/mpeg":      ModalityAudio,
}

// MediaTypes returns the media types turnstile passes on, sorted.
func MediaTypes() []string {
	out := make([]string, 0, len(mediaTypes))
	for t := range mediaTypes {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// ModalityOf returns the modality of a media type, false when the type is
// not one turnstile passes on. It takes the type as given: callers
// normalise it first ([NormalizeMediaType]).
func ModalityOf(mimeType string) (Modality, bool) {
	m, ok := mediaTypes[mimeType]
	return m, ok
}

// NormalizeMediaType returns a media type lower-cased, without
// parameters, and with its common aliases (image/jpg, audio/mp3,
// audio/x-wav, audio/wave) replaced by the registered name.
func NormalizeMediaType(t string) string {
	if i := strings.IndexByte(t, ';'); i >= 0 {
		t = t[:i]
	}
	t = strings.ToLower(strings.TrimSpace(t))
	switch t {
	case "image/jpg":
		return "image/jpeg"
	case "audio/mp3":
		return "audio/mpeg"
	case "audio/x-wav", "audio/wave", "audio/vnd.wave":
		return "audio/wav"
	}
	return t
}

// Size returns the bytes m carries: its data, or its URI.
func (m *Media) Size() int { return len(m.Data) + len(m.URI) }

// ToolCall is a model's request to run a tool.
type ToolCall struct {
	// ID identifies the call within the conversation; results name it.
	ID string
	// Name is the tool's name.
	Name string
	// Arguments is the call's arguments as JSON text (an object).
	Arguments string
}

// ToolResult is the outcome of one tool call.
type ToolResult struct {
	// CallID is the ID of the [ToolCall] this answers.
	CallID string
	// Name is the tool's name (some providers need it).
	Name string
	// Content is the result shown to the model.
	Content string
	// IsError reports that the tool failed; Content says why.
	IsError bool
	// Media is what the tool returned besides text (an MCP tool's images,
	// audio or documents), shown to the model after Content.
	Media []Media
}

// Text returns the concatenated text parts of m.
func (m Message) Text() string {
	var s string
	for _, p := range m.Parts {
		if p.Kind == PartText {
			s += p.Text
		}
	}
	return s
}

// ToolCalls returns the tool calls of m, in order.
func (m Message) ToolCalls() []ToolCall {
	var calls []ToolCall
	for _, p := range m.Parts {
		if p.Kind == PartToolCall && p.ToolCall != nil {
			calls = append(calls, *p.ToolCall)
		}
	}
	return calls
}

// Usage counts the tokens of one model call or, summed, of a turn.
type Usage struct {
	InputTokens      int64
	OutputTokens     int64
	CacheReadTokens  int64
	CacheWriteTokens int64
	// Cost is what the tokens cost at the model's price: set by the
	// runtime, never by a provider; unknown when no call was priced.
	Cost Cost
}

// Add returns the sum of u and v.
func (u Usage) Add(v Usage) Usage {
	return Usage{
		InputTokens:      u.InputTokens + v.InputTokens,
		OutputTokens:     u.OutputTokens + v.OutputTokens,
		CacheReadTokens:  u.CacheReadTokens + v.CacheReadTokens,
		CacheWriteTokens: u.CacheWriteTokens + v.CacheWriteTokens,
		Cost:             u.Cost.Add(v.Cost),
	}
}

// Tokens returns the tokens u counts, every class summed.
func (u Usage) Tokens() int64 {
	return u.InputTokens + u.OutputTokens + u.CacheReadTokens + u.CacheWriteTokens
}

// IsZero reports whether u counts nothing.
func (u Usage) IsZero() bool { return u == Usage{} }

// ToolSpec describes a tool to the model.
type ToolSpec struct {
	// Name is the tool's unique name.
	Name string
	// Description tells the model what the tool does.
	Description string
	// Schema is the JSON Schema of the tool's arguments (an object schema).
	// Empty means {"type":"object"}.
	Schema json.RawMessage
	// ReadOnly reports that the tool changes nothing (MCP readOnlyHint).
	ReadOnly bool
	// Idempotent reports that running the tool twice with the same
	// arguments has the same effect as once (MCP idempotentHint).
	Idempotent bool
}
