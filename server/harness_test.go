package server_test

// The package's test harness: every test server, store and NATS server of
// these tests starts here, each on its own loopback port, in its own
// temporary directory or in memory, stopped when its test ends. Nothing
// is shared between tests, so each test runs in parallel with the others
// (t.Parallel) unless it says why not.
//
// A test says what it needs:
//
//	ts := start(t, r, server.Options{})                       // a server of runner r, no store
//	ts := start(t, r, server.Options{Store: memStore(t)})     // with the embedded store, in memory
//	rs := startReplicas(t, 2, runnerOf, opts)                 // replicas on one NATS server
//	st := openStore(t, onNATS(url), withLeaseTTL(10*time.Second)) // a store configured further
//
// A server given no logger logs at DEBUG into ts.logs, which the test can
// wait on (ts.logs.awaitLine) and which is printed when the test fails.
// Waits are for events: a log line, a status, a store's state; waitBound
// only bounds a wait that never ends.

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/natstest"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/store"
)

// parallelTests is how many tests run at once when -parallel is not
// given: they wait on loopback connections, NATS and each other far more
// than they compute, so more than the default of one per core keep two
// cores busy.
const parallelTests = "8"

func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", parallelTests)
	}
	goleak.VerifyTestMain(m,
		// The embedded NATS server's workers end just after Shutdown returns.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
	)
}

// waitBound is how long a test waits for an event before it fails: far
// longer than any of them takes on a loaded machine.
const waitBound = 30 * time.Second

// atNoon is a clock that stands still, at noon UTC (server.Options.Clock):
// on it no day ends, no bucket refills and no sampled log line comes back
// while a test runs, however fast or slow the machine.
func atNoon() time.Time { return time.Date(2030, time.June, 14, 12, 0, 0, 0, time.UTC) }

// testServer is a real server on a loopback port with a client connection.
type testServer struct {
	srv    *server.Server
	conn   *grpc.ClientConn
	client turnstilev1.AgentServiceClient
	addr   string
	// store is the server's turn store, nil without one: closing it kills
	// the replica as far as the others can tell.
	store *store.Store
	// nats is the URL of the NATS server the replicas of startReplicas
	// share; empty for any other server.
	nats string
	// logs holds the server's log (at DEBUG) when the test gave it no
	// logger of its own; nil otherwise, and for benchmarks.
	logs *syncBuffer
}

// start serves r with opts on a loopback port of its own, and connects a
// client to it; both stop when the test ends.
func start(t testing.TB, r *runtime.Runner, opts server.Options) *testServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, lis, r, opts)
}

// serveOn serves r with opts on lis, as start does; a Unix socket's
// client connects by its path.
func serveOn(t testing.TB, lis net.Listener, r *runtime.Runner, opts server.Options) *testServer {
	t.Helper()
	ts := &testServer{addr: lis.Addr().String()}
	if s, ok := opts.Store.(*store.Store); ok {
		ts.store = s
	}
	if _, bench := t.(*testing.B); opts.Logger == nil && !bench {
		ts.logs = &syncBuffer{}
		opts.Logger = newLogger(ts.logs)
	}
	ts.srv = server.New(r, opts)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := ts.srv.Serve(lis); err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	target := ts.addr
	if lis.Addr().Network() == "unix" {
		target = "unix:" + ts.addr
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ts.conn, ts.client = conn, turnstilev1.NewAgentServiceClient(conn)
	t.Cleanup(func() {
		conn.Close()
		ts.srv.Stop()
		<-done
		if t.Failed() && ts.logs != nil {
			t.Logf("the log of the server on %s:\n%s", ts.addr, ts.logs.String())
		}
	})
	return ts
}

// startReplicas starts n servers sharing one NATS server, as the replicas
// of a deployment do: each has a store connection of its own (its
// testServer's store), opened with stores after the harness's defaults;
// server i runs runner(i) with opts(i), or with no options when opts is
// nil.
func startReplicas(t testing.TB, n int, runner func(i int) *runtime.Runner, opts func(i int) server.Options, stores ...storeOption) []*testServer {
	t.Helper()
	url := natsServer(t)
	var out []*testServer
	for i := range n {
		var o server.Options
		if opts != nil {
			o = opts(i)
		}
		o.Store = openStore(t, append([]storeOption{onNATS(url)}, stores...)...)
		ts := start(t, runner(i), o)
		ts.nats = url
		out = append(out, ts)
	}
	return out
}

// detachAfter returns the options of replicas whose turns outlive their
// streams by grace.
func detachAfter(grace time.Duration) func(int) server.Options {
	return func(int) server.Options { return server.Options{DetachGrace: grace} }
}

// openStore opens a turn store that the test's end closes: by default the
// embedded one, in memory, its leases lasting a second (a replica killed
// is taken over soon, and one a loaded machine holds up for less keeps its
// lease), logging at INFO into a buffer printed when the test fails; each
// option changes that in turn. It never uses the default directory, which
// depends on the user.
func openStore(t testing.TB, opts ...storeOption) *store.Store {
	t.Helper()
	var logs *syncBuffer
	s := storeSetup{cfg: store.DefaultConfig()}
	s.cfg.Dir, s.cfg.LeaseTTL = "", time.Second
	if _, bench := t.(*testing.B); !bench {
		logs = &syncBuffer{}
		s.logger = slog.New(slog.NewTextHandler(logs, nil))
	}
	for _, o := range opts {
		o(&s)
	}
	st, err := store.Open(context.Background(), s.cfg, s.logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		st.Close()
		if t.Failed() && logs != nil && logs.String() != "" {
			t.Logf("the log of store %s:\n%s", st.ReplicaID(), logs.String())
		}
	})
	return st
}

