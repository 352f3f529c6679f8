package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
)

// TestMCPImageReachesModel: a real MCP server's tool returns an image,
// audio and a PDF; they reach the model's request (the simulator, as the
// model, describes what it received) and the client gets them in the tool
// message's message_completed. An image over the step's
// turn.max_tool_result_bytes is dropped with a note, so no event exceeds
// its bound.
func TestMCPImageReachesModel(t *testing.T) {
	w := serveYAML(t, mcpConfig(t, filepath.Join(t.TempDir(), "a"), "turn: {max_tool_result_bytes: 4096}\n"))
	tests := []struct {
		name, prompt string
		media        []string // types in the tool message
		answer       string
		content      string
	}{
		{
			name:    "passed through",
			prompt:  `[sim tool=screenshot] what is on screen?`,
			media:   []string{"image/png", "audio/wav", "application/pdf"},
			answer:  "The screenshot tool returned the screen [image image/svg+xml, 6 bytes]. I received 3 media: image/png of 68 bytes; audio/wav of 12 bytes; application/pdf of 8 bytes named 'q3.pdf'.",
			content: "the screen\n[image image/svg+xml, 6 bytes]",
		},
		{
			name:    "image over the step's budget",
			prompt:  `[sim tool=screenshot args={"bytes":8000}] what is on screen?`,
			media:   []string{"audio/wav", "application/pdf"},
			answer:  "I received 2 media: audio/wav of 12 bytes; application/pdf of 8 bytes named 'q3.pdf'.",
			content: "[turnstile: the tool's image/png of 8000 bytes was dropped: over max_tool_result_bytes]",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs, st := wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: wiretest.UserText(tt.prompt)}, nil)
			if st.Code() != codes.OK {
				t.Fatalf("status %v", st)
			}
			if got, want := wiretest.Names(evs), strings.ReplaceAll(toolTurn, "%s", ""); got != want {
				t.Errorf("events:\n got %s\nwant %s", got, want)
			}
			var result *turnstilev1.ToolResult
			var answer string
			for _, ev := range evs {
				m := ev.GetMessageCompleted().GetMessage()
				switch m.GetRole() {
				case turnstilev1.Role_ROLE_TOOL:
					result = m.GetParts()[0].GetToolResult()
				case turnstilev1.Role_ROLE_ASSISTANT:
					answer += m.GetParts()[0].GetText()
				}
			}
			var types []string
			for _, m := range result.GetMedia() {
				types = append(types, m.GetMimeType())
			}
			if strings.Join(types, " ") != strings.Join(tt.media, " ") || !strings.Contains(result.GetContent(), tt.content) {
				t.Errorf("tool result: media %v, content %q; want %v and %q", types, result.GetContent(), tt.media, tt.content)
			}
			if !strings.Contains(answer, tt.answer) {
				t.Errorf("answer %q, want it to hold %q", answer, tt.answer)
			}
		})
	}
}

// TestMCPMediaLeftOutForModel: a model configured without images and audio
// (models.ALIAS.input) does not get a tool's image and audio: each is left
// out of what it is sent, with a note, while the client still gets them in
// the tool message; the PDF it takes reaches it.
func TestMCPMediaLeftOutForModel(t *testing.T) {
	w := serveYAML(t, fmt.Sprintf(`
providers:
  sim: {type: simulator, token_delay: -1ns}
models:
  sim: {provider: sim, model: turnstile-sim-1, input: [text, pdf]}
mcp_servers:
  test:
    command: %s
`, mcpServerBinary(t)))
	evs, st := wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: wiretest.UserText(`[sim tool=screenshot] what is on screen?`)}, nil)
	if st.Code() != codes.OK {
		t.Fatalf("status %v", st)
	}
	var media int
	var answer string
	for _, ev := range evs {
		m := ev.GetMessageCompleted().GetMessage()
		switch m.GetRole() {
		case turnstilev1.Role_ROLE_TOOL:
			media = len(m.GetParts()[0].GetToolResult().GetMedia())
		case turnstilev1.Role_ROLE_ASSISTANT:
			answer += m.GetParts()[0].GetText()
		}
	}
	if media != 3 {
		t.Errorf("the client got %d media in the tool message, want 3", media)
	}
	for _, want := range []string{
		`[turnstile: the tool's image/png of 68 bytes was left out: model "sim" cannot take image input`,
		"I received 1 media file: application/pdf of 8 bytes named 'q3.pdf'.",
	} {
		if !strings.Contains(answer, want) {
			t.Errorf("answer %q lacks %q", answer, want)
		}
	}
}

