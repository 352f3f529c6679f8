package openai

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/providertest"
)

// TestPromptCacheKey holds the key to OpenAI's documented request field
// (prompt_cache_key, a string at the top level), sent only when set.
func TestPromptCacheKey(t *testing.T) {
	t.Parallel()
	body := providertest.Fixture(t, "openai_ok.sse")
	f := providertest.NewServer(t, func(w http.ResponseWriter, _ *http.Request) { providertest.WriteSSE(w, body) })
	p := provider(t, f)
	msgs := []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("hi")}}}
	for _, key := range []string{"ts-0123abcd", ""} {
		if _, err := providertest.Collect(t, t.Context(), p, &llm.Request{Model: "gpt-4o", Messages: msgs, PromptCacheKey: key}); err != nil {
			t.Fatalf("Stream: %v", err)
		}
	}
	want := `{"model": "gpt-4o", "stream": true, "stream_options": {"include_usage": true},
		"messages": [{"role": "user", "content": "hi"}]%s}`
	providertest.EqualJSON(t, f.Bodies()[0], fmt.Sprintf(want, `, "prompt_cache_key": "ts-0123abcd"`))
	providertest.EqualJSON(t, f.Bodies()[1], fmt.Sprintf(want, ""))
}
