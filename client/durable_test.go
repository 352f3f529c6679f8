package client_test

import (
	"bytes"
	"context"
	"io"
	"iter"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/client"
	"github.com/turnstile-dev/turnstile/internal/natstest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/store"
)

// proxy forwards TCP connections to a server, and can cut them all and
// stop taking new ones, as a network partition or a dead load balancer
// would. With cutOn set it cuts them itself, once, the first time the
// server sends an HTTP/2 DATA frame holding those bytes, before forwarding
// that frame (and, with refuse, stops taking new connections).
type proxy struct {
	lis    net.Listener
	target string
	cutOn  []byte
	refuse bool
	mu     sync.Mutex
	conns  []net.Conn
	cut    bool
	wg     sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{lis: lis, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// newCutProxy returns a proxy to target that cuts every connection the
// first time the server sends a DATA frame holding on; with refuse it
// then takes no new connection, else it forwards them as before.
func newCutProxy(t *testing.T, target, on string, refuse bool) *proxy {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{lis: lis, target: target, cutOn: []byte(on), refuse: refuse}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.lis.Addr().String() }

// forwardFrames copies the server's HTTP/2 frames from up to c, whole, and
// cuts every connection instead of forwarding the first DATA frame that
// holds p.cutOn. A server's side of an HTTP/2 connection is frames from its
// first byte: a 9-byte header (24-bit length, type, flags, stream id), then
// the payload.
func (p *proxy) forwardFrames(c, up net.Conn) {
	var buf []byte
	chunk := make([]byte, 32<<10)
	for {
		n, err := up.Read(chunk)
		if err != nil {
			return
		}
		buf = append(buf, chunk[:n]...)
		for len(buf) >= 9 {
			size := 9 + (int(buf[0])<<16 | int(buf[1])<<8 | int(buf[2]))
			if len(buf) < size {
				break
			}
			frame := buf[:size]
			if frame[3] == 0 && p.cutFrame(frame[9:]) {
				return
			}
			if _, err := c.Write(frame); err != nil {
				return
			}
			buf = buf[size:]
		}
	}
}

// cutFrame cuts every connection when payload is the first to hold
// p.cutOn, and reports whether it did.
func (p *proxy) cutFrame(payload []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut || !bytes.Contains(payload, p.cutOn) {
		return false
	}
	p.cut = true
	if p.refuse {
		p.lis.Close()
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	return true
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); _, _ = io.Copy(up, c); up.Close() }()
		go func() {
			defer p.wg.Done()
			if p.cutOn != nil {
				p.forwardFrames(c, up)
			} else {
				_, _ = io.Copy(c, up)
			}
			c.Close()
		}()
	}
}

// close stops taking connections and cuts the open ones.
func (p *proxy) close() {
	p.lis.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// sharedStores starts a NATS server on loopback and opens n stores on it,
// one per replica.
func sharedStores(t *testing.T, n int) []*store.Store {
	t.Helper()
	url := natstest.Start(t)
	var out []*store.Store
	for range n {
		cfg := store.DefaultConfig()
		cfg.Mode, cfg.NATS.URL, cfg.LeaseTTL = store.ModeNATS, url, 500*time.Millisecond
		s, err := store.Open(context.Background(), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		out = append(out, s)
	}
	return out
}

// serveDurable serves r with st as its turn store on a loopback port.
func serveDurable(t *testing.T, r *replica, st *store.Store) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(r, server.Options{Store: st})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() { srv.Stop(); <-done })
	return lis.Addr().String()
}

// TestBrokenStreamReattaches: the connection to the replica running a
// turn is cut mid-reply; the client re-attaches on the other replica from
// the last seq it received, and the turn goes on: no step retry, no model
// call or tool run twice, every event once and in order.
func TestBrokenStreamReattaches(t *testing.T) {
	tool := &counter{}
	streaming, resume := make(chan struct{}), make(chan struct{})
	p := &scripted{fn: func(ctx context.Context, call int, req *llm.Request) iter.Seq2[llm.Chunk, error] {
		if call == 1 {
			return callTool("call_1", "counter", `{}`)
		}
		return func(yield func(llm.Chunk, error) bool) {
			if !yield(llm.Chunk{Kind: llm.ChunkText, Text: "Half an "}, nil) {
				return
			}
			close(streaming)
			select {
			case <-resume:
			case <-ctx.Done():
				return
			}
			for c := range reply("hour.") {
				if !yield(c, nil) {
					return
				}
			}
		}
	}}
	stores := sharedStores(t, 2)
	a, b := newReplica(t, p, tool), newReplica(t, p, tool)
	pa, pb := newProxy(t, serveDurable(t, a, stores[0])), newProxy(t, serveDurable(t, b, stores[1]))
	var logs lockedBuffer
	c := newClient(t, pa.addr()+","+pb.addr(), client.WithMaxStepRetries(2), client.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))

	turn := c.RunTurn(t.Context(), userRequest("how long?"))
	var evs []*client.Event
	for ev, err := range turn.Events() {
		if err != nil {
			t.Fatalf("turn failed: %v", err)
		}
		evs = append(evs, ev)
		if d := ev.Agent.GetTextDelta(); d != nil && d.GetText() == "Half an " {
			<-streaming
			// Cut the owner off the network: the client can reach only
			// the other replica, which reads the run from the store.
			if len(a.served()) == 1 {
				pa.close()
			} else {
				pb.close()
			}
			close(resume)
		}
	}
	if !strings.Contains(logs.String(), "re-attaching to the turn") {
		t.Errorf("the client did not re-attach; its log:\n%s", logs.String())
	}
	if n := len(stepRetries(evs)); n != 0 {
		t.Errorf("%d step retries, want 0", n)
	}
	for i, ev := range evs {
		if ev.Agent.GetSeq() != uint64(i+1) || ev.Attempt != 1 || ev.Agent.GetAttempt() != 1 {
			t.Fatalf("event %d: seq %d attempt %d/%d", i, ev.Agent.GetSeq(), ev.Attempt, ev.Agent.GetAttempt())
		}
	}
	if got := text(evs, 1); got != "Half an hour." {
		t.Errorf("text = %q", got)
	}
	if n := tool.runs.Load(); n != 1 {
		t.Errorf("the tool ran %d times", n)
	}
	p.mu.Lock()
	calls := p.calls
	p.mu.Unlock()
	if calls != 2 {
		t.Errorf("model calls = %d, want 2", calls)
	}
	if res := turn.Result(); res == nil || res.Attempts != 1 || len(res.Messages) != 3 {
		t.Errorf("result = %+v", res)
	}
}
