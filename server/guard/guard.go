package guard

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/credentials"
)

// What this file guards against, below gRPC: one address holding every
// connection slot (a per-peer cap, in peerListener), connections silent
// through their handshake (at most MaxHandshakes at once: beyond, the
// oldest handshake of the address with the most is closed, so silent
// connections from many addresses cannot hold every slot either; counted
// when handshake_timeout closes them),
// request headers over max_header_bytes (gRPC refuses the stream or
// closes the connection; counted and logged here), and connections that
// only open and reset streams (the HTTP/2 rapid-reset pattern: gRPC-Go
// bounds the handlers running per connection, but a client that resets
// each stream at once still costs a handler and a log line per stream;
// such a connection is sent GOAWAY ENHANCE_YOUR_CALM and closed).
//
// The rapid-reset watch is h2.go's.

// Reasons of the refusals metric.
const (
	reasonPerPeer          = "per_peer_limit"
	reasonHandshakeLimit   = "handshake_limit"
	reasonHandshakeTimeout = "handshake_timeout"
	reasonRapidReset       = "rapid_reset"
	reasonHeaderTooLarge   = "header_too_large"
)

// Metric names of the connection guard and the RPC log.
const (
	metricRefusals = "turnstile.server.refusals"
	metricUnserved = "turnstile.server.rpcs.unserved"
)

// Options configure a [Guard].
type Options struct {
	// Logger receives the lines of refusals and of RPCs, sampled per peer.
	Logger *slog.Logger
	// MaxConnectionsPerPeer bounds the connections open at once from one
	// IP address.
	MaxConnectionsPerPeer int
	// MaxHandshakes bounds the connections whose TLS and HTTP/2
	// handshakes are under way at once, from every address together; 0
	// is no bound. A connection beyond it closes the oldest handshake of
	// the address with the most under way.
	MaxHandshakes int
	// MaxHeaderBytes is the bound gRPC holds a request's header to,
	// named in the line that says it refused one.
	MaxHeaderBytes int
	// MeterProvider records the refusals and the RPCs that did no work.
	MeterProvider metric.MeterProvider
	// Now is the clock the log lines are sampled on (nil: time.Now).
	Now func() time.Time
}

// RanField is the log field that marks the line of an RPC that ran a
// turn: such an RPC did work, whatever its status, so its line is not
// sampled nor counted as unserved.
const RanField = "turn_ran"

// Guard keeps the per-peer connection counts, the instruments and the
// sampled log of everything refused below the RPC layer.
type Guard struct {
	logger  *slog.Logger
	perPeer int
	headers int
	// sampler shares the lines of RPCs that did no work among peers;
	// connSampler those about connections, apart, so a flood of the
	// first cannot hide the line that a connection was closed.
	sampler     *sampler
	connSampler *sampler
	now         func() time.Time
	refusals    metric.Int64Counter
	unserved    metric.Int64Counter

	mu    sync.Mutex
	peers map[string]int
	// shaking are the connections whose handshake is under way, by
	// address, oldest first; shakes counts them. Under mu.
	maxShakes int
	shaking   map[string][]*peerConn
	shakes    int
}

// New returns the guard of a server.
func New(opts Options) *Guard {
	mp := opts.MeterProvider
	m := mp.Meter("github.com/turnstile-dev/turnstile/server")
	// Instrument errors (a bad name) are a broken build: the no-op
	// instrument returned keeps the server serving.
	refusals, _ := m.Int64Counter(metricRefusals, metric.WithUnit("{event}"),
		metric.WithDescription("Connections and streams refused below the RPC layer, by reason: per_peer_limit, handshake_limit, handshake_timeout, rapid_reset, header_too_large."))
	unserved, _ := m.Int64Counter(metricUnserved, metric.WithUnit("{call}"),
		metric.WithDescription("RPCs that ended before any work (cancelled by the client, unauthenticated, refused by a limit), by status code."))
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &Guard{
		logger:      opts.Logger,
		now:         now,
		perPeer:     opts.MaxConnectionsPerPeer,
		headers:     opts.MaxHeaderBytes,
		sampler:     newSampler(),
		connSampler: newSampler(),
		refusals:    refusals,
		unserved:    unserved,
		peers:       map[string]int{},
		maxShakes:   opts.MaxHandshakes,
		shaking:     map[string][]*peerConn{},
	}
}

// refused counts one refusal for reason.
func (g *Guard) refused(reason string) {
	g.refusals.Add(context.Background(), 1, metric.WithAttributes(attribute.String("reason", reason)))
}

// logSampled writes msg about a connection of peer at level unless peer
// has had its share of such lines (see [sampler]); the line says how many were left out since
// the last one.
func (g *Guard) logSampled(level slog.Level, peer, msg string, attrs ...any) {
	if !g.logger.Enabled(context.Background(), level) {
		return
	}
	if level > slog.LevelDebug {
		ok, suppressed := g.connSampler.allow(peer, g.now())
		if !ok {
			return
		}
		if suppressed > 0 {
			attrs = append(attrs, "suppressed", suppressed)
		}
	}
	g.logger.Log(context.Background(), level, msg, append([]any{"peer", peer}, attrs...)...)
}

// admit takes a connection slot of host, or reports that host holds
// perPeer already.
func (g *Guard) admit(host string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.peers[host] >= g.perPeer {
		return false
	}
	g.peers[host]++
	return true
}

// release gives back a connection slot of host.
func (g *Guard) release(host string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.peers[host]--; g.peers[host] <= 0 {
		delete(g.peers, host)
	}
}

