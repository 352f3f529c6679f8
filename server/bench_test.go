package server_test

import (
	"context"
	"io"
	"testing"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
)

// benchReply is a reply of 50 text deltas, the shape of a short answer.
func benchReply() fake.Reply {
	var chunks []llm.Chunk
	for range 50 {
		chunks = append(chunks, llm.Chunk{Kind: llm.ChunkText, Text: "word "})
	}
	chunks = append(chunks,
		llm.Chunk{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 10, OutputTokens: 50}},
		llm.Chunk{Kind: llm.ChunkStop, Stop: llm.StopEndTurn})
	return fake.Reply{Chunks: chunks}
}

// BenchmarkTurn compares one 50-delta turn run by the runtime alone with
// the same turn through the gRPC server on loopback; the difference is
// what the server and the wire add to a turn. Compare the two in one run:
//
//	go test -run XXX -bench BenchmarkTurn -benchmem ./server
func BenchmarkTurn(b *testing.B) {
	b.Run("runtime", func(b *testing.B) {
		r := benchRunner(b)
		sink := runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil })
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.Run(b.Context(), &runtime.TurnRequest{Messages: []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("hello")}}}}, sink); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("grpc", func(b *testing.B) {
		ts := start(b, benchRunner(b), server.Options{})
		req := hello()
		b.ReportAllocs()
		for b.Loop() {
			stream, err := ts.client.RunTurn(b.Context(), req)
			if err != nil {
				b.Fatal(err)
			}
			for {
				if _, err := stream.Recv(); err == io.EOF {
					break
				} else if err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

func benchRunner(b *testing.B) *runtime.Runner {
	r, err := runtime.New([]*runtime.Model{{Alias: "sim", ProviderName: "fake", Provider: fake.NewProvider(benchReply()), ID: "fake-1", Retry: policy.DefaultRetry()}}, "sim", nil)
	if err != nil {
		b.Fatal(err)
	}
	return r
}
