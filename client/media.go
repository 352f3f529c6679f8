package client

import (
	"net/http"
	"path/filepath"
	"strings"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// extensionTypes maps the file extensions of the media types the server
// takes to those types.
var extensionTypes = map[string]string{
	".png":  "image/png",
	".jpg":  "image/jpeg",
	".jpeg": "image/jpeg",
	".gif":  "image/gif",
	".webp": "image/webp",
	".pdf":  "application/pdf",
	".wav":  "audio/wav",
	".mp3":  "audio/mpeg",
}

// MediaType returns the media type of a file named name holding data: by
// its extension when it is one of the server's types (.png, .jpg, .jpeg,
// .gif, .webp, .pdf, .wav, .mp3), else sniffed from data's first bytes
// ([http.DetectContentType]), without parameters.
func MediaType(name string, data []byte) string {
	if t, ok := extensionTypes[strings.ToLower(filepath.Ext(name))]; ok {
		return t
	}
	t, _, _ := strings.Cut(http.DetectContentType(data), ";")
	if t == "audio/wave" {
		return "audio/wav"
	}
	return t
}

// MediaPart returns a user message part holding data as media (an image,
// a PDF, audio) named name (optional; a path is cut to its file name). An
// empty mimeType is worked out by [MediaType].
func MediaPart(data []byte, mimeType, name string) *turnstilev1.Part {
	if mimeType == "" {
		mimeType = MediaType(name, data)
	}
	if name != "" {
		name = filepath.Base(name)
	}
	return &turnstilev1.Part{Kind: &turnstilev1.Part_Media{Media: &turnstilev1.Media{
		MimeType: mimeType, Name: name, Source: &turnstilev1.Media_Data{Data: data},
	}}}
}

// MediaURIPart returns a user message part of media the provider fetches
// from uri (https); the server never fetches it.
func MediaURIPart(uri, mimeType string) *turnstilev1.Part {
	return &turnstilev1.Part{Kind: &turnstilev1.Part_Media{Media: &turnstilev1.Media{
		MimeType: mimeType, Source: &turnstilev1.Media_Uri{Uri: uri},
	}}}
}
