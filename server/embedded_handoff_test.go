package server_test

import (
	"context"
	"iter"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/server"
)

// TestEmbeddedHandOffInProcess: with the embedded store, whose turns are
// held in the process and write no lease, a turn a server hands off at
// shutdown is still taken over at once by another server on the same
// store (what a released lease did): the shutting-down server's stream
// ends UNAVAILABLE saying to watch again, and watching on the other it
// gets the rest of the turn, the interrupted call's output discarded,
// equal to the log, long before a lease TTL.
func TestEmbeddedHandOffInProcess(t *testing.T) {
	t.Parallel()
	p := &byCall{script: func(ctx context.Context, n int) iter.Seq2[llm.Chunk, error] {
		if n == 1 {
			return chunks(ctx, true, textChunk("Hel"), textChunk("lo "))
		}
		return chunks(ctx, false, fake.Text("Hello world")...)
	}}
	const leaseTTL = 10 * time.Second
	st := openStore(t, inDir(t.TempDir()), withLeaseTTL(leaseTTL))
	const grace = 300 * time.Millisecond
	a := start(t, runner(t, p), server.Options{Store: st, ShutdownGrace: grace})
	b := start(t, runner(t, p), server.Options{Store: st})

	stream, err := a.client.RunTurn(t.Context(), hello())
	if err != nil {
		t.Fatal(err)
	}
	head := until(t, stream, textSoFar("Hello "))
	stopped := make(chan struct{})
	go func() { defer close(stopped); a.srv.Shutdown(context.Background()) }()
	_, err = stream.Recv()
	handedOff := time.Now()
	if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "another server takes the turn over") {
		t.Fatalf("a's stream ended with %v, want UNAVAILABLE saying another server takes the turn over", st)
	}

	rest, first, wst := watchAfterHandOff(t, b.client, head[len(head)-1].GetSeq())
	<-stopped
	if wst.Code() != codes.OK {
		t.Fatalf("watch on b: %v", wst)
	}
	tookOver(t, b, p, append(head, rest...), first.Sub(handedOff), leaseTTL)
}
