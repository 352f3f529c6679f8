package server_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
)

// TestMediaURIsToInternalHosts: the red team's media URIs (issue 38)
// naming the loopback address, the clouds' metadata address and [::1]
// were passed to the provider, which fetches them. With the default
// refused hosts each is INVALID_ARGUMENT naming the part's uri, before any
// event and any model call; a public URI is passed on.
func TestMediaURIsToInternalHosts(t *testing.T) {
	t.Parallel()
	p := fake.NewProvider(fake.Reply{Chunks: fake.Text("a cat")})
	hosts, problems := runtime.ParseHostRules(runtime.DefaultRefusedMediaHosts())
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	retry := policy.DefaultRetry()
	retry.InitialBackoff, retry.MaxBackoff = time.Millisecond, 2*time.Millisecond
	r, err := runtime.New([]*runtime.Model{{Alias: "vision", ProviderName: "fake", Provider: mediaProvider{p}, ID: "v-1", Retry: retry}},
		"vision", nil, runtime.WithRefusedMediaHosts(hosts))
	if err != nil {
		t.Fatal(err)
	}
	ts := start(t, r, server.Options{})
	shot := func(uri string) *turnstilev1.Part {
		return &turnstilev1.Part{Kind: &turnstilev1.Part_ToolResult{ToolResult: &turnstilev1.ToolResult{
			CallId: "c1", Name: "lookup", Content: "shot", Media: []*turnstilev1.Media{{MimeType: "image/png", Source: &turnstilev1.Media_Uri{Uri: uri}}},
		}}}
	}
	req := &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{
		msg(user, text("look"), mediaURI("image/png", "https://127.0.0.1/a.png"), mediaURI("image/png", "https://169.254.169.254/latest/meta-data/"),
			mediaURI("image/png", "https://[::1]/a.png"), mediaURI("image/png", "https://example.com/a.png")),
		msg(assistant, call("c1")),
		msg(tool, shot("https://2130706433/a.png")),
	}}
	evs, st := wiretest.Collect(t, t.Context(), ts.client, req, nil)
	if len(evs) != 0 || st.Code() != codes.InvalidArgument {
		t.Fatalf("%d events, status %v", len(evs), st)
	}
	got, all := violationsOf(st)
	want := []string{"messages[0].parts[1].media.uri", "messages[0].parts[2].media.uri", "messages[0].parts[3].media.uri",
		"messages[2].parts[0].tool_result.media[0].uri"}
	if !slices.Equal(got, want) {
		t.Errorf("violations:\n got %q\nwant %q", got, want)
	}
	for _, says := range []string{"(refused: loopback)", "(refused: link_local)"} {
		if !strings.Contains(all, says) {
			t.Errorf("descriptions %q do not say %q", all, says)
		}
	}
	if n := len(p.Requests()); n != 0 {
		t.Errorf("the provider was called %d times", n)
	}

	req = &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{msg(user, text("look"), mediaURI("image/png", "https://example.com/a.png"))}}
	if _, st := wiretest.Collect(t, t.Context(), ts.client, req, nil); st.Code() != codes.OK {
		t.Fatalf("a public URI: %v", st)
	}
	if m := p.Requests()[0].Messages[0].Parts[1].Media; m == nil || m.URI != "https://example.com/a.png" {
		t.Errorf("the provider got %+v", m)
	}
}
