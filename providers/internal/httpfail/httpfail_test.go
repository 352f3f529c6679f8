package httpfail

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"golang.org/x/net/http2"
)

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "net/http: timeout awaiting response headers" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestNetwork(t *testing.T) {
	t.Parallel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	tests := []struct {
		name string
		err  error
		want llm.Kind
		ok   bool
	}{
		{"connection refused", fmt.Errorf("Post %q: %w", "http://x", refused), llm.KindNetwork, true},
		{"connection reset", fmt.Errorf("read body: %w", reset), llm.KindNetwork, true},
		{"closed before headers", fmt.Errorf("Post %q: %w", "http://x", io.EOF), llm.KindNetwork, true},
		{"body cut short", fmt.Errorf("stream: %w", io.ErrUnexpectedEOF), llm.KindNetwork, true},
		{"dns", &net.DNSError{Err: "no such host", Name: "x", IsNotFound: true}, llm.KindNetwork, true},
		{"http2 rst_stream", fmt.Errorf("read: %w", http2.StreamError{StreamID: 1, Code: http2.ErrCodeInternal}), llm.KindNetwork, true},
		{"http2 goaway typed", http2.GoAwayError{ErrCode: http2.ErrCodeNo}, llm.KindNetwork, true},
		{"http2 goaway text", errors.New("http2: server sent GOAWAY and closed the connection; LastStreamID=1, ErrCode=NO_ERROR, debug=\"\""), llm.KindNetwork, true},
		{"header timeout", fmt.Errorf("Post: %w", timeoutErr{}), llm.KindTimeout, true},
		{"attempt deadline", fmt.Errorf("Post: %w", context.DeadlineExceeded), llm.KindTimeout, true},
		{"dial timeout", &net.OpError{Op: "dial", Err: timeoutErr{}}, llm.KindTimeout, true},
		{"unrelated", errors.New("json: cannot unmarshal"), 0, false},
		{"nil", nil, 0, false},
		{"canceled is not network", context.Canceled, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := Network(tt.err)
			if got != tt.want || ok != tt.ok {
				t.Errorf("Network(%v) = %v, %v, want %v, %v", tt.err, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestNetworkMessage(t *testing.T) {
	t.Parallel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 443},
		Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	if got := NetworkMessage(llm.KindNetwork, refused); got != "connection refused" {
		t.Errorf("NetworkMessage(refused) = %q", got)
	}
	if got := NetworkMessage(llm.KindTimeout, timeoutErr{}); got != "timed out talking to the provider" {
		t.Errorf("NetworkMessage(timeout) = %q", got)
	}
}

func TestStatusKind(t *testing.T) {
	t.Parallel()
	tests := map[int]llm.Kind{
		400: llm.KindInvalidRequest,
		401: llm.KindAuth,
		402: llm.KindQuotaExhausted,
		403: llm.KindAuth,
		404: llm.KindNotFound,
		408: llm.KindTimeout,
		409: llm.KindServerError,
		413: llm.KindContextOverflow,
		422: llm.KindInvalidRequest,
		429: llm.KindRateLimited,
		500: llm.KindServerError,
		502: llm.KindServerError,
		503: llm.KindOverloaded,
		504: llm.KindServerError,
		529: llm.KindOverloaded,
		599: llm.KindServerError,
		200: llm.KindServerError,
	}
	for code, want := range tests {
		if got := StatusKind(code); got != want {
			t.Errorf("StatusKind(%d) = %v, want %v", code, got, want)
		}
	}
	if got, want := StatusMessage(529), "HTTP 529 Overloaded"; got != want {
		t.Errorf("StatusMessage(529) = %q, want %q", got, want)
	}
	if got, want := StatusMessage(502), "HTTP 502 Bad Gateway"; got != want {
		t.Errorf("StatusMessage(502) = %q, want %q", got, want)
	}
	if got, want := StatusMessage(599), "HTTP 599"; got != want {
		t.Errorf("StatusMessage(599) = %q, want %q", got, want)
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 21, 23, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		headers map[string]string
		want    time.Duration
	}{
		{"none", nil, 0},
		{"ms wins", map[string]string{"retry-after-ms": "644", "retry-after": "1"}, 644 * time.Millisecond},
		{"fractional ms", map[string]string{"retry-after-ms": "1.5"}, 1500 * time.Microsecond},
		{"bad ms falls back", map[string]string{"retry-after-ms": "soon", "retry-after": "3"}, 3 * time.Second},
		{"seconds", map[string]string{"Retry-After": "20"}, 20 * time.Second},
		{"fractional seconds", map[string]string{"retry-after": "0.25"}, 250 * time.Millisecond},
		{"http date", map[string]string{"retry-after": now.Add(90 * time.Second).Format(http.TimeFormat)}, 90 * time.Second},
		{"past date", map[string]string{"retry-after": now.Add(-time.Minute).Format(http.TimeFormat)}, 0},
		{"negative", map[string]string{"retry-after": "-5"}, 0},
		{"zero", map[string]string{"retry-after": "0"}, 0},
		{"garbage", map[string]string{"retry-after": "tomorrow"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.headers {
				h.Set(k, v)
			}
			if got := RetryAfter(h, now); got != tt.want {
				t.Errorf("RetryAfter(%v) = %v, want %v", tt.headers, got, tt.want)
			}
		})
	}
}

func TestHint(t *testing.T) {
	t.Parallel()
	tests := []struct {
		should string
		after  time.Duration
		want   llm.Hint
	}{
		{"", 0, llm.HintDefault},
		{"", time.Second, llm.HintAfter},
		{"false", time.Second, llm.HintNever},
		{"False", 0, llm.HintNever},
		{"true", 0, llm.HintBackoff},
		{"true", time.Second, llm.HintAfter},
	}
	for _, tt := range tests {
		h := http.Header{}
		if tt.should != "" {
			h.Set("x-should-retry", tt.should)
		}
		if got := Hint(h, tt.after); got != tt.want {
			t.Errorf("Hint(x-should-retry=%q, %v) = %v, want %v", tt.should, tt.after, got, tt.want)
		}
	}
	if got := Hint(nil, 0); got != llm.HintDefault {
		t.Errorf("Hint(nil, 0) = %v", got)
	}
}

func TestRequestID(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	h.Set("request-id", "req_anthropic")
	if got := RequestID(h); got != "req_anthropic" {
		t.Errorf("RequestID = %q", got)
	}
	h.Set("x-request-id", "req_openai")
	if got := RequestID(h); got != "req_openai" {
		t.Errorf("RequestID = %q", got)
	}
	if got := RequestID(nil); got != "" {
		t.Errorf("RequestID(nil) = %q", got)
	}
}

func TestParseDuration(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"55s", 55 * time.Second, true},
		{"0.5s", 500 * time.Millisecond, true},
		{"1.000340s", time.Second + 340*time.Microsecond, true},
		{"0s", 0, true},
		{"-1s", 0, false},
		{"55", 0, false},
		{"s", 0, false},
		{"5m", 0, false},
		{"abc s", 0, false},
	}
	for _, tt := range tests {
		got, ok := ParseDuration(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("ParseDuration(%q) = %v, %v, want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	if got, want := Redact("Incorrect API key provided: sk-secret-123.", "sk-secret-123"), "Incorrect API key provided: [redacted]."; got != want {
		t.Errorf("Redact = %q, want %q", got, want)
	}
	if got := Redact("a short key", "key"); got != "a short key" {
		t.Errorf("Redact with a short secret = %q", got)
	}
}

func TestRedactErr(t *testing.T) {
	t.Parallel()
	const key = "sk-secret-123"
	base := fmt.Errorf("call: %w", io.ErrUnexpectedEOF)
	if got := RedactErr(base, key); got != base {
		t.Errorf("RedactErr without the key = %v, want err itself", got)
	}
	leaky := fmt.Errorf("bad key %s: %w", key, io.ErrUnexpectedEOF)
	got := RedactErr(leaky, key)
	if want := "bad key [redacted]: unexpected EOF"; got.Error() != want {
		t.Errorf("RedactErr = %q, want %q", got, want)
	}
	if !errors.Is(got, io.ErrUnexpectedEOF) {
		t.Error("RedactErr hides the chain")
	}
	if RedactErr(nil, key) != nil {
		t.Error("RedactErr(nil) != nil")
	}
}

func TestMissingFinish(t *testing.T) {
	t.Parallel()
	if e := MissingFinish("p", false, 200, "r"); e.Kind != llm.KindServerError || e.Provider != "p" || e.RequestID != "r" {
		t.Errorf("MissingFinish(no output) = %+v", e)
	}
	if e := MissingFinish("p", true, 200, ""); e.Kind != llm.KindStreamInterrupted {
		t.Errorf("MissingFinish(output) = %+v", e)
	}
}

func TestNewClientConnectTimeout(t *testing.T) {
	t.Parallel()
	c := NewClient(0)
	if _, ok := c.Transport.(tracedTransport); !ok || c.Timeout != 0 {
		t.Errorf("NewClient(0): transport %T, timeout %v; want the traced transport and no timeout", c.Transport, c.Timeout)
	}
	if tr := newTransport(0); tr.TLSHandshakeTimeout != 10*time.Second {
		t.Errorf("newTransport(0): handshake %v", tr.TLSHandshakeTimeout)
	}
}

func TestClient(t *testing.T) {
	t.Parallel()
	if _, err := Client("openai", nil, -time.Second); err == nil || err.Error() != "openai: negative connect timeout" {
		t.Errorf("Client(negative) error = %v", err)
	}
	if _, err := Client("openai", &http.Client{}, -time.Second); err == nil {
		t.Error("Client(set client, negative) accepted the timeout")
	}
	own := &http.Client{}
	if c, err := Client("openai", own, time.Second); err != nil || c != own {
		t.Errorf("Client(set client) = %p, %v, want the caller's %p", c, err, own)
	}
	c, err := Client("openai", nil, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Transport.(tracedTransport); !ok || c.Timeout != 0 {
		t.Errorf("Client(nil, 3s): transport %T, timeout %v", c.Transport, c.Timeout)
	}
	if tr := newTransport(3 * time.Second); tr.TLSHandshakeTimeout != 3*time.Second {
		t.Errorf("newTransport(3s): handshake %v", tr.TLSHandshakeTimeout)
	}
}

func TestInvalidRequest(t *testing.T) {
	t.Parallel()
	cause := errors.New("tool t: schema is not a JSON object")
	e := InvalidRequest("p", cause)
	if e.Kind != llm.KindInvalidRequest || e.Provider != "p" || e.Message != cause.Error() || !errors.Is(e, cause) {
		t.Errorf("InvalidRequest = %+v", e)
	}
}

func TestGuard(t *testing.T) {
	t.Run("decoder panic becomes a server error", func(t *testing.T) {
		var got []error
		func() {
			yield, done := Guard("p", func(_ llm.Chunk, err error) bool { got = append(got, err); return true })
			defer done()
			yield(llm.Chunk{Kind: llm.ChunkText, Text: "a"}, nil)
			panic("interface conversion")
		}()
		var e *llm.Error
		if len(got) != 2 || !errors.As(got[1], &e) || e.Kind != llm.KindServerError || e.Provider != "p" {
			t.Errorf("yielded %v", got)
		}
	})
	t.Run("consumer panic passes through", func(t *testing.T) {
		defer func() {
			if r := recover(); r != "consumer" {
				t.Errorf("recovered %v, want the consumer's panic", r)
			}
		}()
		yield, done := Guard("p", func(llm.Chunk, error) bool { panic("consumer") })
		defer done()
		yield(llm.Chunk{}, nil)
	})
}

// TestNewClientKeepsIdleConnections checks that a burst of concurrent
// calls leaves its connections idle for the next burst instead of closing
// all but two of them.
func TestNewClientKeepsIdleConnections(t *testing.T) {
	t.Parallel()
	const burst = 20
	var (
		dials   atomic.Int32
		arrived sync.WaitGroup
	)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Done()
		arrived.Wait() // every call of the burst holds its own connection
		_, _ = io.WriteString(w, "ok")
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dials.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c := NewClient(0)
	t.Cleanup(c.CloseIdleConnections)
	for range 2 {
		arrived.Add(burst)
		var wg sync.WaitGroup
		for range burst {
			wg.Go(func() {
				resp, err := c.Get(srv.URL)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			})
		}
		wg.Wait()
	}
	if n := dials.Load(); n != burst {
		t.Errorf("two bursts of %d calls dialled %d connections, want %d", burst, n, burst)
	}
}