// shake counts c's handshake as under way; beyond maxShakes it closes the
// oldest handshake of the address with the most under way (c's own, when
// that is c's address), which a client completing its handshake holds
// for milliseconds and a silent connection until handshake_timeout.
func (g *Guard) shake(c *peerConn) {
	if g.maxShakes <= 0 {
		return
	}
	var victim *peerConn
	g.mu.Lock()
	if g.shakes >= g.maxShakes {
		var most []*peerConn
		for _, cs := range g.shaking {
			if len(cs) > len(most) || len(cs) == len(most) && cs[0].accepted.Before(most[0].accepted) {
				most = cs
			}
		}
		victim = most[0]
		g.unshakeLocked(victim)
	}
	c.shaking = true
	g.shaking[c.host] = append(g.shaking[c.host], c)
	g.shakes++
	g.mu.Unlock()
	if victim != nil {
		victim.evicted.Store(true)
		_ = victim.Close()
		g.refused(reasonHandshakeLimit)
		g.logSampled(slog.LevelWarn, victim.host, "connection closed: server.max_handshakes handshakes were under way, the most from this address", "limit", g.maxShakes)
	}
}

// shaken counts c's handshake as over: done, or its connection closed.
func (g *Guard) shaken(c *peerConn) {
	if g.maxShakes <= 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.unshakeLocked(c)
}

// unshakeLocked removes c from the handshakes under way, if it is one.
// g.mu is held.
func (g *Guard) unshakeLocked(c *peerConn) {
	if !c.shaking {
		return
	}
	c.shaking = false
	cs := g.shaking[c.host]
	for i, o := range cs {
		if o == c {
			cs = append(cs[:i], cs[i+1:]...)
			break
		}
	}
	if len(cs) == 0 {
		delete(g.shaking, c.host)
	} else {
		g.shaking[c.host] = cs
	}
	g.shakes--
}

// hostOf is the address a peer's connections are counted under: its IP.
func hostOf(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// peerListener closes at once a connection from an address that holds
// MaxConnectionsPerPeer already, so that one address cannot take every
// slot of MaxConnections.
type peerListener struct {
	net.Listener
	g *Guard
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		host := hostOf(c.RemoteAddr())
		if _, ip := c.RemoteAddr().(*net.TCPAddr); !ip {
			// A Unix socket's peers have no address to count by.
			return &peerConn{Conn: c, g: l.g, host: host, uncounted: true}, nil
		}
		if !l.g.admit(host) {
			c.Close()
			l.g.refused(reasonPerPeer)
			l.g.logSampled(slog.LevelWarn, host, "connection refused: the address holds server.max_connections_per_peer connections", "limit", l.g.perPeer)
			continue
		}
		pc := &peerConn{Conn: c, g: l.g, host: host, accepted: time.Now()}
		l.g.shake(pc)
		return pc, nil
	}
}

// peerConn is an accepted connection: it gives its address's slot back
// when closed, and counts a handshake that handshake_timeout cut.
type peerConn struct {
	net.Conn
	g         *Guard
	host      string
	uncounted bool // not counted against its address (not TCP)
	// established is set once the client's HTTP/2 preface has been read.
	established atomic.Bool
	timedOut    atomic.Bool
	closed      atomic.Bool
	// accepted is when the connection was accepted; shaking says its
	// handshake is counted as under way (under the guard's mu); evicted
	// that the guard closed it for a newer one (max_handshakes).
	accepted time.Time
	shaking  bool
	evicted  atomic.Bool
}

func (c *peerConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	// gRPC sets a deadline of handshake_timeout on the connection until
	// its TLS and HTTP/2 handshakes are done, and none after.
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && !c.established.Load() && !c.evicted.Load() && !c.timedOut.Swap(true) {
		c.g.refused(reasonHandshakeTimeout)
		c.g.logger.Debug("connection closed: no handshake within server.handshake_timeout", "peer", c.host)
	}
	return n, err
}

func (c *peerConn) Close() error {
	if !c.closed.Swap(true) && !c.uncounted {
		c.g.shaken(c)
		c.g.release(c.host)
	}
	return c.Conn.Close()
}

// handshaken records that the client's HTTP/2 preface and first frame
// came: the connection's handshake is over.
func (c *peerConn) handshaken() {
	if !c.established.Swap(true) && !c.uncounted {
		c.g.shaken(c)
	}
}

// guardCreds wraps the server's transport credentials (TLS, or none) so
// that every connection gRPC serves is an [h2Conn].
type guardCreds struct {
	credentials.TransportCredentials
	g *Guard
}

func (c guardCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return nil, nil, err
	}
	pc, _ := raw.(*peerConn)
	return newH2Conn(conn, c.g, pc), info, nil
}

func (c guardCreds) Clone() credentials.TransportCredentials {
	return guardCreds{TransportCredentials: c.TransportCredentials.Clone(), g: c.g}
}

// Listener returns lis guarded: a connection from an address that holds
// MaxConnectionsPerPeer already is closed at once, counted and logged.
func (g *Guard) Listener(lis net.Listener) net.Listener { return &peerListener{Listener: lis, g: g} }

// Credentials returns creds (TLS, or none) with every connection they
// hand gRPC watched: its handshake's timeout counted, its HTTP/2 frames'
// headers read both ways (a header gRPC refused for its size, a client
// that only opens and resets streams).
func (g *Guard) Credentials(creds credentials.TransportCredentials) credentials.TransportCredentials {
	return guardCreds{TransportCredentials: creds, g: g}
}
