package server

import (
	_ "embed"
	"errors"
	"fmt"

	"google.golang.org/grpc/reflection"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// contract is the turnstile contract as a FileDescriptorSet with its source
// info (the comments of every message, field and RPC), its imports
// included. The generated Go code carries descriptors without source info,
// so reflection serves these instead, and grpcurl describe shows the
// documentation. .ci/run rebuilds it and fails when it differs; a test
// holds it to the generated code.
//
//go:generate go tool -modfile=../buildtools/go.mod buf build .. --as-file-descriptor-set --path ../proto/turnstile -o contract.binpb
//go:embed contract.binpb
var contract []byte

// documentedFiles returns the contract's files, with their source info.
func documentedFiles() (*protoregistry.Files, error) {
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(contract, &set); err != nil {
		return nil, fmt.Errorf("server: the embedded contract: %w", err)
	}
	files, err := protodesc.NewFiles(&set)
	if err != nil {
		return nil, fmt.Errorf("server: the embedded contract: %w", err)
	}
	return files, nil
}

// registerReflection registers the reflection services (v1 and v1alpha) on
// s. They answer from the documented contract first and from the
// descriptors linked into the binary for everything else (health,
// reflection itself).
func registerReflection(s registrar) error {
	files, err := documentedFiles()
	if err != nil {
		return err
	}
	opts := reflection.ServerOptions{
		Services:           s,
		DescriptorResolver: layered{files, protoregistry.GlobalFiles},
	}
	reflectionv1.RegisterServerReflectionServer(s, reflection.NewServerV1(opts))
	reflectionv1alpha.RegisterServerReflectionServer(s, reflection.NewServer(opts))
	return nil
}

// layered resolves descriptors from the first resolver that knows them.
type layered []protodesc.Resolver

func (l layered) FindFileByPath(path string) (protoreflect.FileDescriptor, error) {
	for _, r := range l {
		fd, err := r.FindFileByPath(path)
		if err == nil {
			return fd, nil
		}
		if !errors.Is(err, protoregistry.NotFound) {
			return nil, err
		}
	}
	return nil, protoregistry.NotFound
}

func (l layered) FindDescriptorByName(name protoreflect.FullName) (protoreflect.Descriptor, error) {
	for _, r := range l {
		d, err := r.FindDescriptorByName(name)
		if err == nil {
			return d, nil
		}
		if !errors.Is(err, protoregistry.NotFound) {
			return nil, err
		}
	}
	return nil, protoregistry.NotFound
}
