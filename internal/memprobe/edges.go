package main

// The scenarios of issue #21, clients that flood the log, send huge
// headers, hold one address's connections, or send a burst of large
// requests:
//
//   - resets: -resets HEADERS + RST_STREAM pairs on one plaintext
//     connection (the HTTP/2 rapid-reset pattern);
//   - unauth: -unauth RunTurn calls without a client key, to a server with
//     keys;
//   - header: -headers concurrent streams, one connection each, whose
//     request carries one header of -header-bytes;
//   - peer: -silent TCP connections from 127.0.0.2 that never send a byte,
//     then a TLS turn from 127.0.0.1, timed;
//   - burst: -burst concurrent requests of -burst-bytes (one long text
//     message), then the server's RSS every 10 s for 30 s.
//
// The log scenarios run the server at log level info and count the bytes
// and lines it writes.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// logCount counts what the server writes to its log.
type logCount struct {
	bytes, lines atomic.Int64
}

func (c *logCount) Write(p []byte) (int, error) {
	c.bytes.Add(int64(len(p)))
	c.lines.Add(int64(bytes.Count(p, []byte("\n"))))
	return len(p), nil
}

// startLogged starts a server logging at info into a [logCount], with
// cfg's lines appended to the generated configuration.
func startLogged(bin, cfg string) (*server, *logCount) {
	dir, err := os.MkdirTemp("", "memprobe-srv")
	check(err)
	full := fmt.Sprintf(`listen: 127.0.0.1:0
providers:
  sim: {type: simulator, token_delay: 0}
models:
  sim: {provider: sim, model: sim-1, context_window: 100000000}
log: {level: info}
store: {mode: off}
%s
`, cfg)
	path := filepath.Join(dir, "turnstile.yaml")
	check(os.WriteFile(path, []byte(full), 0o600))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	addr := lis.Addr().String()
	lis.Close()
	logs := &logCount{}
	cmd := exec.Command(bin, "serve", "--config", path, "--listen", addr)
	cmd.Stderr = logs
	check(cmd.Start())
	s := &server{cmd: cmd, addr: addr, dir: dir}
	s.awaitListening()
	time.Sleep(200 * time.Millisecond) // its start-up lines
	return s, logs
}

// h2 is a client writing HTTP/2 frames by hand.
type h2 struct {
	conn   net.Conn
	mu     sync.Mutex
	fr     *http2.Framer
	enc    *hpack.Encoder
	buf    bytes.Buffer
	next   uint32
	goAway atomic.Pointer[http2.GoAwayFrame]
	done   chan struct{}
	// status is the :status of the first response headers, or the
	// RST_STREAM code as "rst <code>".
	status atomic.Value
}

func dialH2(addr string) (*h2, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c := &h2{conn: conn, next: 1, done: make(chan struct{})}
	c.fr = http2.NewFramer(conn, conn)
	c.enc = hpack.NewEncoder(&c.buf)
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		return nil, err
	}
	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30}); err != nil {
		return nil, err
	}
	go c.read()
	return c, nil
}

func (c *h2) read() {
	defer close(c.done)
	rd := http2.NewFramer(io.Discard, c.conn)
	rd.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	rd.MaxHeaderListSize = 1 << 20
	for {
		f, err := rd.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				c.mu.Lock()
				_ = c.fr.WriteSettingsAck()
				c.mu.Unlock()
			}
		case *http2.MetaHeadersFrame:
			c.status.CompareAndSwap(nil, f.PseudoValue("status"))
		case *http2.RSTStreamFrame:
			c.status.CompareAndSwap(nil, "rst "+f.ErrCode.String())
		case *http2.GoAwayFrame:
			c.goAway.Store(f)
		}
	}
}

