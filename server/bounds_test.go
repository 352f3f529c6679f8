package server_test

import (
	"context"
	"io"
	"iter"
	"maps"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
)

// endless is a provider that streams text until its call is cancelled,
// then closes stopped.
type endless struct{ stopped chan struct{} }

func (e *endless) Stream(ctx context.Context, _ *llm.Request) iter.Seq2[llm.Chunk, error] {
	return func(yield func(llm.Chunk, error) bool) {
		defer close(e.stopped)
		chunk := strings.Repeat("word ", 200)
		for ctx.Err() == nil {
			if !yield(llm.Chunk{Kind: llm.ChunkText, Text: chunk}, nil) {
				return
			}
		}
		yield(llm.Chunk{}, ctx.Err())
	}
}

// TestSendTimeout: a client that stops reading has its turn cancelled
// after send_timeout, the upstream call ends, and what it reads later ends
// with DEADLINE_EXCEEDED naming the setting.
func TestSendTimeout(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	p := &endless{stopped: make(chan struct{})}
	ts := start(t, runner(t, p), server.Options{SendTimeout: 300 * time.Millisecond, Logger: newLogger(&logs)})
	// Fixed 64 KiB windows: the client's buffer does not grow.
	conn, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := turnstilev1.NewAgentServiceClient(conn).RunTurn(t.Context(), hello())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream call was not stopped")
	}
	waitFor(t, func() bool { return strings.Contains(logs.String(), "error_code=DEADLINE_EXCEEDED") })
	// Reading now drains what was sent, then the status.
	var last *turnstilev1.AgentEvent
	for {
		resp, err := stream.Recv()
		if err != nil {
			st := status.Convert(err)
			if st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), "server.send_timeout") {
				t.Errorf("status %v", st)
			}
			break
		}
		last = resp.GetEvent()
	}
	if last.GetTextDelta() == nil {
		t.Errorf("last event read: %v", last)
	}
}

// bigTool answers every call with n bytes.
func bigTool(name string, n int) llm.Tool {
	return fake.NewTool(name, func(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error) {
		return llm.ToolOutput{Content: strings.Repeat("x", n)}, nil
	})
}

