package server_test

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/server"
)

// TestSilentPeersDoNotStarveATurn: 30 addresses each holding 50 TLS
// connections that never send their ClientHello (1,500, over the default
// max_connections of 1,024, and each address under its
// max_connections_per_peer) do not keep a client from another address
// from its turn: at most max_handshakes (default 256) handshakes are under
// way at once, each connection beyond closing the oldest of the address
// with the most, so the silent ones hold 256 slots and the rest are free.
// Every one closed is counted (refusals, reason handshake_limit), none by
// handshake_timeout (an hour here: without the bound, the client would
// wait that long in the listen backlog; the red team's waited 8.2 s with
// the default 10 s). The log's clock stands still: each address's lines
// are its burst, however long the connections take to come.
func TestSilentPeersDoNotStarveATurn(t *testing.T) {
	t.Parallel()
	const peers, perPeer = 30, 50
	ca := wiretest.NewCA(t, "server CA")
	dir := t.TempDir()
	c, k := ca.Issue(t, "turnstile", true)
	cfg, err := server.LoadTLS(server.TLSFiles{CertFile: wiretest.WriteFile(t, dir, "cert.pem", c), KeyFile: wiretest.WriteFile(t, dir, "key.pem", k)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := newMeter()
	var logs syncBuffer
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("hi")})),
		server.Options{TLS: cfg, MeterProvider: m, Logger: newLogger(&logs), HandshakeTimeout: time.Hour,
			Clock: atNoon})
	_, port, _ := net.SplitHostPort(ts.addr)
	for p := range peers {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+p))}}
		for range perPeer {
			conn, err := d.Dial("tcp", net.JoinHostPort("127.0.0.1", port))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
		}
	}
	limit := attribute.String("reason", "handshake_limit")
	evicted := int64(peers*perPeer - server.DefaultMaxHandshakes)
	// Every silent connection was accepted: all but 256 closed for newer ones.
	waitFor(t, func() bool { return m.sum(t, "turnstile.server.refusals", limit) == evicted })

	conn, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool()})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A guard against a hang, not a measure: without the bound the turn
	// waits for the silent connections' hour.
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	if evs, st := wiretest.Collect(t, ctx, turnstilev1.NewAgentServiceClient(conn), hello(), nil); st.Code() != codes.OK || len(evs) == 0 {
		t.Fatalf("the turn of a client from another address, while 30 addresses hold silent connections: %v after %d events", st, len(evs))
	}
	// Its connection closed one more silent handshake; none timed out.
	if n := m.sum(t, "turnstile.server.refusals", limit); n != evicted+1 {
		t.Errorf("%d connections closed for max_handshakes, want %d", n, evicted+1)
	}
	if n := m.sum(t, "turnstile.server.refusals", attribute.String("reason", "handshake_timeout")); n != 0 {
		t.Errorf("%d handshakes timed out, want none", n)
	}
	if n := m.sum(t, "turnstile.server.refusals", attribute.String("reason", "per_peer_limit")); n != 0 {
		t.Errorf("%d connections refused per peer, want none", n)
	}
	if n := countLines(logs.String(), "server.max_handshakes"); n == 0 || n > peers*6 {
		t.Errorf("%d lines about connections closed for max_handshakes, want some, sampled per address", n)
	}
}
