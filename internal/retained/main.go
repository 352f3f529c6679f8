// Command retained measures what the embedded turn store's NATS server
// holds in memory for each finished turn the log retains (issue #35): it
// opens the store as `turnstile serve` does by default (embedded, its
// files in a temporary directory), stores N finished turns shaped as the
// server stores them (a run's record, its frames of events, its end), and
// reports the process's live heap per retained turn, once after the
// writes and once after nats-server's per-block subject state of idle
// blocks has expired (-settle), with a heap profile of each when -profile
// names a directory. The store's bound on the turns it keeps
// (store.max_turns) is its default unless -max-turns says otherwise. It is run by hand; BENCHMARKS.md holds its figures:
//
//	go run ./internal/retained -turns 10000,100000
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/turnstile-dev/turnstile/store"
)

func main() {
	turns := flag.String("turns", "10000,100000", "comma-separated `counts` of finished turns to retain, each in a store of its own")
	frames := flag.Int("frames", 25, "frames of events each turn stores (about 100 for a reply of 100 chunks stored a chunk at a time, about 25 at a 100ms frame interval)")
	eventBytes := flag.Int("event-bytes", 120, "bytes of each event")
	recordBytes := flag.Int("record-bytes", 400, "bytes of each run's record (its request)")
	workers := flag.Int("c", 32, "turns stored at once")
	settle := flag.Duration("settle", 2*time.Minute+15*time.Second, "how long to wait, idle, before the second reading: nats-server drops an idle block's subject state after 2m")
	maxTurns := flag.Int64("max-turns", store.DefaultConfig().MaxTurns, "the store's bound on the turns it keeps (store.max_turns; -1: none)")
	profile := flag.String("profile", "", "`directory` for the heap profiles of each reading (N-written.heap, N-settled.heap)")
	flag.Parse()
	// Every 4 KiB allocated is sampled: the profiles name what each
	// retained turn holds.
	runtime.MemProfileRate = 4 << 10
	for _, f := range strings.Split(*turns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			log.Fatalf("-turns: %q is not a positive count", f)
		}
		if err := measure(n, *maxTurns, *frames, *eventBytes, *recordBytes, *workers, *settle, *profile); err != nil {
			log.Fatal(err)
		}
	}
}

// liveHeap collects garbage and returns the bytes of the objects that
// survived it: what the process holds (free space in the heap's spans,
// which a collection leaves behind, is not counted).
func liveHeap() uint64 {
	runtime.GC()
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func measure(n int, maxTurns int64, frames, eventBytes, recordBytes, workers int, settle time.Duration, profile string) error {
	dir, err := os.MkdirTemp("", "turnstile-retained-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg := store.DefaultConfig()
	cfg.Dir = dir
	cfg.MaxBytes, cfg.MaxTurns = -1, maxTurns
	ctx := context.Background()
	st, err := store.Open(ctx, cfg, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	before := liveHeap()
	record := make([]byte, recordBytes)
	event := make([]byte, eventBytes)
	var (
		next   atomic.Int64
		wg     sync.WaitGroup
		failed atomic.Pointer[error]
	)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= int64(n) && failed.Load() == nil {
				if err := storeTurn(ctx, st, uuid.NewString(), record, event, frames); err != nil {
					failed.CompareAndSwap(nil, &err)
				}
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return *err
	}
	_, msgs, err := st.Size(ctx)
	if err != nil {
		return err
	}
	written := liveHeap()
	fmt.Printf("%d turns of %d frames stored in %s (%d messages in the log)\n", n, frames, time.Since(start).Round(time.Millisecond), msgs)
	fmt.Printf("  live heap per retained turn, just written: %.0f B (%.1f MiB in all)\n",
		float64(written-before)/float64(n), float64(written-before)/(1<<20))
	writeProfile(profile, fmt.Sprintf("%d-written.heap", n))
	if settle > 0 {
		time.Sleep(settle)
		settled := liveHeap()
		u := st.Usage()
		fmt.Printf("  live heap per retained turn, after %s idle: %.0f B (%.1f MiB in all)\n",
			settle, float64(settled-before)/float64(n), float64(settled-before)/(1<<20))
		if u.Turns > 0 && u.Turns < uint64(n) {
			// The keeper removed the oldest: store.max_turns.
			fmt.Printf("  the log keeps %d of them (store.max_turns %d, %d removed): %.0f B per turn kept\n",
				u.Turns, cfg.MaxTurns, u.Evicted, float64(settled-before)/float64(u.Turns))
		}
		writeProfile(profile, fmt.Sprintf("%d-settled.heap", n))
	}
	return nil
}

// storeTurn stores one finished run as the server does: its record, its
// events in frames (each event appended once the one before it is
// stored, so each is a frame of its own), and its end.
func storeTurn(ctx context.Context, st *store.Store, id string, record, event []byte, frames int) error {
	created, _, err := st.Create(ctx, id, 1, record, func(string) []byte { return nil })
	if err != nil {
		return err
	}
	if !created {
		return fmt.Errorf("run %s exists", id)
	}
	done := make(chan error, 1)
	for range frames {
		if err := st.Append(ctx, id, 1, event, func(err error) { done <- err }); err != nil {
			return err
		}
		if err := <-done; err != nil {
			return err
		}
	}
	return st.Finish(ctx, id, 1)
}

// writeProfile writes the heap profile to dir/name, when dir is set.
func writeProfile(dir, name string) {
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		log.Print(err)
		return
	}
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		log.Print(err)
		return
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		log.Print(err)
	}
}
