package guard

import (
	"log/slog"
	"net"
	"testing"
	"time"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
)

// TestHandshakeEviction: beyond MaxHandshakes handshakes under way, a new
// connection closes the oldest handshake of the address with the most
// under way (of two with as many, the one whose oldest is older); a
// connection whose handshake is over, or closed, no longer counts.
func TestHandshakeEviction(t *testing.T) {
	g := New(Options{Logger: slog.New(slog.DiscardHandler), MaxConnectionsPerPeer: 10, MaxHandshakes: 3, MeterProvider: metricnoop.NewMeterProvider()})
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	conn := func(host string) *peerConn {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		at = at.Add(time.Second)
		c := &peerConn{Conn: a, g: g, host: host, accepted: at}
		g.admit(host)
		g.shake(c)
		return c
	}
	a1, a2, b1 := conn("a"), conn("a"), conn("b")
	c1 := conn("c") // a holds the most: its oldest goes
	if !a1.evicted.Load() || a2.evicted.Load() || b1.evicted.Load() || c1.evicted.Load() {
		t.Fatalf("evicted: a1 %v a2 %v b1 %v c1 %v; want a1 alone", a1.evicted.Load(), a2.evicted.Load(), b1.evicted.Load(), c1.evicted.Load())
	}
	a2.handshaken() // done: it holds no handshake slot
	d1 := conn("d")
	if b1.evicted.Load() || c1.evicted.Load() {
		t.Fatal("a handshake was closed while there was room")
	}
	// a, b, c and d hold one each but a none now: b's is the oldest.
	conn("e")
	if !b1.evicted.Load() || c1.evicted.Load() || d1.evicted.Load() {
		t.Errorf("evicted: b1 %v c1 %v d1 %v; want b1, the oldest of the largest", b1.evicted.Load(), c1.evicted.Load(), d1.evicted.Load())
	}
	c1.Close()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shakes != 2 || len(g.shaking["c"]) != 0 || g.peers["a"] != 1 {
		t.Errorf("%d handshakes under way, c's %v, a's connections %d; want 2, none, 1", g.shakes, g.shaking["c"], g.peers["a"])
	}
}
