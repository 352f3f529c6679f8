package telemetry_test

import (
	"context"
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/telemetry"
)

// TestMediaOnSpans: a chat span counts the media its request carries and
// lists their types; with content capture, each media is a part holding
// its modality, type and size, never its bytes or its URI.
func TestMediaOnSpans(t *testing.T) {
	for _, capture := range []bool{false, true} {
		p := newPipeline(t)
		req := userTurn("what is in these?")
		req.Messages[0].Parts = append(req.Messages[0].Parts,
			llm.MediaPart(llm.Media{MIMEType: "image/png", Data: []byte("SECRETPIXELS")}),
			llm.MediaPart(llm.Media{MIMEType: "application/pdf", URI: "https://example.com/a.pdf?sig=SECRETSIG"}),
			llm.MediaPart(llm.Media{MIMEType: "image/png", Data: []byte("MORE")}),
		)
		r, err := runtime.New([]*runtime.Model{{Alias: "v", ProviderName: "oai", Provider: fake.NewProvider(fake.Reply{Chunks: fake.Text("a cat")}), ID: "v-id", Retry: fastRetry()}},
			"v", nil, runtime.WithObserver(observer(t, p, telemetry.ObserverOptions{CaptureContent: capture})))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Run(t.Context(), req, runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil })); err != nil {
			t.Fatal(err)
		}
		chat := attrs(named(t, p.spans.Ended(), "chat v-id", 0))
		if chat["turnstile.request.media.count"] != "3" || chat["turnstile.request.media.types"] != `["application/pdf","image/png"]` {
			t.Errorf("capture %v: media attributes %q, %q", capture, chat["turnstile.request.media.count"], chat["turnstile.request.media.types"])
		}
		in := chat["gen_ai.input.messages"]
		want := `{"type":"media","modality":"image","mime_type":"image/png","size":12},` +
			`{"type":"media","modality":"pdf","mime_type":"application/pdf","by_uri":true},` +
			`{"type":"media","modality":"image","mime_type":"image/png","size":4}`
		if capture != strings.Contains(in, want) {
			t.Errorf("capture %v: input messages %s", capture, in)
		}
		for _, span := range p.spans.Ended() {
			for _, kv := range span.Attributes() {
				if v := kv.Value.Emit(); strings.Contains(v, "SECRET") {
					t.Errorf("span %s: %s holds the media: %s", span.Name(), kv.Key, v)
				}
			}
		}
	}
}