// TestMediaThroughAdapters: each real adapter, built from a config as
// serve builds it, takes an image to its provider's native form on a fake
// upstream, and what its provider type cannot take (audio on OpenAI's
// gpt-4.1-mini and on Anthropic, a PDF by URI on OpenAI) is refused with
// INVALID_ARGUMENT naming the part and the model, before any call; so is a
// URI naming a refused host, whatever the model.
func TestMediaThroughAdapters(t *testing.T) {
	native := map[string]string{
		"openai": `{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}`,
		// The newest message's last block carries a prompt cache mark
		// (models.ALIAS.prompt_cache: auto, the default).
		"anthropic": `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="},"cache_control":{"type":"ephemeral"}}`,
		"gemini":    `{"inlineData":{"data":"iVBORw0KGgo=","mimeType":"image/png"}}`,
	}
	refused := map[string][]*turnstilev1.Part{
		"openai":    {image("audio/wav", "UklGRg=="), uriMedia("application/pdf", "https://example.com/a.pdf")},
		"anthropic": {image("audio/wav", "UklGRg==")},
	}
	for _, pc := range providerCases(t) {
		t.Run(pc.typ, func(t *testing.T) {
			t.Setenv(pc.keyEnv, "test-key-0123456789")
			up := newUpstream(t, pc.answer)
			w := serveYAML(t, providerYAML(pc, up.URL))
			send := func(parts ...*turnstilev1.Part) *status.Status {
				msgs := wiretest.UserText("what is it?")
				msgs[0].Parts = append(msgs[0].Parts, parts...)
				_, st := wiretest.Collect(t, t.Context(), w.client, &turnstilev1.RunTurnRequest{Messages: msgs}, nil)
				return st
			}
			if st := send(image("image/png", "iVBORw0KGgo=")); st.Code() != codes.OK {
				t.Fatalf("image: status %v", st)
			}
			var body any
			if err := json.Unmarshal([]byte(up.requests()[0]), &body); err != nil {
				t.Fatal(err)
			}
			compact, _ := json.Marshal(body) // keys sorted, as the want's are compared
			var want any
			_ = json.Unmarshal([]byte(native[pc.typ]), &want)
			part, _ := json.Marshal(want)
			if !strings.Contains(string(compact), string(part)) {
				t.Errorf("request body %s lacks %s", compact, part)
			}
			for _, p := range refused[pc.typ] {
				st := send(p)
				if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "messages[0].parts[1].media") || !strings.Contains(st.Message(), `model "m"`) {
					t.Errorf("%v: status %v", p.GetMedia().GetMimeType(), st)
				}
			}
			// server.refused_media_hosts' default: the provider would
			// fetch the cloud's metadata.
			st := send(uriMedia("image/png", "https://169.254.169.254/latest/meta-data/"))
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "messages[0].parts[1].media.uri") ||
				!strings.Contains(st.Message(), "(refused: link_local)") {
				t.Errorf("a metadata URI: status %v", st)
			}
			if n := len(up.requests()); n != 1 {
				t.Errorf("the upstream got %d requests, want 1: refusals call nothing", n)
			}
		})
	}
}

// image is a media part of base64 data.
func image(mime, b64 string) *turnstilev1.Part {
	data, _ := base64.StdEncoding.DecodeString(b64)
	return &turnstilev1.Part{Kind: &turnstilev1.Part_Media{Media: &turnstilev1.Media{MimeType: mime, Source: &turnstilev1.Media_Data{Data: data}}}}
}

func uriMedia(mime, uri string) *turnstilev1.Part {
	return &turnstilev1.Part{Kind: &turnstilev1.Part_Media{Media: &turnstilev1.Media{MimeType: mime, Source: &turnstilev1.Media_Uri{Uri: uri}}}}
}
