package server_test

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
)

// mediaProvider is the fake provider with what a media-taking adapter
// says of itself: it takes every kind and fetches images by URI.
type mediaProvider struct{ *fake.Provider }

func (mediaProvider) Inputs(string) []llm.Modality   { return llm.Modalities }
func (mediaProvider) FetchesURI(m llm.Modality) bool { return m == llm.ModalityImage }

func image(mime string, data []byte) *turnstilev1.Part {
	return &turnstilev1.Part{Kind: &turnstilev1.Part_Media{Media: &turnstilev1.Media{MimeType: mime, Source: &turnstilev1.Media_Data{Data: data}}}}
}

func mediaURI(mime, uri string) *turnstilev1.Part {
	return &turnstilev1.Part{Kind: &turnstilev1.Part_Media{Media: &turnstilev1.Media{MimeType: mime, Source: &turnstilev1.Media_Uri{Uri: uri}}}}
}

// mediaRunner serves "vision" (every kind of input; falls back to "texty"
// and "docs"), "texty" (text only: its provider says nothing of media)
// and "docs" (configured to take text and pdf).
func mediaRunner(t *testing.T, p *fake.Provider) *runtime.Runner {
	t.Helper()
	retry := policy.DefaultRetry()
	retry.InitialBackoff, retry.MaxBackoff = time.Millisecond, 2*time.Millisecond
	r, err := runtime.New([]*runtime.Model{
		{Alias: "vision", ProviderName: "fake", Provider: mediaProvider{p}, ID: "v-1", Retry: retry, Fallbacks: []string{"texty", "docs"}},
		{Alias: "texty", ProviderName: "fake", Provider: p, ID: "t-1", Retry: retry},
		{Alias: "docs", ProviderName: "fake", Provider: mediaProvider{p}, ID: "d-1", Retry: retry, Input: []llm.Modality{llm.ModalityText, llm.ModalityPDF}},
	}, "vision", nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestMediaValidation: each media mistake is INVALID_ARGUMENT naming the
// part's field, and a model that cannot take a part is named with it.
func TestMediaValidation(t *testing.T) {
	t.Parallel()
	ts := start(t, mediaRunner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("x")})), server.Options{MaxMediaBytes: 2048, MaxRequestMediaBytes: 2999})
	png := bytes.Repeat([]byte{1}, 1000)
	toolResultWith := func(media ...*turnstilev1.Media) *turnstilev1.Part {
		return &turnstilev1.Part{Kind: &turnstilev1.Part_ToolResult{ToolResult: &turnstilev1.ToolResult{CallId: "c1", Name: "lookup", Content: "ok", Media: media}}}
	}
	tests := []struct {
		name   string
		req    *turnstilev1.RunTurnRequest
		fields []string
		says   string
	}{
		{
			name: "type, source and name",
			req: &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{msg(user, text("look"),
				image("", png), image("image/tiff", png), image("image/png", nil),
				&turnstilev1.Part{Kind: &turnstilev1.Part_Media{Media: &turnstilev1.Media{MimeType: "image/png", Name: strings.Repeat("n", 300)}}},
			)}},
			fields: []string{"messages[0].parts[1].media.mime_type", "messages[0].parts[2].media.mime_type", "messages[0].parts[3].media.data",
				"messages[0].parts[4].media", "messages[0].parts[4].media.name"},
		},
		{
			name: "uris the server does not pass on",
			req: &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{msg(user, text("look"),
				mediaURI("image/png", "http://169.254.169.254/latest/meta-data"), mediaURI("image/png", "file:///etc/passwd"),
				mediaURI("image/png", "https://user:secret@example.com/a.png"), mediaURI("image/png", "/relative.png"),
				mediaURI("image/png", "https://example.com/"+strings.Repeat("a", 2100)),
			)}},
			fields: []string{"messages[0].parts[1].media.uri", "messages[0].parts[2].media.uri", "messages[0].parts[3].media.uri",
				"messages[0].parts[4].media.uri", "messages[0].parts[5].media.uri"},
		},
		{
			name: "sizes per part and per request",
			req: &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{
				msg(user, text("look"), image("image/png", bytes.Repeat([]byte{1}, 2049))),
				msg(user, image("image/png", png), image("image/jpeg", png), image("image/webp", png)),
			}},
			fields: []string{"messages[0].parts[1].media.data", "messages[1].parts[2].media"},
			says:   "server.max_request_media_bytes",
		},
		{
			name: "media in assistant and tool messages",
			req: &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{
				msg(user, text("hi")), msg(assistant, image("image/png", png), call("c1")), msg(tool, image("image/png", png), result("c1")),
			}},
			fields: []string{"messages[1].parts[0].media", "messages[2].parts[0].media"},
		},
		{
			name: "tool result media",
			req: &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{
				msg(user, text("hi")), msg(assistant, call("c1")),
				msg(tool, toolResultWith(&turnstilev1.Media{MimeType: "text/html", Source: &turnstilev1.Media_Data{Data: png}})),
			}},
			fields: []string{"messages[2].parts[0].tool_result.media[0].mime_type"},
		},
		{
			name:   "a model that cannot take images",
			req:    &turnstilev1.RunTurnRequest{Model: "texty", Messages: []*turnstilev1.Message{msg(user, text("look"), image("image/png", png))}},
			fields: []string{"messages[0].parts[1].media"},
			says:   `model "texty" cannot take image input (image/png)`,
		},
		{
			name:   "a model configured without images",
			req:    &turnstilev1.RunTurnRequest{Model: "docs", Messages: []*turnstilev1.Message{msg(user, text("look"), image("image/png", png), image("application/pdf", png))}},
			fields: []string{"messages[0].parts[1].media"},
			says:   "models.docs.input",
		},
		{
			name:   "a provider that does not fetch pdf by uri",
			req:    &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{msg(user, text("read"), mediaURI("application/pdf", "https://example.com/a.pdf"))}},
			fields: []string{"messages[0].parts[1].media"},
			says:   "send it as data",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs, st := wiretest.Collect(t, t.Context(), ts.client, tt.req, nil)
			if len(evs) != 0 || st.Code() != codes.InvalidArgument {
				t.Fatalf("%d events, status %v", len(evs), st)
			}
			got, all := violationsOf(st)
			if !slices.Equal(got, tt.fields) {
				t.Errorf("violations:\n got %q\nwant %q", got, tt.fields)
			}
			if !strings.Contains(all, tt.says) {
				t.Errorf("descriptions %q do not say %q", all, tt.says)
			}
			if strings.Contains(all, "secret") {
				t.Errorf("descriptions quote a URI's credentials: %q", all)
			}
		})
	}
}

