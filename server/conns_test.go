package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/server"
)

// rawH2 is a client speaking HTTP/2 frames by hand, as an attacker would:
// it opens RunTurn streams with any headers, resets them, and records what
// the server answers.
type rawH2 struct {
	t    *testing.T
	conn net.Conn
	wmu  sync.Mutex
	fr   *http2.Framer
	enc  *hpack.Encoder
	hbuf bytes.Buffer
	next uint32

	mu     sync.Mutex
	rsts   map[uint32]http2.ErrCode
	goAway *http2.GoAwayFrame
	done   chan struct{} // closed when the server's side ends
}

func dialRaw(t *testing.T, addr string) *rawH2 {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &rawH2{t: t, conn: conn, next: 1, rsts: map[uint32]http2.ErrCode{}, done: make(chan struct{})}
	c.fr = http2.NewFramer(conn, conn)
	c.enc = hpack.NewEncoder(&c.hbuf)
	c.enc.SetMaxDynamicTableSizeLimit(0)
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	go c.read()
	return c
}

// read records the server's frames until the connection ends.
func (c *rawH2) read() {
	defer close(c.done)
	rd := http2.NewFramer(io.Discard, c.conn)
	for {
		f, err := rd.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				c.wmu.Lock()
				_ = c.fr.WriteSettingsAck()
				c.wmu.Unlock()
			}
		case *http2.RSTStreamFrame:
			c.mu.Lock()
			c.rsts[f.StreamID] = f.ErrCode
			c.mu.Unlock()
		case *http2.GoAwayFrame:
			c.mu.Lock()
			c.goAway = f
			c.mu.Unlock()
		}
	}
}

// open starts a RunTurn stream with extra header fields and returns its id.
func (c *rawH2) open(extra ...hpack.HeaderField) (uint32, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.hbuf.Reset()
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
	block := c.hbuf.Bytes()
	const frame = 16384
	first := block[:min(frame, len(block))]
	rest := block[len(first):]
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(rest) == 0}); err != nil {
		return id, err
	}
	for len(rest) > 0 {
		n := min(frame, len(rest))
		if err := c.fr.WriteContinuation(id, n == len(rest), rest[:n]); err != nil {
			return id, err
		}
		rest = rest[n:]
	}
	return id, nil
}

func (c *rawH2) reset(id uint32) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.fr.WriteRSTStream(id, http2.ErrCodeCancel)
}

// ended waits for the server to end the connection.
func (c *rawH2) ended() bool {
	select {
	case <-c.done:
		return true
	case <-time.After(10 * time.Second):
		return false
	}
}

func (c *rawH2) rst(id uint32) (http2.ErrCode, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	code, ok := c.rsts[id]
	return code, ok
}

// meter is a meter provider whose sums a test reads.
type meter struct {
	*sdkmetric.MeterProvider
	r *sdkmetric.ManualReader
}

func newMeter() *meter {
	r := sdkmetric.NewManualReader()
	return &meter{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(r)), r: r}
}

// sum returns the value of the counter name summed over its data points
// whose attributes include every one of attrs.
func (m *meter) sum(t *testing.T, name string, attrs ...attribute.KeyValue) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name != name {
				continue
			}
		points:
			for _, dp := range mt.Data.(metricdata.Sum[int64]).DataPoints {
				for _, a := range attrs {
					if v, ok := dp.Attributes.Value(a.Key); !ok || v != a.Value {
						continue points
					}
				}
				n += dp.Value
			}
		}
	}
	return n
}

func countLines(logs, substr string) int {
	n := 0
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, substr) {
			n++
		}
	}
	return n
}

func infoLines(logs string) int {
	n := 0
	for _, l := range strings.Split(logs, "\n") {
		if l != "" && !strings.Contains(l, "level=DEBUG") {
			n++
		}
	}
	return n
}

