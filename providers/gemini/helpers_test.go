package gemini

import (
	"net/http"
	"testing"

	"go.uber.org/goleak"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

func TestMain(m *testing.M) {
	// genai's dependencies start an opencensus worker at init.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
}

const testKey = "AIzaTest0123456789abcdef"

// newProvider returns a provider named "gm" for the fake Gemini server at
// baseURL, with testKey and an extra header.
func newProvider(tb testing.TB, baseURL string, client *http.Client) *Provider {
	tb.Helper()
	p, err := New(Config{Name: "gm", BaseURL: baseURL, APIKey: testKey, HTTPClient: client,
		Headers: map[string]string{"X-Extra": "yes"}})
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// provider returns newProvider for the fake server s, with s's client.
func provider(tb testing.TB, s *providertest.Server) *Provider {
	tb.Helper()
	return newProvider(tb, s.URL, providertest.Client(tb, s.Server))
}

var simpleRequest = &llm.Request{
	Model:    "gemini-2.5-flash",
	Messages: []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("hi")}}},
}
