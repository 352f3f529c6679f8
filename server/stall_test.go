package server_test

import (
	"context"
	"fmt"
	"iter"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/server"
)

// flood streams 512 KiB of text at once, more than a client's window and
// gRPC's queue of a stream hold, then waits until release is closed to
// end its reply.
type flood struct{ release chan struct{} }

func (f flood) Stream(ctx context.Context, _ *llm.Request) iter.Seq2[llm.Chunk, error] {
	return func(yield func(llm.Chunk, error) bool) {
		for range 32 {
			if !yield(llm.Chunk{Kind: llm.ChunkText, Text: strings.Repeat("x", 16<<10)}, nil) {
				return
			}
		}
		select {
		case <-f.release:
		case <-ctx.Done():
			yield(llm.Chunk{}, ctx.Err())
			return
		}
		if yield(llm.Chunk{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 1, OutputTokens: 32}}, nil) {
			yield(llm.Chunk{Kind: llm.ChunkStop, Stop: llm.StopEndTurn}, nil)
		}
	}
}

// TestManyNeverReadingStreams: with the store on, 200 RunTurn streams
// over 10 connections whose clients never read, each turn streaming more
// than the client's window and gRPC's queue hold, are each closed
// DEADLINE_EXCEEDED by send_timeout while their turns still run: the
// stall watchdog of every stream fires, however many there are (that the
// turns go on detached is TestDurableSendTimeout's).
func TestManyNeverReadingStreams(t *testing.T) {
	t.Parallel()
	const conns, perConn = 10, 20
	var (
		mu    sync.Mutex
		ended = map[codes.Code]int{}
		msgs  []string
		all   = make(chan struct{})
	)
	watch := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		err := handler(srv, ss)
		if strings.HasSuffix(info.FullMethod, "/RunTurn") {
			mu.Lock()
			st := status.Convert(err)
			ended[st.Code()]++
			msgs = append(msgs, st.Message())
			if len(msgs) == conns*perConn {
				close(all)
			}
			mu.Unlock()
		}
		return err
	})
	f := flood{release: make(chan struct{})}
	ts := start(t, runner(t, f), server.Options{Store: memStore(t), SendTimeout: 300 * time.Millisecond, DetachGrace: time.Minute,
		GRPCOptions: []grpc.ServerOption{watch}})
	for c := range conns {
		client := stingyClient(t, ts)
		for s := range perConn {
			req := hello()
			req.TurnId = fmt.Sprintf("silent-%d-%d", c, s)
			if _, err := client.RunTurn(t.Context(), req); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Every stream ends before any turn does: the model has not answered.
	select {
	case <-all:
	case <-time.After(waitBound):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("not within %s: every stream ended; %d did, %v", waitBound, len(msgs), ended)
	}
	mu.Lock()
	if ended[codes.DeadlineExceeded] != conns*perConn {
		t.Errorf("the streams ended %v, want all %d DEADLINE_EXCEEDED", ended, conns*perConn)
	}
	for _, m := range msgs {
		if !strings.Contains(m, "server.send_timeout") {
			t.Errorf("a stream ended %q", m)
			break
		}
	}
	mu.Unlock()
	close(f.release)
}
