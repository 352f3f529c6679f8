package server

import (
	_ "embed"
	"errors"
	"fmt"
	"sync"

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
//go:generate go tool -modfile=../buildtools/go.mod buf build .. --as-file-descriptor-set --path ../proto/turnstile/v1 -o contract.binpb
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
// reflection itself). The documented contract is parsed at the first
// lookup, not at start: its descriptors hold about 1 MB that a server no
// tool asks does not need (issue #26). Should it not parse (only a broken
// build), broken is told once and the lookups answer from the binary's
// descriptors, without their documentation.
func registerReflection(s registrar, broken func(error)) {
	opts := reflection.ServerOptions{
		Services:           s,
		DescriptorResolver: layered{&lazyFiles{load: documentedFiles, broken: broken}, protoregistry.GlobalFiles},
	}
	reflectionv1.RegisterServerReflectionServer(s, reflection.NewServerV1(opts))
	reflectionv1alpha.RegisterServerReflectionServer(s, reflection.NewServer(opts))
}

// lazyFiles resolves from the files load returns, loaded at the first
// lookup; when load fails, broken is told and nothing resolves.
type lazyFiles struct {
	load   func() (*protoregistry.Files, error)
	broken func(error)
	once   sync.Once
	files  *protoregistry.Files
}

func (l *lazyFiles) get() *protoregistry.Files {
	l.once.Do(func() {
		files, err := l.load()
		if err != nil {
			l.broken(err)
			files = new(protoregistry.Files)
		}
		l.files = files
	})
	return l.files
}

func (l *lazyFiles) FindFileByPath(path string) (protoreflect.FileDescriptor, error) {
	return l.get().FindFileByPath(path)
}

func (l *lazyFiles) FindDescriptorByName(name protoreflect.FullName) (protoreflect.Descriptor, error) {
	return l.get().FindDescriptorByName(name)
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
