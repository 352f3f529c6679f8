package server

import (
	"io"
	"net"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
)

// TestDrainingRefusesNewTurns: once the drain delay is over, a turn that
// still reaches the server is refused before any event with a retryable
// UNAVAILABLE, so the client goes to another replica.
func TestDrainingRefusesNewTurns(t *testing.T) {
	t.Parallel()
	r, err := runtime.New([]*runtime.Model{{Alias: "m", Provider: fake.NewProvider(fake.Reply{Chunks: fake.Text("hi")}), ID: "m", Retry: policy.DefaultRetry()}}, "m", nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := New(r, Options{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	defer func() { srv.Stop(); <-done }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	srv.service.drain()
	stream, err := turnstilev1.NewAgentServiceClient(conn).RunTurn(t.Context(), &turnstilev1.RunTurnRequest{
		Messages: []*turnstilev1.Message{{Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "hi"}}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err == io.EOF || resp != nil {
		t.Fatalf("got event %v, want the turn refused", resp)
	}
	st := status.Convert(err)
	var info *errdetails.ErrorInfo
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			retry = d
		}
	}
	if st.Code() != codes.Unavailable || info.GetReason() != "UNAVAILABLE" || retry == nil {
		t.Errorf("status %v, ErrorInfo %v, RetryInfo %v", st, info, retry)
	}
}
