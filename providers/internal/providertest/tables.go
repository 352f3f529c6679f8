package providertest

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/turnstile-dev/turnstile/llm"
)

// IgnoreErr is a cmp option that ignores a [llm.Error]'s Err field,
// the wrapped SDK error kept for logs.
var IgnoreErr = cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Err" }, cmp.Ignore())

// StreamCase is one streamed reply for [StreamShapes].
type StreamCase struct {
	// Name names the subtest.
	Name string
	// Body is the whole SSE body the server sends with status 200.
	Body string
	// Want are the chunks the provider must yield, in order.
	Want []llm.Chunk
	// WantErr, when set, is the kind of the error that must end the
	// stream; when zero the stream must end without error.
	WantErr llm.Kind
}

// StreamShapes runs each case as a parallel subtest against a fresh fake
// server, with the provider that provider builds for it. The provider
// must yield exactly the case's chunks, then either nothing more or one
// error of the case's kind that names the provider (name) and has a
// message.
func StreamShapes[P llm.Provider](t *testing.T, provider func(testing.TB, *Server) P, req *llm.Request, name string, cases []StreamCase) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.Name, func(t *testing.T) {
			t.Parallel()
			f := NewServer(t, func(w http.ResponseWriter, r *http.Request) { WriteSSE(w, tt.Body) })
			chunks, err := Collect(t, t.Context(), provider(t, f), req)
			if diff := cmp.Diff(tt.Want, chunks); diff != "" {
				t.Errorf("chunks (-want +got):\n%s", diff)
			}
			switch {
			case tt.WantErr == 0 && err != nil:
				t.Errorf("Stream: %v", err)
			case tt.WantErr != 0:
				e := AsError(t, err)
				if e.Kind != tt.WantErr || e.Provider != name || e.Message == "" {
					t.Errorf("error = %+v, want kind %v", e, tt.WantErr)
				}
			}
		})
	}
}

// HTTPFailure is one failed HTTP response for [HTTPFailures].
type HTTPFailure struct {
	// Name names the subtest.
	Name string
	// Status, Headers and Body are the server's response. A body that
	// starts with '{' is sent as application/json.
	Status  int
	Headers map[string]string
	Body    string
	// Want is the error the provider must yield. Its Provider and
	// StatusCode are filled in by HTTPFailures, and Err is ignored.
	Want llm.Error
	// MinAfter, when set, checks RetryAfter loosely (for HTTP dates): it
	// must be at least MinAfter, and is then not compared with Want's.
	MinAfter time.Duration
}

// HTTPFailures runs each case as a parallel subtest against a fresh fake
// server that answers with the case's response, with the provider that
// provider builds for it. The provider must yield no chunk and then
// exactly the case's error, named after the provider (name) and carrying
// the HTTP status, with the SDK's error kept in Err and without secret in
// its text, after exactly one request: SDK retries must be off. secret
// must not be empty.
func HTTPFailures[P llm.Provider](t *testing.T, provider func(testing.TB, *Server) P, req *llm.Request, name, secret string, cases []HTTPFailure) {
	t.Helper()
	if secret == "" {
		t.Fatal("HTTPFailures needs the secret that must not leak")
	}
	for _, tt := range cases {
		t.Run(tt.Name, func(t *testing.T) {
			t.Parallel()
			f := NewServer(t, func(w http.ResponseWriter, r *http.Request) {
				for k, v := range tt.Headers {
					w.Header().Set(k, v)
				}
				if tt.Body != "" && tt.Body[0] == '{' {
					w.Header().Set("Content-Type", "application/json")
				}
				w.WriteHeader(tt.Status)
				_, _ = w.Write([]byte(tt.Body))
			})
			chunks, err := Collect(t, t.Context(), provider(t, f), req)
			if len(chunks) != 0 {
				t.Errorf("chunks = %+v, want none", chunks)
			}
			e := AsError(t, err)
			want := tt.Want
			want.Provider, want.StatusCode = name, tt.Status
			got := *e
			if tt.MinAfter > 0 {
				if got.RetryAfter < tt.MinAfter {
					t.Errorf("RetryAfter = %v, want at least %v", got.RetryAfter, tt.MinAfter)
				}
				got.RetryAfter = 0
			}
			if diff := cmp.Diff(want, got, IgnoreErr); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if e.Err == nil {
				t.Error("Err is nil, want the SDK's error for logs")
			}
			if strings.Contains(e.Error(), secret) {
				t.Errorf("the API key leaks into the error's text: %q", e.Error())
			}
			if n := f.Requests(); n != 1 {
				t.Errorf("requests = %d, want exactly 1 (SDK retries must be off)", n)
			}
		})
	}
}