// storeSetup is what openStore opens a store with.
type storeSetup struct {
	cfg    store.Config
	logger *slog.Logger
}

// A storeOption changes how openStore opens a store.
type storeOption func(*storeSetup)

// onNATS opens the store on the NATS servers at urls (comma-separated),
// as one replica.
func onNATS(urls string) storeOption {
	return func(s *storeSetup) { s.cfg.Mode, s.cfg.NATS.URL = store.ModeNATS, urls }
}

// inDir opens an embedded store that keeps its files in dir.
func inDir(dir string) storeOption { return func(s *storeSetup) { s.cfg.Dir = dir } }

// withLeaseTTL opens a store whose leases last ttl.
func withLeaseTTL(ttl time.Duration) storeOption { return func(s *storeSetup) { s.cfg.LeaseTTL = ttl } }

// withConfig changes the store's configuration with f.
func withConfig(f func(*store.Config)) storeOption { return func(s *storeSetup) { f(&s.cfg) } }

// withLogger gives the store the logger l instead of the harness's.
func withLogger(l *slog.Logger) storeOption { return func(s *storeSetup) { s.logger = l } }

// memStore opens an embedded store that keeps everything in memory.
func memStore(t testing.TB) *store.Store { return openStore(t) }

// natsServer starts a NATS server with JetStream on a loopback port, as a
// cluster of replicas would share, and returns its URL.
func natsServer(t testing.TB) string { return natstest.Start(t) }

// jetStream connects to the NATS server at urls, as a client that looks
// at what the stores made there; the connection closes when the test
// ends.
func jetStream(t testing.TB, urls string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(urls)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// clusterStore opens a store on the NATS server at url, as one replica.
func clusterStore(t testing.TB, url string) *store.Store { return openStore(t, onNATS(url)) }

// syncBuffer is a bytes.Buffer safe for the logger's goroutines, which a
// test can wait on. Its zero value is empty and ready.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	// written is closed at the next write, nil until someone waits.
	written chan struct{}
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.written != nil {
		close(b.written)
		b.written = nil
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// await waits until cond holds of what was written, woken by each write;
// the test fails after waitBound, saying it waited for what.
func (b *syncBuffer) await(t testing.TB, what string, cond func(logs string) bool) {
	t.Helper()
	timeout := time.NewTimer(waitBound)
	defer timeout.Stop()
	for {
		b.mu.Lock()
		logs := b.buf.String()
		if b.written == nil {
			b.written = make(chan struct{})
		}
		written := b.written
		b.mu.Unlock()
		if cond(logs) {
			return
		}
		select {
		case <-written:
		case <-timeout.C:
			t.Fatalf("not within %s: %s; the log:\n%s", waitBound, what, logs)
		}
	}
}

// awaitLine waits until a line holding substr was written.
func (b *syncBuffer) awaitLine(t testing.TB, substr string) {
	t.Helper()
	b.await(t, "a log line with "+substr, func(logs string) bool { return strings.Contains(logs, substr) })
}

// awaitCalls waits until n calls of the RPC method (RunTurn, WatchTurn...)
// have finished: the server has logged their lines, which it writes once
// their handlers returned.
func (b *syncBuffer) awaitCalls(t testing.TB, method string, n int) {
	t.Helper()
	b.await(t, fmt.Sprintf("%d finished %s calls", n, method), func(logs string) bool {
		return finishedCalls(logs, method) >= n
	})
}

// finishedCalls counts the lines of finished calls of the RPC method in
// logs, a text logger's.
func finishedCalls(logs, method string) int {
	n := 0
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, `msg="finished call"`) && strings.Contains(l, " grpc.method="+method+" ") {
			n++
		}
	}
	return n
}

// newLogger returns a text logger at debug level writing to w.
func newLogger(w *syncBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// waitFor polls cond, a state with no event to wait on (a metric, a
// store's content), until it holds; the test fails after waitBound.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	eventually(t, "the condition", cond)
}

// eventually polls f until it reports true, saying what it waits for
// when it never does within waitBound.
func eventually(t testing.TB, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", waitBound, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