// open starts a RunTurn stream with the extra fields, its request body
// body when not nil, and returns its id.
func (c *h2) open(body []byte, extra ...hpack.HeaderField) (uint32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf.Reset()
	for _, f := range append([]hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: "/turnstile.v1.AgentService/RunTurn"}, {Name: ":authority", Value: "turnstile"},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	}, extra...) {
		if err := c.enc.WriteField(f); err != nil {
			return 0, err
		}
	}
	id := c.next
	c.next += 2
	block := c.buf.Bytes()
	first := block[:min(16384, len(block))]
	rest := block[len(first):]
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(rest) == 0}); err != nil {
		return id, err
	}
	for len(rest) > 0 {
		n := min(16384, len(rest))
		if err := c.fr.WriteContinuation(id, n == len(rest), rest[:n]); err != nil {
			return id, err
		}
		rest = rest[n:]
	}
	if body != nil {
		msg := make([]byte, 5+len(body))
		binary.BigEndian.PutUint32(msg[1:], uint32(len(body)))
		copy(msg[5:], body)
		for len(msg) > 0 {
			n := min(16384, len(msg))
			if err := c.fr.WriteData(id, n == len(msg), msg[:n]); err != nil {
				return id, err
			}
			msg = msg[n:]
		}
	}
	return id, nil
}

func (c *h2) reset(id uint32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fr.WriteRSTStream(id, http2.ErrCodeCancel)
}

// probeResets opens and resets n streams on one connection.
func probeResets(bin, extra string, n int) {
	s, logs := startLogged(bin, extra)
	defer s.stop()
	l0, b0 := logs.lines.Load(), logs.bytes.Load()
	c, err := dialH2(s.addr)
	check(err)
	start := time.Now()
	sent := 0
	for range n {
		id, err := c.open(nil)
		if err == nil {
			err = c.reset(id)
		}
		if err != nil {
			break
		}
		sent++
	}
	took := time.Since(start)
	select {
	case <-c.done:
	case <-time.After(3 * time.Second):
	}
	c.conn.Close()
	time.Sleep(2 * time.Second)
	ga := "none"
	if g := c.goAway.Load(); g != nil {
		ga = g.ErrCode.String()
	}
	fmt.Printf("resets: %d of %d HEADERS+RST_STREAM written in %s; GOAWAY %s; server log %d lines, %d bytes\n",
		sent, n, took.Round(time.Millisecond), ga, logs.lines.Load()-l0, logs.bytes.Load()-b0)
}

// probeUnauth makes n calls without a client key to a server with one.
func probeUnauth(bin, extra string, n int) {
	sum := sha256.Sum256([]byte("memprobe-token-0123456789"))
	s, logs := startLogged(bin, fmt.Sprintf("auth: {keys: [{name: probe, token_sha256: %s}]}\n%s", hex.EncodeToString(sum[:]), extra))
	defer s.stop()
	l0, b0 := logs.lines.Load(), logs.bytes.Load()
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	check(err)
	defer conn.Close()
	client := turnstilev1.NewAgentServiceClient(conn)
	start := time.Now()
	refused := 0
	for range n {
		stream, err := client.RunTurn(context.Background(), request("hi"))
		if err == nil {
			_, err = stream.Recv()
		}
		if err != nil && strings.Contains(err.Error(), "Unauthenticated") {
			refused++
		}
	}
	took := time.Since(start)
	time.Sleep(time.Second)
	fmt.Printf("unauth: %d calls (%d UNAUTHENTICATED) in %s; server log %d lines, %d bytes\n",
		n, refused, took.Round(time.Millisecond), logs.lines.Load()-l0, logs.bytes.Load()-b0)
}

// probeHeader sends n streams at once, one connection each, whose request
// carries one header of size bytes.
func probeHeader(bin, extra string, n, size int) {
	s, logs := startLogged(bin, extra)
	defer s.stop()
	rss0, _ := s.mem()
	l0 := logs.lines.Load()
	body, err := proto.Marshal(request("hello"))
	check(err)
	value := strings.Repeat("h", size)
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[string]int{}
	start := time.Now()
	for range n {
		wg.Go(func() {
			outcome := "?"
			c, err := dialH2(s.addr)
			if err == nil {
				_, err = c.open(body, hpack.HeaderField{Name: "x-big", Value: value})
				select {
				case <-c.done:
				case <-time.After(10 * time.Second):
				}
				switch st, _ := c.status.Load().(string); {
				case st != "":
					outcome = "answered " + st
				case err != nil:
					outcome = "connection closed while writing"
				default:
					outcome = "connection closed"
				}
				c.conn.Close()
			} else {
				outcome = err.Error()
			}
			mu.Lock()
			outcomes[outcome]++
			mu.Unlock()
		})
	}
	wg.Wait()
	took := time.Since(start)
	time.Sleep(time.Second)
	rss, hwm := s.mem()
	fmt.Printf("header: %d streams with a %d-byte header in %s: %v; server RSS before %.0f MiB, peak (VmHWM) %.0f MiB, now %.0f MiB; log %d lines\n",
		n, size, took.Round(time.Millisecond), outcomes, rss0, hwm, rss, logs.lines.Load()-l0)
}

