package main

import (
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

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
