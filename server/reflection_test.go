package server

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
)

// The embedded contract is the generated code's contract plus its
// documentation: the same descriptors once source info is dropped.
func TestEmbeddedContractMatchesGeneratedCode(t *testing.T) {
	t.Parallel()
	files, err := documentedFiles()
	if err != nil {
		t.Fatal(err)
	}
	for _, gen := range []protoreflect.FileDescriptor{
		turnstilev1.File_turnstile_v1_agent_proto,
		turnstilev1.File_turnstile_v1_conversation_proto,
		turnstilev1.File_turnstile_v1_errors_proto,
		turnstilev1.File_turnstile_v1_client_proto,
	} {
		doc, err := files.FindFileByPath(gen.Path())
		if err != nil {
			t.Fatalf("%s is not in the embedded contract: %v", gen.Path(), err)
		}
		if doc.SourceLocations().Len() == 0 {
			t.Errorf("%s: the embedded contract has no source info", gen.Path())
		}
		got := protodesc.ToFileDescriptorProto(doc)
		got.SourceCodeInfo = nil
		want := protodesc.ToFileDescriptorProto(gen)
		if !proto.Equal(got, want) {
			t.Errorf("%s: server/contract.binpb differs from gen/: run `go generate ./server` after `buf generate`", gen.Path())
		}
	}
}

// reflectionClient starts a real server on loopback and returns a
// connection to it.
func reflectionClient(t *testing.T) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r, err := runtime.New([]*runtime.Model{{Alias: "m", Provider: fake.NewProvider(), ID: "m", Retry: policy.DefaultRetry()}}, "m", nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := New(r, Options{})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// fileContaining asks the reflection service (v1, or v1alpha as older
// grpcurl builds do; the two are the same on the wire) for the files
// defining symbol and its dependencies, and links them as a reflection
// client does.
func fileContaining(t *testing.T, conn *grpc.ClientConn, alpha bool, symbol string) *protoregistry.Files {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	method := reflectionv1.ServerReflection_ServerReflectionInfo_FullMethodName
	if alpha {
		method = reflectionv1alpha.ServerReflection_ServerReflectionInfo_FullMethodName
	}
	stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method)
	if err != nil {
		t.Fatal(err)
	}
	req := &reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: symbol}}
	if err := stream.SendMsg(req); err != nil {
		t.Fatal(err)
	}
	resp := &reflectionv1.ServerReflectionResponse{}
	if err := stream.RecvMsg(resp); err != nil {
		t.Fatal(err)
	}
	if e := resp.GetErrorResponse(); e != nil {
		t.Fatalf("reflection error for %s: %v", symbol, e)
	}
	set := &descriptorpb.FileDescriptorSet{}
	for _, b := range resp.GetFileDescriptorResponse().GetFileDescriptorProto() {
		fd := &descriptorpb.FileDescriptorProto{}
		if err := proto.Unmarshal(b, fd); err != nil {
			t.Fatal(err)
		}
		set.File = append(set.File, fd)
	}
	files, err := protodesc.NewFiles(set)
	if err != nil {
		t.Fatalf("linking the files reflection sent for %s: %v", symbol, err)
	}
	return files
}

// What `grpcurl describe turnstile.v1.RunTurnRequest` prints comes from the
// source info reflection sends: the message's and each field's comments.
func TestReflectionServesDocumentation(t *testing.T) {
	t.Parallel()
	conn := reflectionClient(t)
	for _, alpha := range []bool{false, true} {
		files := fileContaining(t, conn, alpha, "turnstile.v1.RunTurnRequest")
		d, err := files.FindDescriptorByName("turnstile.v1.RunTurnRequest")
		if err != nil {
			t.Fatal(err)
		}
		md := d.(protoreflect.MessageDescriptor)
		locs := md.ParentFile().SourceLocations()
		if got := locs.ByDescriptor(md).LeadingComments; !strings.Contains(got, "RunTurnRequest asks for one turn of a conversation.") {
			t.Errorf("alpha=%v: RunTurnRequest's comment = %q", alpha, got)
		}
		if got := locs.ByDescriptor(md.Fields().ByName("turn_id")).LeadingComments; !strings.Contains(got, "idempotency key") {
			t.Errorf("alpha=%v: turn_id's comment = %q", alpha, got)
		}
		svc, err := files.FindDescriptorByName("turnstile.v1.AgentService")
		if err != nil {
			t.Fatal(err)
		}
		rpc := svc.(protoreflect.ServiceDescriptor).Methods().ByName("RunTurn")
		if got := rpc.ParentFile().SourceLocations().ByDescriptor(rpc).LeadingComments; !strings.Contains(got, "RunTurn runs one agent turn") {
			t.Errorf("alpha=%v: RunTurn's comment = %q", alpha, got)
		}
	}
	// Services outside the contract still resolve, from the binary's own
	// descriptors.
	files := fileContaining(t, conn, false, "grpc.health.v1.Health")
	if _, err := files.FindDescriptorByName("grpc.health.v1.Health"); err != nil {
		t.Errorf("health: %v", err)
	}
}

// The documented contract is parsed at the first lookup, once; a contract
// that does not parse is told once, and the lookups answer from the
// binary's own descriptors.
func TestReflectionLoadsTheContractLazily(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		load       error
		wantBroken int
	}{
		{"the contract parses", nil, 0},
		{"a broken build", errors.New("no contract"), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			loads, broken := 0, 0
			lazy := &lazyFiles{
				load: func() (*protoregistry.Files, error) {
					loads++
					if tt.load != nil {
						return nil, tt.load
					}
					return documentedFiles()
				},
				broken: func(err error) {
					broken++
					if !errors.Is(err, tt.load) {
						t.Errorf("broken(%v), want %v", err, tt.load)
					}
				},
			}
			r := layered{lazy, protoregistry.GlobalFiles}
			if loads != 0 {
				t.Fatalf("loaded %d times before any lookup", loads)
			}
			for range 2 {
				d, err := r.FindDescriptorByName("turnstile.v1.RunTurnRequest")
				if err != nil {
					t.Fatal(err)
				}
				documented := d.ParentFile().SourceLocations().Len() > 0
				if documented != (tt.load == nil) {
					t.Errorf("documented = %v, want %v", documented, tt.load == nil)
				}
				if _, err := r.FindFileByPath("turnstile/v1/agent.proto"); err != nil {
					t.Error(err)
				}
			}
			if loads != 1 || broken != tt.wantBroken {
				t.Errorf("loaded %d times, broken told %d times; want 1 and %d", loads, broken, tt.wantBroken)
			}
		})
	}
}