func limitedRunner(t *testing.T, p llm.Provider, edit func(*runtime.Limits), tools ...llm.Tool) *runtime.Runner {
	t.Helper()
	l := runtime.DefaultLimits()
	edit(&l)
	r, err := runtime.New([]*runtime.Model{{Alias: "sim", ProviderName: "fake", Provider: p, ID: "fake-1", Retry: policy.DefaultRetry()}}, "sim", tools, runtime.WithLimits(l))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestFiveMegabyteToolResult: with the defaults, a tool returning 5 MB
// does not cost the client its terminal event: every event fits gRPC's
// default 4 MiB and the server's 2 MiB limit.
func TestFiveMegabyteToolResult(t *testing.T) {
	t.Parallel()
	p := fake.NewProvider(fake.Reply{Chunks: fake.Call("c1", "dump", `{}`)}, fake.Reply{Chunks: fake.Text("read it")})
	ts := start(t, runner(t, p, bigTool("dump", 5<<20)), server.Options{})
	evs, st := wiretest.Collect(t, t.Context(), ts.client, hello(), nil)
	if st.Code() != codes.OK {
		t.Fatalf("status %v", st)
	}
	if got, want := wiretest.Names(evs), "TurnStarted LlmCallStarted ToolCallDelta LlmCallFinished Usage MessageCompleted ToolStarted ToolFinished MessageCompleted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted TurnCompleted"; got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	for _, ev := range evs {
		if n := proto.Size(ev); n > server.DefaultMaxEventBytes {
			t.Errorf("event %d is %d bytes", ev.GetSeq(), n)
		}
		if f := ev.GetToolFinished(); f != nil && !strings.Contains(f.GetContent(), "of 5242880 bytes are shown]") {
			t.Errorf("tool_finished does not say it was cut")
		}
	}
	if tc := evs[len(evs)-1].GetTurnCompleted(); tc.GetMessagesOmitted() || len(tc.GetMessages()) != 3 {
		t.Errorf("turn_completed: omitted=%v, %d messages", tc.GetMessagesOmitted(), len(tc.GetMessages()))
	}
}

// TestTurnCompletedOmitsMessages: a turn_completed over max_event_bytes
// comes without its messages, flagged; they are all in message_completed.
func TestTurnCompletedOmitsMessages(t *testing.T) {
	t.Parallel()
	p := fake.NewProvider(
		fake.Reply{Chunks: fake.Call("c1", "dump", `{}`)},
		fake.Reply{Chunks: fake.Call("c2", "dump", `{}`)},
		fake.Reply{Chunks: fake.Call("c3", "dump", `{}`)},
		fake.Reply{Chunks: fake.Text("done")},
	)
	r := limitedRunner(t, p, func(l *runtime.Limits) { l.MaxToolResultBytes = 30 << 10 }, bigTool("dump", 1<<20))
	ts := start(t, r, server.Options{MaxEventBytes: 64 << 10})
	evs, st := wiretest.Collect(t, t.Context(), ts.client, hello(), nil)
	if st.Code() != codes.OK {
		t.Fatalf("status %v", st)
	}
	var committed int
	for _, ev := range evs {
		if ev.GetMessageCompleted() != nil {
			committed++
		}
		if n := proto.Size(&turnstilev1.RunTurnResponse{Event: ev}); n > 64<<10 {
			t.Errorf("event %d (%T) is %d bytes", ev.GetSeq(), ev.GetPayload(), n)
		}
	}
	tc := evs[len(evs)-1].GetTurnCompleted()
	if !tc.GetMessagesOmitted() || len(tc.GetMessages()) != 0 || committed != 7 {
		t.Errorf("turn_completed omitted=%v with %d messages; %d message_completed", tc.GetMessagesOmitted(), len(tc.GetMessages()), committed)
	}
	if tc.GetEndReason() != turnstilev1.EndReason_END_REASON_END_TURN || tc.GetCounters().GetToolCalls() != 3 {
		t.Errorf("turn_completed %v", tc)
	}
}

// TestOversizedEventEndsTurn: an event that cannot be made to fit (here a
// reply longer than max_event_bytes) ends the turn with an error event in
// its place, matching the status, with no gap in seq.
func TestOversizedEventEndsTurn(t *testing.T) {
	t.Parallel()
	var chunks []llm.Chunk
	for range 100 {
		chunks = append(chunks, llm.Chunk{Kind: llm.ChunkText, Text: strings.Repeat("y", 1024)})
	}
	chunks = append(chunks, llm.Chunk{Kind: llm.ChunkStop, Stop: llm.StopEndTurn})
	var logs syncBuffer
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: chunks})), server.Options{MaxEventBytes: 64 << 10, Logger: newLogger(&logs)})
	evs, st := wiretest.Collect(t, t.Context(), ts.client, hello(), nil)
	if got, want := wiretest.Names(evs), "TurnStarted LlmCallStarted TextDelta LlmCallFinished Error"; got != want {
		t.Errorf("events:\n got %s\nwant %s", got, want)
	}
	if st.Code() != codes.Internal || !strings.Contains(st.Message(), "server.max_event_bytes") {
		t.Errorf("status %v", st)
	}
	assertStatusMatchesEvent(t, st, evs[len(evs)-1].GetError())
	waitFor(t, func() bool { return strings.Contains(logs.String(), "MessageCompleted of") })
}

// rawCodec sends bytes as they are, to put malformed messages on the wire.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}
func (rawCodec) Unmarshal(mem.BufferSlice, any) error { return nil }
func (rawCodec) Name() string                         { return "proto" }

// sendRaw calls RunTurn with b as the request and returns the status.
func sendRaw(t *testing.T, conn *grpc.ClientConn, b []byte) *status.Status {
	t.Helper()
	return callRaw(t, t.Context(), conn, "/turnstile.v1.AgentService/RunTurn", b)
}

// callRaw calls method with b as its request, whatever its kind (unary or
// streaming: the server goes by its own description of the method), reads
// every response and returns the status.
func callRaw(t *testing.T, ctx context.Context, conn *grpc.ClientConn, method string, b []byte) *status.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method, grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		return status.Convert(err)
	}
	if err := s.SendMsg(b); err != nil && err != io.EOF {
		return status.Convert(err)
	}
	_ = s.CloseSend()
	for {
		var m []byte
		if err := s.RecvMsg(&m); err != nil {
			if err == io.EOF {
				return status.New(codes.OK, "")
			}
			return status.Convert(err)
		}
	}
}

