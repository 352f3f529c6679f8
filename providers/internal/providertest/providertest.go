// Package providertest holds the test helpers that the provider adapters
// under providers/ share: a fake upstream server that records what it is
// sent, SSE and fixture helpers, a stream collector that checks the
// [llm.Provider] stream invariants, and [TransportFailures], the
// conformance tests every adapter must pass for transport failures.
//
// It is imported only by tests (_test.go files); no production package may
// depend on it. It imports only the standard library, runtime, go-cmp and
// golang.org/x/net/http2, and knows no provider or SDK.
package providertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/turnstile-dev/turnstile/llm"
)

// Server is a fake upstream: an [httptest.Server] that counts its requests
// and records each one's body and headers before handing it on.
type Server struct {
	*httptest.Server

	requests atomic.Int32
	mu       sync.Mutex
	bodies   [][]byte
	headers  []http.Header
}

// NewServer starts a fake upstream that records every request and then
// calls h. The server is closed when the test ends.
func NewServer(tb testing.TB, h http.HandlerFunc) *Server {
	tb.Helper()
	s := &Server{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		// Read the whole body, as real servers do: it also lets the server
		// notice a client that goes away.
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.bodies = append(s.bodies, b)
		s.headers = append(s.headers, r.Header.Clone())
		s.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(b)) // the handler may read it too
		h(w, r)
	}))
	tb.Cleanup(s.Close)
	return s
}

// Requests reports how many requests the server has received.
func (s *Server) Requests() int { return int(s.requests.Load()) }

// Bodies returns the request bodies received so far, in order.
func (s *Server) Bodies() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]byte(nil), s.bodies...)
}

// Headers returns the request headers received so far, in order.
func (s *Server) Headers() []http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]http.Header(nil), s.headers...)
}

// WriteSSE answers with a 200 text/event-stream response and writes body
// event by event, flushing after each, as a real server does. Events are
// separated by a blank line: "\n\n", or "\r\n\r\n" when body uses that.
func WriteSSE(w http.ResponseWriter, body string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	sep := "\n\n"
	if strings.Contains(body, "\r\n\r\n") {
		sep = "\r\n\r\n"
	}
	for ev := range strings.SplitAfterSeq(body, sep) {
		if ev == "" {
			continue
		}
		_, _ = w.Write([]byte(ev))
		w.(http.Flusher).Flush()
	}
}

// Fixture returns the contents of testdata/name, failing the test when it
// cannot be read.
func Fixture(tb testing.TB, name string) string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// Collect runs one Stream of p with ctx and returns its chunks and its
// error. It fails the test when the stream breaks an invariant: an error
// that comes with a chunk, anything after an error (an error comes at most
// once, and last), or anything after a [llm.ChunkStop].
func Collect(tb testing.TB, ctx context.Context, p llm.Provider, req *llm.Request) ([]llm.Chunk, error) {
	tb.Helper()
	var (
		chunks []llm.Chunk
		failed error
	)
	for c, err := range p.Stream(ctx, req) {
		if failed != nil {
			tb.Fatalf("chunk %+v after error %v", c, failed)
		}
		if err != nil {
			if c != (llm.Chunk{}) {
				tb.Errorf("error %v came with chunk %+v", err, c)
			}
			failed = err
			continue
		}
		if len(chunks) > 0 && chunks[len(chunks)-1].Kind == llm.ChunkStop {
			tb.Fatalf("chunk %+v after stop", c)
		}
		chunks = append(chunks, c)
	}
	return chunks, failed
}

// AsError returns err as a [*llm.Error], failing the test when it is
// not one.
func AsError(tb testing.TB, err error) *llm.Error {
	tb.Helper()
	var e *llm.Error
	if !errors.As(err, &e) {
		tb.Fatalf("error %v (%T) is not a *runtime.Error", err, err)
	}
	return e
}

// RefusedURL returns an http:// URL on a loopback port that was just
// listened on and closed, so a connection to it is refused.
func RefusedURL(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		tb.Fatal(err)
	}
	return "http://" + addr
}

// ResetConnection takes over the connection behind w and closes it with
// SO_LINGER 0, so the client sees a TCP reset (ECONNRESET) rather than an
// orderly close. It panics when w cannot be hijacked or is not TCP; call
// it from a handler of an HTTP/1 test server.
func ResetConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	reset(conn)
}

// reset closes conn, a TCP connection, with SO_LINGER 0.
func reset(conn net.Conn) {
	if err := conn.(*net.TCPConn).SetLinger(0); err != nil {
		panic(err)
	}
	_ = conn.Close()
}

// Client returns s's client, whose idle connections are closed when the
// test ends.
func Client(tb testing.TB, s *httptest.Server) *http.Client {
	tb.Helper()
	client := s.Client()
	tb.Cleanup(client.CloseIdleConnections)
	return client
}

// EqualJSON reports, as a test error, how the JSON document got differs
// from want, compared as decoded values (key order and spacing aside).
func EqualJSON(tb testing.TB, got []byte, want string) {
	tb.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		tb.Fatalf("decoding %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		tb.Fatalf("decoding the wanted JSON: %v", err)
	}
	if diff := cmp.Diff(w, g); diff != "" {
		tb.Errorf("request body (-want +got):\n%s", diff)
	}
}

// CheckYield returns a yield function for a stream that fails tb on a
// chunk after an error and on an error that is not a [*llm.Error], and
// end, which fails tb unless the stream ended with a [llm.ChunkStop]
// or an error. Fuzz tests use it on whatever the decoder yields.
func CheckYield(tb testing.TB) (yield func(llm.Chunk, error) bool, end func()) {
	var (
		last   llm.Chunk
		failed bool
		n      int
	)
	yield = func(c llm.Chunk, err error) bool {
		tb.Helper()
		if failed {
			tb.Fatalf("chunk after error")
		}
		if err != nil {
			failed = true
			AsError(tb, err)
		}
		last = c
		n++
		return true
	}
	end = func() {
		tb.Helper()
		if !failed && last.Kind != llm.ChunkStop {
			tb.Fatalf("stream of %d chunks ended without stop or error", n)
		}
	}
	return yield, end
}
