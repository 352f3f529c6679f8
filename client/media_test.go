package client_test

import (
	"testing"

	"github.com/turnstile-dev/turnstile/client"
)

func TestMediaType(t *testing.T) {
	png := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
	for _, tt := range []struct {
		name string
		data []byte
		want string
	}{
		{"shot.PNG", nil, "image/png"},
		{"photo.jpeg", nil, "image/jpeg"},
		{"talk.mp3", nil, "audio/mpeg"},
		{"shot", png, "image/png"},
		{"report", []byte("%PDF-1.7\n"), "application/pdf"},
		{"voice", []byte("RIFF\x24\x00\x00\x00WAVEfmt "), "audio/wav"},
		{"notes", []byte("plain words"), "text/plain"},
	} {
		if got := client.MediaType(tt.name, tt.data); got != tt.want {
			t.Errorf("MediaType(%q) = %q, want %q", tt.name, got, tt.want)
		}
	}
	p := client.MediaPart(png, "", "/tmp/dir/shot").GetMedia()
	if p.GetMimeType() != "image/png" || p.GetName() != "shot" || string(p.GetData()) != string(png) {
		t.Errorf("MediaPart = %v", p)
	}
	if p := client.MediaPart(png, "image/webp", "").GetMedia(); p.GetMimeType() != "image/webp" || p.GetName() != "" {
		t.Errorf("MediaPart with a type and no name = %v", p)
	}
	if u := client.MediaURIPart("https://example.com/a.pdf", "application/pdf").GetMedia(); u.GetUri() != "https://example.com/a.pdf" {
		t.Errorf("MediaURIPart = %v", u)
	}
}
