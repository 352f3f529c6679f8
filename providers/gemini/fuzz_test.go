package gemini

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
)

// FuzzStream feeds arbitrary bytes as the SSE body: the adapter must end
// with chunks or a classified error, never panic or hang.
func FuzzStream(f *testing.F) {
	for _, name := range []string{"gemini_ok.sse", "gemini_midstream_error.sse"} {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("data: {\"candidates\":[{\"finishReason\":\"STOP\"}]}\r\n\r\n"))
	f.Add([]byte("data: [\n\n{\"error\":{}}\n"))
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	p, err := New(Config{BaseURL: srv.URL, APIKey: testKey})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		body = b
		for _, err := range p.Stream(context.Background(), userRequest()) {
			if err != nil {
				break
			}
		}
	})
}
