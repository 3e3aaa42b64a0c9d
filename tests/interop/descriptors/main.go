// Command descriptors writes a serialized google.protobuf.FileDescriptorSet
// of grpc/testing/test.proto and every file it imports (messages.proto,
// empty.proto), dependencies first, as protoc --include_imports would.
//
// The descriptors are the ones grpc-go's generated interop code registers
// (google.golang.org/grpc/interop/grpc_testing, at the version go.mod pins),
// so stratad commits no copy of grpc's .proto files: the Python TestService
// (tests/interop/test_service.py) builds its message classes from this set.
//
//	go run . -out test_service.pb
package main

import (
	"flag"
	"fmt"
	"os"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	// Registers grpc/testing/*.proto in protoregistry.GlobalFiles.
	_ "google.golang.org/grpc/interop/grpc_testing"
)

func main() {
	root := flag.String("file", "grpc/testing/test.proto", "the .proto file (as registered) to write with its imports")
	out := flag.String("out", "", "where to write the FileDescriptorSet (required)")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "descriptors: -out is required")
		os.Exit(2)
	}
	file, err := protoregistry.GlobalFiles.FindFileByPath(*root)
	if err != nil {
		fmt.Fprintf(os.Stderr, "descriptors: %s: %v\n", *root, err)
		os.Exit(1)
	}
	set := &descriptorpb.FileDescriptorSet{}
	seen := map[string]bool{}
	var add func(protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imports := fd.Imports()
		for i := 0; i < imports.Len(); i++ {
			add(imports.Get(i).FileDescriptor)
		}
		set.File = append(set.File, protodesc.ToFileDescriptorProto(fd))
	}
	add(file)
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(set)
	if err != nil {
		fmt.Fprintf(os.Stderr, "descriptors: %v\n", err)
		os.Exit(1)
	}
	if err := os.WriteFile(*out, data, 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "descriptors: %v\n", err)
		os.Exit(1)
	}
	for _, f := range set.File {
		fmt.Fprintln(os.Stderr, "descriptors:", f.GetName())
	}
}