// TestHeaderOverLimit: a 16 MB header closes its connection at once; a
// header list over max_header_bytes made of small fields gets its stream
// reset (FRAME_SIZE_ERROR) and the connection serves on; each is counted,
// and logged once per connection. A normal turn is served meanwhile.
func TestHeaderOverLimit(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	m := newMeter()
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("hi")})),
		server.Options{Logger: newLogger(&logs), MeterProvider: m})

	huge := dialRaw(t, ts.addr)
	if _, err := huge.open(hpack.HeaderField{Name: "x-huge", Value: strings.Repeat("a", 16<<20)}); err == nil {
		t.Log("the whole 16 MB header was written")
	}
	if !huge.ended() {
		t.Fatal("the connection of a 16 MB header is still open")
	}

	wide := dialRaw(t, ts.addr)
	var fields []hpack.HeaderField
	for i := range 40 {
		fields = append(fields, hpack.HeaderField{Name: fmt.Sprintf("x-f%d", i), Value: strings.Repeat("b", 1024)})
	}
	for range 2 {
		id, err := wide.open(fields...)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { _, ok := wide.rst(id); return ok })
		if code, _ := wide.rst(id); code != http2.ErrCodeFrameSize {
			t.Errorf("stream %d reset with %v, want FRAME_SIZE_ERROR", id, code)
		}
	}
	if _, st := wiretest.Collect(t, t.Context(), ts.client, hello(), nil); st.Code() != codes.OK {
		t.Errorf("a normal turn: %v", st)
	}
	reason := attribute.String("reason", "header_too_large")
	waitFor(t, func() bool { return m.sum(t, "turnstile.server.refusals", reason) == 3 })
	if n := countLines(logs.String(), "larger than server.max_header_bytes"); n != 2 {
		t.Errorf("%d lines about the header, want 2 (one per connection):\n%s", n, logs.String())
	}
}

// TestRapidReset: a connection that opens and resets 100,000 streams is
// closed with GOAWAY ENHANCE_YOUR_CALM; the server writes a handful of
// lines at INFO (its clock, which its log lines are sampled on, stands
// still), and counts the closed connection.
func TestRapidReset(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	m := newMeter()
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("hi")})),
		server.Options{Logger: newLogger(&logs), MeterProvider: m, Clock: atNoon})
	c := dialRaw(t, ts.addr)
	sent := 0
	for range 100_000 {
		id, err := c.open()
		if err == nil {
			err = c.reset(id)
		}
		if err != nil {
			break
		}
		sent++
	}
	if !c.ended() {
		t.Fatal("the connection is still open")
	}
	c.mu.Lock()
	g := c.goAway
	c.mu.Unlock()
	if g == nil || g.ErrCode != http2.ErrCodeEnhanceYourCalm {
		t.Errorf("GOAWAY = %+v, want ENHANCE_YOUR_CALM", g)
	}
	if _, st := wiretest.Collect(t, t.Context(), ts.client, hello(), nil); st.Code() != codes.OK {
		t.Errorf("a normal turn: %v", st)
	}
	waitFor(t, func() bool {
		return m.sum(t, "turnstile.server.refusals", attribute.String("reason", "rapid_reset")) == 1
	})
	// Once the server has stopped gracefully, every handler of the reset
	// streams has returned and written its line.
	ts.srv.Shutdown(t.Context())
	var lines []string
	for _, l := range strings.SplitAfter(logs.String(), "\n") {
		if !strings.Contains(l, "msg=draining") && !strings.Contains(l, `msg="all turns finished"`) {
			lines = append(lines, l)
		}
	}
	out := strings.Join(lines, "")
	t.Logf("%d streams opened and reset before the connection closed; %d lines at INFO or above, %d in all", sent, infoLines(out), strings.Count(out, "\n"))
	if n := infoLines(out); n > 10 {
		t.Errorf("%d lines at INFO or above:\n%.3000s", n, out)
	}
	if n := countLines(out, "opens and resets streams"); n != 1 {
		t.Errorf("%d lines about the closed connection, want 1", n)
	}
}