func violationsOf(st *status.Status) (fields []string, descriptions string) {
	var all strings.Builder
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
				all.WriteString(v.GetDescription() + "\n")
			}
		}
	}
	return fields, all.String()
}

// TestMediaReachesProvider: a turn with an image and a tool result's
// media hands both to the provider as sent, its type normalised.
func TestMediaReachesProvider(t *testing.T) {
	t.Parallel()
	p := fake.NewProvider(fake.Reply{Chunks: fake.Text("a cat")})
	ts := start(t, mediaRunner(t, p), server.Options{})
	req := &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{
		msg(user, text("what is it?"), image("image/PNG; charset=x", []byte("\x89PNG"))),
		msg(assistant, call("c1")),
		msg(tool, &turnstilev1.Part{Kind: &turnstilev1.Part_ToolResult{ToolResult: &turnstilev1.ToolResult{
			CallId: "c1", Name: "lookup", Content: "shot", Media: []*turnstilev1.Media{{MimeType: "image/jpeg", Name: "s.jpg", Source: &turnstilev1.Media_Uri{Uri: "https://example.com/s.jpg"}}},
		}}}),
	}}
	evs, st := wiretest.Collect(t, t.Context(), ts.client, req, nil)
	if st.Code() != codes.OK || len(evs) == 0 {
		t.Fatalf("status %v", st)
	}
	reqs := p.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	got := reqs[0].Messages
	if m := got[0].Parts[1].Media; m == nil || m.MIMEType != "image/png" || string(m.Data) != "\x89PNG" {
		t.Errorf("user media = %+v", m)
	}
	if tm := got[2].Parts[0].ToolResult.Media; len(tm) != 1 || tm[0].MIMEType != "image/jpeg" || tm[0].Name != "s.jpg" || tm[0].URI != "https://example.com/s.jpg" || tm[0].Data != nil {
		t.Errorf("tool result media = %+v", tm)
	}
}

// TestMediaSkipsFallbacks: fallbacks that cannot take a turn's media are
// passed over. With a PDF, "vision" fails, "texty" (text only) is skipped
// and "docs" answers; with an image, "docs" cannot take it either, and the
// turn ends on vision's failure.
func TestMediaSkipsFallbacks(t *testing.T) {
	t.Parallel()
	notFound := fake.Reply{Err: &llm.Error{Kind: llm.KindNotFound, Message: "no such model"}}
	tests := []struct {
		name   string
		part   *turnstilev1.Part
		models []string
		code   codes.Code
	}{
		{"pdf", image("application/pdf", []byte("%PDF-1.7")), []string{"v-1", "d-1"}, codes.OK},
		{"image", image("image/png", []byte("\x89PNG")), []string{"v-1"}, codes.FailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := fake.NewProvider(notFound, fake.Reply{Chunks: fake.Text("read")})
			ts := start(t, mediaRunner(t, p), server.Options{})
			req := &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{msg(user, text("read it"), tt.part)}}
			_, st := wiretest.Collect(t, t.Context(), ts.client, req, nil)
			if st.Code() != tt.code {
				t.Errorf("status %v, want %v", st, tt.code)
			}
			var models []string
			for _, r := range p.Requests() {
				models = append(models, r.Model)
			}
			if !slices.Equal(models, tt.models) {
				t.Errorf("calls to %q, want %q", models, tt.models)
			}
		})
	}
}
