package server_test

import (
	"context"
	"fmt"
	"io"
	"iter"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/store"
)

// BenchmarkDurable measures what the turn store adds to a turn of 50
// text deltas over gRPC on loopback, store off and on (embedded, memory
// and file): the time to the first text delta (p50, p99), the whole
// turn (ns/op), and the log's bytes per stored turn. "reattach" measures
// a WatchTurn of a finished turn from a random seq to its first replayed
// event, as a re-attaching client waits for it. Compare in one run:
//
//	go test -run XXX -bench BenchmarkDurable -benchtime 2000x ./server
func BenchmarkDurable(b *testing.B) {
	modes := []struct{ name, dir string }{{"off", "-"}, {"memory", ""}, {"file", "file"}}
	for _, pace := range []time.Duration{0, 500 * time.Microsecond} {
		for _, mode := range modes {
			b.Run(fmt.Sprintf("ttft/pace=%v/store=%s", pace, mode.name), func(b *testing.B) {
				benchTTFT(b, pace, mode.dir)
			})
		}
	}
	b.Run("reattach", func(b *testing.B) {
		ts := start(b, benchRunner(b), server.Options{Store: benchStore(b, "")})
		const turns = 50
		var total uint64
		for i := range turns {
			req := hello()
			req.TurnId = fmt.Sprintf("done-%d", i)
			evs, _ := wiretestCollect(b, ts, req)
			total = uint64(len(evs))
		}
		rng := rand.New(rand.NewPCG(1, 1))
		var wait []time.Duration
		for b.Loop() {
			after := rng.Uint64N(total)
			start := time.Now()
			w, err := ts.client.WatchTurn(b.Context(), &turnstilev1.WatchTurnRequest{TurnId: fmt.Sprintf("done-%d", rng.IntN(turns)), Attempt: 1, AfterSeq: after})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := w.Recv(); err != nil {
				b.Fatal(err)
			}
			wait = append(wait, time.Since(start))
			for {
				if _, err := w.Recv(); err != nil {
					break
				}
			}
		}
		b.StopTimer()
		percentiles(b, wait, "first-event")
	})
}

// benchStore opens an embedded store with the default lease TTL, in
// memory when dir is empty, else on disk.
func benchStore(b *testing.B, dir string) *store.Store {
	opts := []storeOption{withLeaseTTL(store.DefaultConfig().LeaseTTL)}
	if dir != "" {
		opts = append(opts, inDir(b.TempDir()))
	}
	return openStore(b, opts...)
}

func wiretestCollect(b *testing.B, ts *testServer, req *turnstilev1.RunTurnRequest) ([]*turnstilev1.AgentEvent, error) {
	stream, err := ts.client.RunTurn(b.Context(), req)
	if err != nil {
		b.Fatal(err)
	}
	var evs []*turnstilev1.AgentEvent
	for {
		r, err := stream.Recv()
		if err == io.EOF {
			return evs, nil
		}
		if err != nil {
			return evs, err
		}
		evs = append(evs, r.GetEvent())
	}
}

func percentiles(b *testing.B, d []time.Duration, what string) {
	if len(d) == 0 {
		return
	}
	sorted := slices.Clone(d)
	slices.Sort(sorted)
	p := func(q float64) float64 { return float64(sorted[int(q*float64(len(sorted)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(p(0.5), what+"-p50-µs")
	b.ReportMetric(p(0.99), what+"-p99-µs")
}

// benchTTFT runs 50-delta turns whose tokens come every pace, with the
// store in dir ("-": off; "": memory), and reports their time to the first
// text delta and the log's bytes per turn.
func benchTTFT(b *testing.B, pace time.Duration, dir string) {
	opts := server.Options{}
	var st *store.Store
	if dir != "-" {
		st = benchStore(b, dir)
		opts.Store = st
	}
	ts := start(b, pacedRunner(b, pace), opts)
	var ttft []time.Duration
	n := 0
	for b.Loop() {
		n++
		req := hello()
		req.TurnId = fmt.Sprintf("bench-%d", n)
		start := time.Now()
		stream, err := ts.client.RunTurn(b.Context(), req)
		if err != nil {
			b.Fatal(err)
		}
		for {
			r, err := stream.Recv()
			if err == io.EOF {
				break
			} else if err != nil {
				b.Fatal(err)
			}
			if r.GetEvent().GetTextDelta() != nil && len(ttft) < n {
				ttft = append(ttft, time.Since(start))
			}
		}
	}
	b.StopTimer()
	percentiles(b, ttft, "ttft")
	if st != nil {
		bytes, _, err := st.Size(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(bytes)/float64(n), "log-bytes/turn")
	}
}

// paced streams 50 text deltas, one every pace, then ends the reply.
type paced struct{ pace time.Duration }

func (p paced) Stream(ctx context.Context, _ *llm.Request) iter.Seq2[llm.Chunk, error] {
	return func(yield func(llm.Chunk, error) bool) {
		for _, c := range benchReply().Chunks {
			if p.pace > 0 && c.Kind == llm.ChunkText {
				time.Sleep(p.pace)
			}
			if !yield(c, nil) {
				return
			}
		}
	}
}

func pacedRunner(b *testing.B, pace time.Duration) *runtime.Runner {
	r, err := runtime.New([]*runtime.Model{{Alias: "sim", ProviderName: "fake", Provider: paced{pace}, ID: "fake-1", Retry: policy.DefaultRetry()}}, "sim", nil)
	if err != nil {
		b.Fatal(err)
	}
	return r
}
