package sim_test

import (
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
)

// TestDescribesMedia: the simulator's answer says what media it received
// (type, size, name; "by URI" for a URI), never the bytes or the URI.
func TestDescribesMedia(t *testing.T) {
	t.Parallel()
	p := newSim(t)
	secret := "SECRETBYTES"
	tests := []struct {
		name string
		msg  llm.Message
		want string
	}{
		{
			name: "image with a question",
			msg: llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("What is in it?"),
				llm.MediaPart(llm.Media{MIMEType: "image/png", Data: []byte(secret), Name: "cat.png"})}},
			want: " I received 1 media file: image/png of 11 bytes named 'cat.png'.",
		},
		{
			name: "media alone",
			msg: llm.Message{Role: llm.RoleUser, Parts: []llm.Part{
				llm.MediaPart(llm.Media{MIMEType: "application/pdf", URI: "https://example.com/a.pdf?token=" + secret}),
				llm.MediaPart(llm.Media{MIMEType: "audio/wav", Data: []byte("RIFF")}),
			}},
			want: " I received 2 media: application/pdf by URI; audio/wav of 4 bytes.",
		},
	}
	for _, tt := range tests {
		got := call(t, p, &llm.Request{Model: "m", Messages: []llm.Message{tt.msg}}).text()
		if !strings.HasSuffix(got, tt.want) {
			t.Errorf("%s: answer %q, want it to end %q", tt.name, got, tt.want)
		}
		if strings.Contains(got, secret) {
			t.Errorf("%s: answer %q quotes the media", tt.name, got)
		}
	}
}

// TestDescribesToolResultMedia: media in a tool result are described in
// the answer that follows the tool step.
func TestDescribesToolResultMedia(t *testing.T) {
	t.Parallel()
	p := newSim(t)
	c := llm.ToolCall{ID: "call_1", Name: "screenshot", Arguments: "{}"}
	msgs := append([]llm.Message{user("[sim tool=screenshot] show me")}, toolTurn([]llm.ToolCall{c}, "a screenshot")...)
	msgs[2].Parts[0].ToolResult.Media = []llm.Media{{MIMEType: "image/jpeg", Data: make([]byte, 2048)}}
	got := call(t, p, &llm.Request{Model: "m", Messages: msgs}).text()
	if want := "The screenshot tool returned a screenshot. I received 1 media file: image/jpeg of 2048 bytes. "; !strings.HasPrefix(got, want) {
		t.Errorf("answer %q, want it to start %q", got, want)
	}
}
