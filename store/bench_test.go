package store_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/store"
)

// BenchmarkAppend measures what storing one event costs the owner of a
// run, in memory and on disk (fsync at JetStream's default interval, and
// on every write): "pipelined" appends without waiting (as the server
// does) and reports the cost per event once all are acknowledged;
// "acked" waits for each acknowledgement, the latency an event gains
// before a client may see it.
//
//	go test -run XXX -bench BenchmarkAppend -benchtime 20000x ./store
func BenchmarkAppend(b *testing.B) {
	event := make([]byte, 120) // a text delta's wire form is about this size
	for _, mode := range []struct{ name, dir, sync string }{
		{"memory", "", "2m"}, {"file", "file", "2m"}, {"file-sync-always", "file", store.SyncAlways},
	} {
		open := func(b *testing.B) *store.Store {
			cfg := store.DefaultConfig()
			cfg.Dir, cfg.Sync = mode.dir, mode.sync
			if mode.dir != "" {
				cfg.Dir = b.TempDir()
			}
			s, err := store.Open(context.Background(), cfg, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(s.Close)
			return s
		}
		b.Run(mode.name+"/pipelined", func(b *testing.B) {
			s := open(b)
			ctx := context.Background()
			if _, _, err := s.Create(ctx, "bench", 1, []byte("req"), func(string) []byte { return nil }); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for b.Loop() {
				if err := s.Append(ctx, "bench", 1, event, func(error) {}); err != nil {
					b.Fatal(err)
				}
			}
			if err := s.Finish(ctx, "bench", 1); err != nil {
				b.Fatal(err)
			}
		})
		b.Run(mode.name+"/acked", func(b *testing.B) {
			s := open(b)
			ctx := context.Background()
			if _, _, err := s.Create(ctx, "bench", 1, []byte("req"), func(string) []byte { return nil }); err != nil {
				b.Fatal(err)
			}
			done := make(chan error, 1)
			var lat []time.Duration
			b.ResetTimer()
			for b.Loop() {
				start := time.Now()
				if err := s.Append(ctx, "bench", 1, event, func(err error) { done <- err }); err != nil {
					b.Fatal(err)
				}
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			reportPercentiles(b, lat, "ack")
			if err := s.Finish(ctx, "bench", 1); err != nil {
				b.Fatal(err)
			}
		})
	}
}

func reportPercentiles(b *testing.B, d []time.Duration, what string) {
	if len(d) == 0 {
		return
	}
	sorted := slices.Clone(d)
	slices.Sort(sorted)
	p := func(q float64) float64 { return float64(sorted[int(q*float64(len(sorted)-1))].Microseconds()) }
	b.ReportMetric(p(0.5), fmt.Sprintf("%s-p50-µs", what))
	b.ReportMetric(p(0.99), fmt.Sprintf("%s-p99-µs", what))
}

// BenchmarkCreate measures creating a run and giving it up at once: the
// fixed cost of a durable turn.
func BenchmarkCreate(b *testing.B) {
	cfg := store.DefaultConfig()
	cfg.Dir = ""
	s, err := store.Open(context.Background(), cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	n := 0
	var create, finish []time.Duration
	for b.Loop() {
		n++
		id := fmt.Sprint("t", n)
		t0 := time.Now()
		if _, _, err := s.Create(ctx, id, 1, []byte("req"), func(string) []byte { return nil }); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := s.Finish(ctx, id, 1); err != nil {
			b.Fatal(err)
		}
		create, finish = append(create, t1.Sub(t0)), append(finish, time.Since(t1))
	}
	reportPercentiles(b, create, "create")
	reportPercentiles(b, finish, "finish")
}