// errorInfoOf returns the status's ErrorInfo, nil without one.
func errorInfoOf(st *status.Status) *errdetails.ErrorInfo {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

// Every method of the server: unary (CancelTurn, health's Check) and
// streaming, the reflection services included.
var allMethods = []string{
	"/turnstile.v1.AgentService/RunTurn",
	"/turnstile.v1.AgentService/WatchTurn",
	"/turnstile.v1.AgentService/CancelTurn",
	"/grpc.health.v1.Health/Check",
	"/grpc.health.v1.Health/Watch",
	"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
}

// TestUndecodableRequestsEveryMethod: a request that does not decode is
// INVALID_ARGUMENT with ErrorInfo on every method, unary ones included,
// whose decoding grpc-go does before any interceptor; the RPC's log line
// is written as for any call.
func TestUndecodableRequestsEveryMethod(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("x")})), server.Options{Logger: newLogger(&logs)})
	bodies := []struct {
		name string
		b    []byte
		msg  string
	}{
		// Field 1 is a string in every request here.
		{"truncated field", []byte{0x0a, 0x05, 'a', 'b'}, "the request is not a valid protobuf message"},
		{"invalid UTF-8", []byte{0x0a, 0x02, 0xff, 0xfe}, "the request holds a string that is not valid UTF-8"},
	}
	for _, method := range allMethods {
		for _, body := range bodies {
			t.Run(method+"/"+body.name, func(t *testing.T) {
				st := callRaw(t, t.Context(), ts.conn, method, body.b)
				info := errorInfoOf(st)
				if st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), body.msg) {
					t.Errorf("status %v %q; want INVALID_ARGUMENT %q", st.Code(), st.Message(), body.msg)
				}
				if info.GetReason() != "INVALID_REQUEST" || info.GetDomain() != server.ErrorDomain || info.GetMetadata()["cause"] != "decode" {
					t.Errorf("ErrorInfo %v; want INVALID_REQUEST in %s with cause=decode", info, server.ErrorDomain)
				}
			})
		}
	}
	waitFor(t, func() bool {
		return strings.Contains(logs.String(), "grpc.method=CancelTurn") && strings.Contains(logs.String(), "grpc.method=Check")
	})
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "grpc.method=CancelTurn") && !strings.Contains(line, "grpc.code=InvalidArgument") {
			t.Errorf("CancelTurn's log line: %s", line)
		}
	}
}

// TestUndecodableUnaryRequestNeedsKey: the interceptors run before a unary
// method's decode failure is answered: without a key, a server with keys
// says UNAUTHENTICATED, whatever the bytes; health, open to all, says
// INVALID_ARGUMENT.
func TestUndecodableUnaryRequestNeedsKey(t *testing.T) {
	t.Parallel()
	ts := start(t, multiModel(t), server.Options{Keys: []server.Key{keyed("ops", "tok-ops-0123456789")}})
	garbage := []byte{0x0a, 0x05, 'a', 'b'}
	if st := callRaw(t, t.Context(), ts.conn, "/turnstile.v1.AgentService/CancelTurn", garbage); st.Code() != codes.Unauthenticated {
		t.Errorf("CancelTurn without a key: %v", st)
	}
	if st := callRaw(t, bearer(t.Context(), "tok-ops-0123456789"), ts.conn, "/turnstile.v1.AgentService/CancelTurn", garbage); st.Code() != codes.InvalidArgument {
		t.Errorf("CancelTurn with a key: %v", st)
	}
	if st := callRaw(t, t.Context(), ts.conn, "/grpc.health.v1.Health/Check", garbage); st.Code() != codes.InvalidArgument {
		t.Errorf("health without a key: %v", st)
	}
}

// TestUndecodableRequests: bytes that are not a RunTurnRequest, or that
// hold invalid UTF-8, are the client's error: INVALID_ARGUMENT with
// ErrorInfo, never INTERNAL.
func TestUndecodableRequests(t *testing.T) {
	t.Parallel()
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("x")})), server.Options{MaxRequestBytes: 64 << 10})
	valid, _ := proto.Marshal(hello())
	tests := []struct {
		name string
		b    []byte
		msg  string
	}{
		{"truncated field", []byte{0x22, 0x05, 'a', 'b'}, "not a valid protobuf message"},
		{"invalid UTF-8 in model", append(append([]byte{}, valid...), 0x12, 0x02, 0xff, 0xfe), "not valid UTF-8"},
		{"invalid wire type", []byte{0x0f}, "not a valid protobuf message"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			st := sendRaw(t, ts.conn, tt.b)
			if st.Code() != codes.InvalidArgument || reasonOf(st) != "INVALID_REQUEST" || !strings.Contains(st.Message(), tt.msg) {
				t.Errorf("status %v %q reason %q; want INVALID_ARGUMENT INVALID_REQUEST containing %q", st.Code(), st.Message(), reasonOf(st), tt.msg)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("the answer took %s", d)
			}
		})
	}
}

