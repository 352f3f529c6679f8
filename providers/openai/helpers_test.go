package openai

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/turnstile-dev/turnstile/runtime"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testKey = "sk-test-0123456789abcdef"

// fake is an OpenAI-compatible server that counts its requests.
type fake struct {
	*httptest.Server
	requests atomic.Int32
	mu       sync.Mutex
	bodies   [][]byte
	headers  []http.Header
}

func newFake(t testing.TB, h http.HandlerFunc) *fake {
	t.Helper()
	f := &fake{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.requests.Add(1)
		// Read the whole body, as real servers do: it also lets the server
		// notice a client that goes away.
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.bodies = append(f.bodies, b)
		f.headers = append(f.headers, r.Header.Clone())
		f.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fake) provider(t testing.TB) *Provider {
	t.Helper()
	client := f.Client()
	t.Cleanup(client.CloseIdleConnections)
	p, err := New(Config{Name: "oa", BaseURL: f.URL + "/v1", APIKey: testKey, HTTPClient: client,
		Headers: map[string]string{"X-Extra": "yes"}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// writeSSE writes body event by event, flushing after each, as a real
// server does.
func writeSSE(w http.ResponseWriter, body string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	for ev := range strings.SplitAfterSeq(body, "\n\n") {
		if ev == "" {
			continue
		}
		_, _ = w.Write([]byte(ev))
		w.(http.Flusher).Flush()
	}
}

func fixture(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// collect runs one Stream and returns its chunks and its error, checking
// that an error comes once and last.
func collect(t testing.TB, p *Provider, req *runtime.Request) ([]runtime.Chunk, error) {
	t.Helper()
	return collectCtx(t, t.Context(), p, req)
}

func collectCtx(t testing.TB, ctx context.Context, p *Provider, req *runtime.Request) ([]runtime.Chunk, error) {
	t.Helper()
	var (
		chunks []runtime.Chunk
		failed error
	)
	for c, err := range p.Stream(ctx, req) {
		if failed != nil {
			t.Fatalf("chunk %+v after error %v", c, failed)
		}
		if err != nil {
			if c != (runtime.Chunk{}) {
				t.Errorf("error %v came with chunk %+v", err, c)
			}
			failed = err
			continue
		}
		if len(chunks) > 0 && chunks[len(chunks)-1].Kind == runtime.ChunkStop {
			t.Fatalf("chunk %+v after stop", c)
		}
		chunks = append(chunks, c)
	}
	return chunks, failed
}

func asError(t testing.TB, err error) *runtime.Error {
	t.Helper()
	var e *runtime.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a *runtime.Error", err, err)
	}
	return e
}

var simpleRequest = &runtime.Request{
	Model:    "gpt-4o",
	Messages: []runtime.Message{{Role: runtime.RoleUser, Parts: []runtime.Part{runtime.TextPart("hi")}}},
}
