package bench

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Upstream is a fake OpenAI-compatible server: every POST to
// /v1/chat/completions is answered with one streamed chat completion of a
// fixed shape, as OpenAI sends it — a role chunk, the content chunks, a
// finish chunk, a usage chunk and [DONE] — each event written and flushed
// on its own. It speaks cleartext HTTP/1.1, or with [UpstreamConfig.TLS]
// HTTPS with HTTP/2, as the real providers do.
type Upstream struct {
	// URL is the base URL to configure, with /v1.
	URL string
	// CAFile is, with TLS, a PEM file holding the upstream's self-signed
	// certificate, for a client to trust (SSL_CERT_FILE=CAFile for a Go
	// process); empty without TLS. Close removes it.
	CAFile string
	// Roots is, with TLS, a pool holding that certificate; nil without.
	Roots *x509.CertPool

	srv      *http.Server
	lis      net.Listener
	chunks   int
	delay    time.Duration
	events   [][]byte // the body's events, in order
	requests atomic.Int64
	http2    atomic.Int64 // requests that came over HTTP/2
	// slow, when set, is the inter-chunk delay of requests whose model is
	// SlowModel.
	slow time.Duration
}

// SlowModel is the model id whose requests the upstream answers with
// its slow delay ([UpstreamConfig.SlowDelay]).
const SlowModel = "bench-slow"

// UpstreamConfig shapes the fake upstream's replies.
type UpstreamConfig struct {
	// Chunks is the number of content chunks per reply (default 20).
	Chunks int
	// ChunkSize is the number of content bytes per chunk (default 8).
	ChunkSize int
	// Delay is the pause before each content chunk (default none).
	Delay time.Duration
	// SlowDelay is the pause before each content chunk of requests for
	// [SlowModel] (default 1s).
	SlowDelay time.Duration
	// TLS serves HTTPS with HTTP/2 (offered by ALPN beside HTTP/1.1), with
	// a self-signed certificate for 127.0.0.1 made at start, as production
	// upstreams are reached: a client that negotiates HTTP/2 carries many
	// replies on one connection. Without it the upstream speaks cleartext
	// HTTP/1.1, one reply at a time per connection.
	TLS bool
}

// Mode names the upstream's protocol, for reports.
func (c UpstreamConfig) Mode() string {
	if c.TLS {
		return "HTTP/2 over TLS"
	}
	return "HTTP/1.1 cleartext"
}

func (c *UpstreamConfig) defaults() {
	if c.Chunks <= 0 {
		c.Chunks = 20
	}
	if c.ChunkSize <= 0 {
		c.ChunkSize = 8
	}
	if c.SlowDelay <= 0 {
		c.SlowDelay = time.Second
	}
}

// StartUpstream starts the fake upstream on a free loopback port. Close
// stops it.
func StartUpstream(cfg UpstreamConfig) (*Upstream, error) {
	cfg.defaults()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	u := &Upstream{
		URL:    "http://" + lis.Addr().String() + "/v1",
		lis:    lis,
		chunks: cfg.Chunks,
		delay:  cfg.Delay,
		slow:   cfg.SlowDelay,
		events: replyEvents(cfg.Chunks, cfg.ChunkSize),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", u.handle)
	u.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if !cfg.TLS {
		go func() { _ = u.srv.Serve(lis) }()
		return u, nil
	}
	cert, der, err := selfSigned()
	if err != nil {
		_ = lis.Close()
		return nil, fmt.Errorf("upstream: %w", err)
	}
	dir, err := os.MkdirTemp("", "turnstile-bench-upstream-")
	if err != nil {
		_ = lis.Close()
		return nil, fmt.Errorf("upstream: %w", err)
	}
	u.CAFile = filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(u.CAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		_ = lis.Close()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("upstream: %w", err)
	}
	u.Roots = x509.NewCertPool()
	u.Roots.AddCert(cert.Leaf)
	u.URL = "https://" + lis.Addr().String() + "/v1"
	u.srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	u.srv.Protocols = new(http.Protocols)
	u.srv.Protocols.SetHTTP1(true)
	u.srv.Protocols.SetHTTP2(true)
	go func() { _ = u.srv.ServeTLS(lis, "", "") }()
	return u, nil
}

// selfSigned makes a certificate for 127.0.0.1 that signs itself, valid
// for a day, and returns it with its DER encoding.
func selfSigned() (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(now.UnixNano()),
		Subject:               pkix.Name{CommonName: "turnstile bench upstream"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, der, nil
}

// Requests reports how many chat completions the upstream answered.
func (u *Upstream) Requests() int64 { return u.requests.Load() }

// HTTP2Requests reports how many of them came over HTTP/2.
func (u *Upstream) HTTP2Requests() int64 { return u.http2.Load() }

// Close stops the upstream and ends its open replies.
func (u *Upstream) Close() error {
	if u.CAFile != "" {
		defer os.RemoveAll(filepath.Dir(u.CAFile))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := u.srv.Shutdown(ctx); err != nil {
		return u.srv.Close()
	}
	return nil
}

// replyEvents returns the SSE events of one reply of n content chunks of
// size bytes each, shaped as OpenAI's chat.completion.chunk events.
func replyEvents(n, size int) [][]byte {
	const head = `data: {"id":"chatcmpl-bench0123456789","object":"chat.completion.chunk","created":1767225600,"model":"bench-model-2026-01-01","service_tier":"default","system_fingerprint":"fp_0123456789","choices":[`
	ev := func(choices, tail string) []byte {
		return []byte(head + choices + `]` + tail + `,"obfuscation":"abc"}` + "\n\n")
	}
	events := [][]byte{ev(`{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}`, `,"usage":null`)}
	for i := range n {
		word := strconv.Itoa(i) + " "
		text := strings.Repeat("x", max(size-len(word), 0)) + word
		events = append(events, ev(`{"index":0,"delta":{"content":"`+text[len(text)-size:]+`"},"logprobs":null,"finish_reason":null}`, `,"usage":null`))
	}
	events = append(events,
		ev(`{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}`, `,"usage":null`),
		ev(``, `,"usage":{"prompt_tokens":12,"completion_tokens":`+strconv.Itoa(n)+`,"total_tokens":`+strconv.Itoa(12+n)+
			`,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}`),
		[]byte("data: [DONE]\n\n"),
	)
	return events
}

func (u *Upstream) handle(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	u.requests.Add(1)
	if r.ProtoMajor == 2 {
		u.http2.Add(1)
	}
	delay := u.delay
	if strings.Contains(string(body), `"model":"`+SlowModel+`"`) {
		delay = u.slow
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("x-request-id", "req_bench")
	w.WriteHeader(http.StatusOK)
	flusher := w.(http.Flusher)
	var timer *time.Timer
	for i, ev := range u.events {
		if delay > 0 && i >= 1 && i <= u.chunks {
			if timer == nil {
				timer = time.NewTimer(delay)
			} else {
				timer.Reset(delay)
			}
			select {
			case <-timer.C:
			case <-r.Context().Done():
				timer.Stop()
				return
			}
		}
		if _, err := w.Write(ev); err != nil {
			return
		}
		flusher.Flush()
	}
}
