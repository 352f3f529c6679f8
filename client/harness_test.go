package client_test

import (
	"context"
	"fmt"
	"iter"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/turnstile-dev/turnstile/client"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
)

// This file holds the test harness: a real server.Server over a real
// runtime.Runner on loopback, with a scripted upstream model (the fake
// upstream, like an httptest server) and a tool that counts its runs.

// script answers model call number call (from 1, counted across every
// turn and replica sharing the provider).
type script func(ctx context.Context, call int, req *llm.Request) iter.Seq2[llm.Chunk, error]

// scripted is a runtime.Provider that follows a script.
type scripted struct {
	fn    script
	mu    sync.Mutex
	calls int
}

func (s *scripted) Stream(ctx context.Context, req *llm.Request) iter.Seq2[llm.Chunk, error] {
	s.mu.Lock()
	s.calls++
	n := s.calls
	s.mu.Unlock()
	return s.fn(ctx, n, req)
}

// reply streams the texts as tokens and ends the reply.
func reply(texts ...string) iter.Seq2[llm.Chunk, error] {
	return func(yield func(llm.Chunk, error) bool) {
		for _, s := range texts {
			if !yield(llm.Chunk{Kind: llm.ChunkText, Text: s}, nil) {
				return
			}
		}
		if !yield(llm.Chunk{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 10, OutputTokens: int64(len(texts))}}, nil) {
			return
		}
		yield(llm.Chunk{Kind: llm.ChunkStop, Stop: llm.StopEndTurn}, nil)
	}
}

// callTool asks for tool name with args.
func callTool(id, name, args string) iter.Seq2[llm.Chunk, error] {
	return func(yield func(llm.Chunk, error) bool) {
		for _, c := range []llm.Chunk{
			{Kind: llm.ChunkToolCallStart, CallID: id, Name: name},
			{Kind: llm.ChunkToolCallArgs, Text: args},
			{Kind: llm.ChunkToolCallEnd},
			{Kind: llm.ChunkStop, Stop: llm.StopToolUse},
		} {
			if !yield(c, nil) {
				return
			}
		}
	}
}

// fail streams the texts, then fails with err.
func fail(err *llm.Error, texts ...string) iter.Seq2[llm.Chunk, error] {
	return func(yield func(llm.Chunk, error) bool) {
		for _, s := range texts {
			if !yield(llm.Chunk{Kind: llm.ChunkText, Text: s}, nil) {
				return
			}
		}
		yield(llm.Chunk{}, err)
	}
}

// hang streams the texts, closes started, then hangs until ctx is done.
func hang(ctx context.Context, started chan<- struct{}, texts ...string) iter.Seq2[llm.Chunk, error] {
	return func(yield func(llm.Chunk, error) bool) {
		for _, s := range texts {
			if !yield(llm.Chunk{Kind: llm.ChunkText, Text: s}, nil) {
				return
			}
		}
		if started != nil {
			close(started)
		}
		<-ctx.Done()
	}
}

// counter is a server-side tool with side effects that counts its runs.
type counter struct{ runs atomic.Int32 }

func (c *counter) Spec() llm.ToolSpec {
	return llm.ToolSpec{Name: "counter", Description: "Adds one to a counter and returns it."}
}

func (c *counter) Call(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error) {
	n := c.runs.Add(1)
	return llm.ToolOutput{Content: fmt.Sprintf(`{"count":%d}`, n)}, nil
}

// blocker is a server-side tool that closes started and runs until its
// context ends.
type blocker struct{ started chan struct{} }

func (b *blocker) Spec() llm.ToolSpec {
	return llm.ToolSpec{Name: "deploy", Description: "Deploys the service."}
}

func (b *blocker) Call(ctx context.Context, _ llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
	close(b.started)
	<-ctx.Done()
	return llm.ToolOutput{}, ctx.Err()
}

// recorded is one RunTurn a replica served.
type recorded struct {
	req     *runtime.TurnRequest
	attempt string // the turnstile-attempt header
	auth    string // the authorization header
}

// replica wraps a real runtime.Runner: it records the requests the server
// received and, when clearRetryable is set, strips the retry advice from
// terminal errors (the runtime always gives some) to show a server that
// gives none.
type replica struct {
	*runtime.Runner
	clearRetryable bool

	mu    sync.Mutex
	turns []recorded
	ended chan error // the context's error each time Run returns
}

func (r *replica) Run(ctx context.Context, req *runtime.TurnRequest, sink runtime.Sink) (*runtime.TurnCompleted, error) {
	rec := recorded{req: req}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(client.AttemptHeader); len(v) > 0 {
			rec.attempt = v[0]
		}
		if v := md.Get("authorization"); len(v) > 0 {
			rec.auth = v[0]
		}
	}
	r.mu.Lock()
	r.turns = append(r.turns, rec)
	r.mu.Unlock()
	if r.clearRetryable {
		inner := sink
		sink = runtime.SinkFunc(func(ctx context.Context, ev runtime.Event) error {
			if te, ok := ev.Payload.(*runtime.TurnError); ok {
				e := *te
				e.Retryable, e.RetryAfter = nil, 0
				ev.Payload = &e
			}
			return inner.Emit(ctx, ev)
		})
	}
	res, err := r.Runner.Run(ctx, req, sink)
	select {
	case r.ended <- ctx.Err():
	default:
	}
	return res, err
}

func (r *replica) served() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recorded(nil), r.turns...)
}

// newReplica returns a replica whose runner serves model "test" on p with
// the tools given.
func newReplica(tb testing.TB, p llm.Provider, tools ...llm.Tool) *replica {
	tb.Helper()
	r, err := buildReplica(p, tools...)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

func buildReplica(p llm.Provider, tools ...llm.Tool) (*replica, error) {
	r, err := runtime.New([]*runtime.Model{{
		Alias: "test", ProviderName: "scripted", Provider: p, ID: "scripted-1",
		// No retries inside the turn: the client's step retry is under test.
		Retry: policy.Retry{MaxRetries: 0, Multiplier: 1},
	}}, "test", tools)
	if err != nil {
		return nil, err
	}
	return &replica{Runner: r, ended: make(chan error, 8)}, nil
}

// serve starts a real gRPC server for r on a loopback port and returns its
// address; the test's cleanup stops it.
func serve(tb testing.TB, r *replica) (string, *server.Server) {
	tb.Helper()
	addr, srv, stop := startServer(r)
	tb.Cleanup(stop)
	return addr, srv
}

// serveWith is serve with server options.
func serveWith(tb testing.TB, r *replica, opts server.Options) string {
	tb.Helper()
	addr, _, stop := startServer(r, opts)
	tb.Cleanup(stop)
	return addr
}

// startServer starts a real gRPC server for r on a loopback port; stop
// stops it and waits for it.
func startServer(r *replica, opts ...server.Options) (addr string, srv *server.Server, stop func()) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	var o server.Options
	if len(opts) > 0 {
		o = opts[0]
	}
	srv = server.New(r, o)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	return lis.Addr().String(), srv, func() { srv.Stop(); <-done }
}

// newClient returns a plaintext client for target with fast retries; the
// test's cleanup closes it.
func newClient(tb testing.TB, target string, opts ...client.Option) *client.Client {
	tb.Helper()
	opts = append([]client.Option{
		client.WithInsecure(),
		client.WithBackoff(client.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond, Multiplier: 2}),
	}, opts...)
	c, err := client.New(target, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}
