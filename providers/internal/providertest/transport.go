package providertest

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/turnstile-dev/turnstile/llm"
	"golang.org/x/net/http2"
)

// Adapter describes the provider under test to [TransportFailures].
type Adapter struct {
	// New returns the provider under test, talking to the server at
	// baseURL (scheme, host and port, without any API path) through
	// client. It fails tb when the provider cannot be built.
	New func(tb testing.TB, baseURL string, client *http.Client) llm.Provider
	// Request is the request each test streams.
	Request *llm.Request
	// Prefix is the start of a well-formed streamed reply, without its
	// terminal marker, in the provider's wire format.
	Prefix string
	// PrefixChunks are the chunks the provider yields for Prefix; the
	// last one must be a [llm.ChunkText].
	PrefixChunks []llm.Chunk
}

// TransportFailures runs the transport conformance tests every adapter
// must pass, each as a parallel subtest: a refused connection, a reset
// before the response headers and one mid-body, a body cut short over
// HTTP/1.1 and an HTTP/2 stream reset mid-body are [llm.KindNetwork]
// failures, costing exactly one request where the server sees it; the
// client's own timeout is [llm.KindTimeout]; the caller's cancellation
// mid-stream and the caller's deadline come back as the caller's context
// error (CANCELLED and DEADLINE_EXCEEDED), promptly.
func TransportFailures(t *testing.T, a Adapter) {
	t.Helper()
	if n := len(a.PrefixChunks); n == 0 || a.PrefixChunks[n-1].Kind != llm.ChunkText {
		t.Fatalf("Adapter.PrefixChunks = %+v, want chunks ending with text", a.PrefixChunks)
	}
	collect := func(t *testing.T, p llm.Provider) ([]llm.Chunk, error) {
		t.Helper()
		return Collect(t, t.Context(), p, a.Request)
	}
	// provider returns the adapter's provider for s, with s's client.
	provider := func(t *testing.T, s *httptest.Server) llm.Provider {
		t.Helper()
		return a.New(t, s.URL, Client(t, s))
	}
	wantPrefix := func(t *testing.T, chunks []llm.Chunk) {
		t.Helper()
		if diff := cmp.Diff(a.PrefixChunks, chunks); diff != "" {
			t.Errorf("chunks (-want +got), want the partial reply:\n%s", diff)
		}
	}

	t.Run("connection refused", func(t *testing.T) {
		t.Parallel()
		_, err := collect(t, a.New(t, RefusedURL(t), &http.Client{}))
		if e := AsError(t, err); e.Kind != llm.KindNetwork || e.Message != "connection refused" {
			t.Errorf("error = %+v, want NETWORK connection refused", e)
		}
	})
	t.Run("reset before headers", func(t *testing.T) {
		t.Parallel()
		s := NewServer(t, func(w http.ResponseWriter, r *http.Request) { ResetConnection(w) })
		_, err := collect(t, provider(t, s.Server))
		if e := AsError(t, err); e.Kind != llm.KindNetwork {
			t.Errorf("error = %+v, want NETWORK", e)
		}
		if n := s.Requests(); n != 1 {
			t.Errorf("requests = %d, want 1 (SDK retries must be off)", n)
		}
	})
	t.Run("reset mid-body", func(t *testing.T) {
		t.Parallel()
		s := NewServer(t, func(w http.ResponseWriter, r *http.Request) {
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				panic(err)
			}
			_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + a.Prefix)
			_ = buf.Flush()
			time.Sleep(50 * time.Millisecond)
			reset(conn)
		})
		chunks, err := collect(t, provider(t, s.Server))
		wantPrefix(t, chunks)
		if e := AsError(t, err); e.Kind != llm.KindNetwork {
			t.Errorf("error = %+v, want NETWORK", e)
		}
		if n := s.Requests(); n != 1 {
			t.Errorf("requests = %d, want 1", n)
		}
	})
	t.Run("body cut short", func(t *testing.T) {
		t.Parallel()
		s := NewServer(t, func(w http.ResponseWriter, r *http.Request) {
			WriteSSE(w, a.Prefix)
			panic(http.ErrAbortHandler)
		})
		chunks, err := collect(t, provider(t, s.Server))
		wantPrefix(t, chunks)
		if e := AsError(t, err); e.Kind != llm.KindNetwork {
			t.Errorf("error = %+v, want NETWORK", e)
		}
		if n := s.Requests(); n != 1 {
			t.Errorf("requests = %d, want 1 (no retry, no automatic continuation)", n)
		}
	})
	t.Run("HTTP/2 RST_STREAM mid-body", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			WriteSSE(w, a.Prefix)
			panic(http.ErrAbortHandler) // HTTP/2: RST_STREAM INTERNAL_ERROR
		}))
		srv.EnableHTTP2 = true
		srv.StartTLS()
		t.Cleanup(srv.Close)
		chunks, err := collect(t, provider(t, srv))
		wantPrefix(t, chunks)
		e := AsError(t, err)
		var se http2.StreamError
		if e.Kind != llm.KindNetwork || !errors.As(e, &se) {
			t.Errorf("error = %+v (%v), want NETWORK from an HTTP/2 stream error", e, e.Err)
		}
	})
	t.Run("client timeout", func(t *testing.T) {
		t.Parallel()
		release := make(chan struct{})
		s := NewServer(t, func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		})
		defer close(release)
		_, err := collect(t, a.New(t, s.URL, &http.Client{Timeout: 50 * time.Millisecond}))
		if e := AsError(t, err); e.Kind != llm.KindTimeout {
			t.Errorf("error = %+v, want TIMEOUT", e)
		}
	})
	t.Run("cancel mid-stream", func(t *testing.T) {
		t.Parallel()
		s := NewServer(t, func(w http.ResponseWriter, r *http.Request) {
			WriteSSE(w, a.Prefix)
			<-r.Context().Done()
		})
		p := provider(t, s.Server)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		start := time.Now()
		var got error
		for c, err := range p.Stream(ctx, a.Request) {
			if err != nil {
				got = err
				break
			}
			if c.Kind == llm.ChunkText {
				cancel()
			}
		}
		if !errors.Is(got, context.Canceled) {
			t.Errorf("error = %v, want context.Canceled", got)
		}
		if llm.KindOf(got) != llm.KindCancelled {
			t.Errorf("KindOf = %v, want CANCELLED", llm.KindOf(got))
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("Stream took %v to stop after cancel", d)
		}
	})
	t.Run("caller deadline wins over timeout", func(t *testing.T) {
		t.Parallel()
		s := NewServer(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		_, err := Collect(t, ctx, provider(t, s.Server), a.Request)
		if !errors.Is(err, context.DeadlineExceeded) || llm.KindOf(err) != llm.KindDeadlineExceeded {
			t.Errorf("error = %v, want the caller's deadline", err)
		}
	})
}
