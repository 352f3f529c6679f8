package server_test

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
)

// BenchmarkLimits measures what prices, a key's limits and budgets, and
// sharing them through the store add to the success path: a durable
// 50-delta turn over gRPC on loopback (embedded store, in memory) of a
// client key, with
//
//   - plain: an unpriced model, a key without limits;
//   - priced-limits: a priced model, a key with every limit and both
//     budgets (none reached), kept by this replica alone;
//   - priced-limits-shared: the same, shared through the store every
//     100ms as serve does (Server.ShareLimits).
//
// Compare allocs/op and cpu-ns/op in one run:
//
//	go test -run XXX -bench BenchmarkLimits -benchmem -benchtime 2000x ./server
func BenchmarkLimits(b *testing.B) {
	big, bigN := int64(1)<<40, 1<<30
	for _, v := range []struct {
		name           string
		priced, shared bool
	}{{"plain", false, false}, {"priced-limits", true, false}, {"priced-limits-shared", true, true}} {
		b.Run(v.name, func(b *testing.B) {
			m := &runtime.Model{Alias: "sim", ProviderName: "fake", Provider: fake.NewProvider(benchReply()), ID: "fake-1", Retry: policy.DefaultRetry()}
			k := keyed("bench", "tok-bench-0123456")
			if v.priced {
				m.Price = &llm.Price{Currency: "USD", Input: 3e9, Output: 15e9}
				k.Limits = server.KeyLimits{
					ConcurrentTurns: &bigN, TurnsPerMinute: &bigN, TokensPerMinute: &big, TokensPerDay: &big,
					CostPerDay: money("1000000"), CostPerMonth: money("1000000"),
				}
			}
			r, err := runtime.New([]*runtime.Model{m}, "sim", nil)
			if err != nil {
				b.Fatal(err)
			}
			st := benchStore(b, "")
			ts := start(b, r, server.Options{Store: st, Keys: []server.Key{k}})
			if v.shared {
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- ts.srv.ShareLimits(ctx, st.Shared(), st.ReplicaID(), 100*time.Millisecond) }()
				defer func() { cancel(); <-done }()
			}
			ctx := bearer(b.Context(), "tok-bench-0123456")
			req := hello()
			i := 0
			b.ReportAllocs()
			cpu := startCPU(b)
			for b.Loop() {
				i++
				req.TurnId = fmt.Sprintf("bench-%d", i)
				stream, err := ts.client.RunTurn(ctx, req)
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
			cpu.report()
		})
	}
}