// probePeer holds n silent connections from 127.0.0.2 and times a TLS
// turn from 127.0.0.1 meanwhile.
func probePeer(bin, extra string, n int) {
	dir, err := os.MkdirTemp("", "memprobe-tls")
	check(err)
	defer os.RemoveAll(dir)
	pool := writeCert(dir)
	s, _ := startLogged(bin, fmt.Sprintf("server: {tls: {cert_file: %s, key_file: %s}}\n%s",
		filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), extra))
	defer s.stop()
	creds := credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	turn := func() (time.Duration, error) {
		conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			return 0, err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		start := time.Now()
		stream, err := turnstilev1.NewAgentServiceClient(conn).RunTurn(ctx, request("hi"))
		for err == nil {
			_, err = stream.Recv()
		}
		if err == io.EOF {
			err = nil
		}
		return time.Since(start), err
	}
	alone, err := turn()
	fmt.Printf("peer: a TLS turn alone: %s (err %v)\n", alone.Round(time.Millisecond), err)
	_, port, _ := net.SplitHostPort(s.addr)
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 2 * time.Second}
	var conns []net.Conn
	for range n {
		c, err := d.Dial("tcp", net.JoinHostPort("127.0.0.1", port))
		if err != nil {
			fmt.Printf("peer: dial failed after %d connections: %v\n", len(conns), err)
			break
		}
		conns = append(conns, c)
	}
	time.Sleep(500 * time.Millisecond)
	took, err := turn()
	fmt.Printf("peer: %d silent connections from 127.0.0.2 (server fds %d); a TLS turn from 127.0.0.1: %s (err %v)\n",
		len(conns), s.fds(), took.Round(time.Millisecond), err)
	for _, c := range conns {
		c.Close()
	}
}

// writeCert writes a self-signed certificate for 127.0.0.1 into dir
// (cert.pem, key.pem) and returns a pool that trusts it.
func writeCert(dir string) *x509.CertPool {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check(err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "memprobe"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	check(err)
	kb, err := x509.MarshalECPrivateKey(key)
	check(err)
	check(os.WriteFile(filepath.Join(dir, "cert.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	check(os.WriteFile(filepath.Join(dir, "key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600))
	cert, err := x509.ParseCertificate(der)
	check(err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return pool
}

// probeBurst sends n concurrent requests of size bytes (one text
// message), then reports the server's RSS every 10 s for 30 s.
func probeBurst(bin, extra string, n, size int) {
	s, _ := startLogged(bin, extra)
	defer s.stop()
	rss0, _ := s.mem()
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	check(err)
	defer conn.Close()
	client := turnstilev1.NewAgentServiceClient(conn)
	req := request(strings.Repeat("abcdefgh ", size/9))
	var wg sync.WaitGroup
	var mu sync.Mutex
	results := map[string]int{}
	for range n {
		wg.Go(func() {
			stream, err := client.RunTurn(context.Background(), req)
			for err == nil {
				_, err = stream.Recv()
			}
			outcome := "ok"
			if err != io.EOF {
				outcome = err.Error()
				if len(outcome) > 100 {
					outcome = outcome[:100] + "..."
				}
			}
			mu.Lock()
			results[outcome]++
			mu.Unlock()
		})
	}
	wg.Wait()
	rss, hwm := s.mem()
	fmt.Printf("burst: %d requests of %d bytes: %v; server RSS before %.0f MiB, peak (VmHWM) %.0f MiB, at the end %.0f MiB\n",
		n, proto.Size(req), results, rss0, hwm, rss)
	for i := 1; i <= 3; i++ {
		time.Sleep(10 * time.Second)
		rss, _ := s.mem()
		fmt.Printf("burst: %d s later: RSS %.0f MiB\n", 10*i, rss)
	}
}