// TestRequestTooLarge: a request over max_request_bytes is refused on
// every method with RESOURCE_EXHAUSTED and ErrorInfo REQUEST_TOO_LARGE
// naming the limit, without RetryInfo and with nothing of the request; one
// over twice the limit is refused by gRPC as soon as its length is read,
// before it is all sent, without details.
func TestRequestTooLarge(t *testing.T) {
	t.Parallel()
	const limit = 64 << 10
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("x")})), server.Options{MaxRequestBytes: limit})
	over, huge := bigRequest(t, limit+100), bigRequest(t, 32<<20)
	for _, method := range allMethods {
		t.Run(method, func(t *testing.T) {
			st := callRaw(t, t.Context(), ts.conn, method, over)
			if want := "the request is larger than the server accepts (server.max_request_bytes: 65536 bytes)"; st.Code() != codes.ResourceExhausted || st.Message() != want {
				t.Errorf("status %v %q; want RESOURCE_EXHAUSTED %q", st.Code(), st.Message(), want)
			}
			info := errorInfoOf(st)
			want := map[string]string{"limit": "max_request_bytes", "max_bytes": "65536"}
			if info.GetReason() != "REQUEST_TOO_LARGE" || info.GetDomain() != server.ErrorDomain || !maps.Equal(info.GetMetadata(), want) {
				t.Errorf("ErrorInfo %v; want REQUEST_TOO_LARGE with %v", info, want)
			}
			if len(st.Details()) != 1 {
				t.Errorf("details %v; want ErrorInfo alone", st.Details())
			}

			start := time.Now()
			st = callRaw(t, t.Context(), ts.conn, method, huge)
			if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "larger than max") {
				t.Errorf("32 MiB: status %v", st)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("32 MiB: the answer took %s", d)
			}
		})
	}
	if _, st := wiretest.Collect(t, t.Context(), ts.client, hello(), nil); st.Code() != codes.OK {
		t.Errorf("the next turn on the connection: %v", st)
	}
}

// bigRequest returns a valid request of about n bytes.
func bigRequest(t *testing.T, n int) []byte {
	t.Helper()
	r := hello()
	r.System = strings.Repeat("s", n)
	b, err := proto.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMaxConnections: beyond max_connections a connection waits until
// another closes; a connection that never completes its handshake is
// closed after the handshake timeout.
func TestMaxConnections(t *testing.T) {
	t.Parallel()
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("x")})), server.Options{MaxConnections: 1, HandshakeTimeout: time.Minute})
	silent, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	check := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(t.Context(), d)
		defer cancel()
		_, err := healthpb.NewHealthClient(ts.conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		return err
	}
	if err := check(300 * time.Millisecond); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("with the one connection taken, health answered %v", err)
	}
	silent.Close()
	if err := check(10 * time.Second); err != nil {
		t.Errorf("after the silent connection closed: %v", err)
	}
}

func TestHandshakeTimeout(t *testing.T) {
	t.Parallel()
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("x")})), server.Options{HandshakeTimeout: 200 * time.Millisecond})
	c, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("the connection was not closed: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("closed after %s", d)
	}
}

// TestIdleConnectionsClosed: a connection without RPCs is closed after
// max_connection_idle.
func TestIdleConnectionsClosed(t *testing.T) {
	t.Parallel()
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("x")})), server.Options{MaxConnectionIdle: 200 * time.Millisecond})
	if _, err := healthpb.NewHealthClient(ts.conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for s := ts.conn.GetState(); s != connectivity.Idle; s = ts.conn.GetState() {
		if !ts.conn.WaitForStateChange(ctx, s) {
			t.Fatalf("the connection stayed %v", s)
		}
	}
}

// TestSendTimeoutOnTheLastEvent: a turn whose reply is larger than what
// the client's window and gRPC's queue take, and whose client reads
// nothing, ends DEADLINE_EXCEEDED after send_timeout: what the client reads
// later has no outcome, and the status says why. (TestOutboxFinishStalls
// holds the case where the last event is the one left.)
func TestSendTimeoutOnTheLastEvent(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	reply := []llm.Chunk{
		{Kind: llm.ChunkText, Text: strings.Repeat("z", 100<<10)},
		{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 1, OutputTokens: 1}},
		{Kind: llm.ChunkStop, Stop: llm.StopEndTurn},
	}
	ts := start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: reply})), server.Options{SendTimeout: 300 * time.Millisecond, Logger: newLogger(&logs)})
	conn, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := turnstilev1.NewAgentServiceClient(conn).RunTurn(t.Context(), hello())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(logs.String(), "error_code=DEADLINE_EXCEEDED") })
	var evs []*turnstilev1.AgentEvent
	var st *status.Status
	for {
		resp, err := stream.Recv()
		if err != nil {
			st = status.Convert(err)
			break
		}
		evs = append(evs, resp.GetEvent())
	}
	// How far the events got before gRPC's queue filled depends on timing;
	// the turn's outcome never arrives.
	if got, all := wiretest.Names(evs), "TurnStarted LlmCallStarted TextDelta LlmCallFinished Usage MessageCompleted"; len(evs) < 3 || !strings.HasPrefix(all, got) {
		t.Errorf("events:\n got %s\nwant a prefix of %s", got, all)
	}
	if st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), "server.send_timeout") {
		t.Errorf("status %v", st)
	}
}
