// Package natstest starts NATS servers with JetStream for tests: one on a
// loopback port, as the replicas of a deployment share, or a cluster of
// several. Each is stopped by the test's cleanup.
package natstest

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
)

// options returns the options of a test server: loopback, JetStream in a
// temporary directory, payloads as large as the embedded store's.
func options(tb testing.TB) *natsserver.Options {
	return &natsserver.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: tb.TempDir(),
		NoSigs: true, NoLog: true, MaxPayload: 8 << 20,
	}
}

// Start starts a NATS server with JetStream on a loopback port and returns
// its client URL.
func Start(tb testing.TB) string {
	tb.Helper()
	ns := start(tb, options(tb))
	if !ns.ReadyForConnections(10 * time.Second) {
		tb.Fatal("natstest: the server did not start")
	}
	return ns.ClientURL()
}

// StartWith starts a NATS server like [Start], with its options changed by
// configure first (TLS, users, an operator...), and returns its client
// URL.
func StartWith(tb testing.TB, configure func(*natsserver.Options)) string {
	tb.Helper()
	o := options(tb)
	configure(o)
	ns := start(tb, o)
	if !ns.ReadyForConnections(10 * time.Second) {
		tb.Fatal("natstest: the server did not start")
	}
	return ns.ClientURL()
}

func start(tb testing.TB, o *natsserver.Options) *natsserver.Server {
	tb.Helper()
	ns, err := natsserver.NewServer(o)
	if err != nil {
		tb.Fatal(err)
	}
	ns.Start()
	tb.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

// Cluster starts a JetStream cluster of n servers on loopback and returns
// them with their client URLs, once the cluster has formed.
func Cluster(tb testing.TB, n int) ([]*natsserver.Server, []string) {
	tb.Helper()
	urls, startAll := ClusterLater(tb, n)
	servers := startAll()
	// A server is ready once the cluster has formed: wait for each only
	// after starting them all.
	for _, ns := range servers {
		if !ns.ReadyForConnections(30 * time.Second) {
			tb.Fatal("natstest: the cluster did not form")
		}
	}
	return servers, urls
}

// ClusterLater chooses the loopback ports of a JetStream cluster of n
// servers and returns their client URLs, and start, which starts the
// servers and returns them without waiting for anything: as a new install
// does, clients may be started first or at the same time, and the cluster
// forms while they try to use it.
func ClusterLater(tb testing.TB, n int) (urls []string, startAll func() []*natsserver.Server) {
	tb.Helper()
	ports := freePorts(tb, 2*n)
	routes := make([]string, n)
	for i := range n {
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", ports[n+i])
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", ports[i]))
	}
	return urls, func() []*natsserver.Server {
		var servers []*natsserver.Server
		for i := range n {
			o := options(tb)
			o.Port = ports[i]
			o.ServerName = fmt.Sprintf("n%d", i)
			o.Cluster = natsserver.ClusterOpts{Name: "turnstile-test", Host: "127.0.0.1", Port: ports[n+i]}
			o.Routes = natsserver.RoutesFromStr(strings.Join(routes, ","))
			servers = append(servers, start(tb, o))
		}
		return servers
	}
}

// freePorts returns n loopback ports free a moment ago.
func freePorts(tb testing.TB, n int) []int {
	tb.Helper()
	ports := make([]int, n)
	var ls []net.Listener
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}