// TestUnauthenticatedFlood: 2,000 calls without a key, eight at a time,
// write a handful of lines and are counted by code. The server's clock stands still: the
// lines are the sampler's first ones, however long the calls take.
func TestUnauthenticatedFlood(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	m := newMeter()
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("hi")})),
		server.Options{Logger: logger, MeterProvider: m, Keys: []server.Key{keyed("ops", "tok-ops-0123456789")}, Clock: atNoon})
	const n, callers = 2000, 8
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n / callers {
				stream, err := ts.client.RunTurn(t.Context(), hello())
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := stream.Recv(); status.Code(err) != codes.Unauthenticated {
					t.Errorf("status %v, want UNAUTHENTICATED", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	code := attribute.Int("rpc.grpc.status_code", int(codes.Unauthenticated))
	waitFor(t, func() bool { return m.sum(t, "turnstile.server.rpcs.unserved", code) == n })
	out := logs.String()
	if lines := strings.Count(out, "\n"); lines > 10 {
		t.Errorf("%d lines for %d unauthenticated calls", lines, n)
	}
	t.Logf("%d lines for %d calls:\n%s", strings.Count(out, "\n"), n, out)
}

// TestPerPeerCap: an address holding max_connections_per_peer silent
// connections gets no more, and a client from another address is served
// while they hold (without the cap they would hold every slot of
// max_connections until handshake_timeout, a minute here).
func TestPerPeerCap(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	m := newMeter()
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("hi")})),
		server.Options{Logger: newLogger(&logs), MeterProvider: m, MaxConnections: 100, MaxConnectionsPerPeer: 20, HandshakeTimeout: time.Minute,
			Clock: atNoon})
	silent := dialSilent(t, ts.addr, 150)
	perPeer := attribute.String("reason", "per_peer_limit")
	waitFor(t, func() bool { return m.sum(t, "turnstile.server.refusals", perPeer) == 130 })
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	if _, st := wiretest.Collect(t, ctx, ts.client, hello(), nil); st.Code() != codes.OK {
		t.Fatalf("a client from another address, while one address holds its share: %v", st)
	}
	if n := countLines(logs.String(), "max_connections_per_peer"); n > 10 {
		t.Errorf("%d lines about refused connections, want a handful", n)
	}
	for _, c := range silent {
		c.Close()
	}
}

// TestHandshakeTimeoutCounted: each silent connection closed by
// handshake_timeout is counted and logged at DEBUG.
func TestHandshakeTimeoutCounted(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	m := newMeter()
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("hi")})),
		server.Options{Logger: newLogger(&logs), MeterProvider: m, HandshakeTimeout: 100 * time.Millisecond})
	dialSilent(t, ts.addr, 3)
	timeout := attribute.String("reason", "handshake_timeout")
	waitFor(t, func() bool { return m.sum(t, "turnstile.server.refusals", timeout) == 3 })
	if n := countLines(logs.String(), "level=DEBUG msg=\"connection closed: no handshake within"); n != 3 {
		t.Errorf("%d DEBUG lines about handshake timeouts, want 3:\n%s", n, logs.String())
	}
	if _, st := wiretest.Collect(t, t.Context(), ts.client, hello(), nil); st.Code() != codes.OK {
		t.Errorf("a normal turn: %v", st)
	}
}

// dialSilent opens n TCP connections to addr from 127.0.0.2 that send
// nothing.
func dialSilent(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	var out []net.Conn
	for range n {
		c, err := d.Dial("tcp", net.JoinHostPort("127.0.0.1", port))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		out = append(out, c)
	}
	return out
}

// TestUnixSocketNotCapped: connections on a Unix socket have no address
// to count by, so max_connections_per_peer does not apply to them: five
// held open at once are all served.
func TestUnixSocketNotCapped(t *testing.T) {
	t.Parallel()
	m := newMeter()
	lis, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	ts := serveOn(t, lis, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("hi")})),
		server.Options{MeterProvider: m, MaxConnectionsPerPeer: 2, HandshakeTimeout: time.Minute})
	var conns []net.Conn
	for range 5 {
		c, err := net.Dial("unix", ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	// A connection the server serves acknowledges a client's HTTP/2
	// settings; one it closed reads EOF after its own SETTINGS.
	for i, c := range conns {
		if err := settingsAcked(c); err != nil {
			t.Errorf("connection %d: %v, want it served", i, err)
		}
	}
	if n := m.sum(t, "turnstile.server.refusals", attribute.String("reason", "per_peer_limit")); n != 0 {
		t.Errorf("%d refused", n)
	}
}

// settingsAcked sends an HTTP/2 client preface on c and reads until the
// server acknowledges its settings.
func settingsAcked(c net.Conn) error {
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		return err
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		return err
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return err
		}
		if s, ok := f.(*http2.SettingsFrame); ok && s.IsAck() {
			return nil
		}
	}
}
