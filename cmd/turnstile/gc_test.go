package main

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestGCSettings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		env       map[string]string
		memoryMax string
		gogc      int
		limit     int64
	}{
		{"nothing set, no container limit", nil, "max\n", defaultGOGC, 0},
		{"nothing set, no cgroup", nil, "", defaultGOGC, 0},
		{"container limit", nil, "1073741824\n", defaultGOGC, 966367641},
		{"operator's GOGC", map[string]string{"GOGC": "100"}, "1073741824\n", 0, 966367641},
		{"operator's GOMEMLIMIT", map[string]string{"GOMEMLIMIT": "512MiB"}, "1073741824\n", defaultGOGC, 0},
		{"operator's both", map[string]string{"GOGC": "off", "GOMEMLIMIT": "1GiB"}, "1073741824\n", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			gogc, limit := gcSettings(func(k string) string { return tt.env[k] }, tt.memoryMax)
			if gogc != tt.gogc || limit != tt.limit {
				t.Errorf("gcSettings = %d, %d, want %d, %d", gogc, limit, tt.gogc, tt.limit)
			}
		})
	}
}

// TestMemoryLimit: server.memory_limit when set, 0 included; else the
// runtime's limit when there is one.
func TestMemoryLimit(t *testing.T) {
	t.Parallel()
	n := func(v int64) *int64 { return &v }
	tests := []struct {
		name       string
		configured *int64
		runtime    int64
		want       int64
	}{
		{"unset, no runtime limit", nil, math.MaxInt64, 0},
		{"unset, GOMEMLIMIT", nil, 966367641, 966367641},
		{"set", n(512 << 20), 966367641, 512 << 20},
		{"0: no bound despite GOMEMLIMIT", n(0), 966367641, 0},
	}
	for _, tt := range tests {
		if got := memoryLimit(tt.configured, tt.runtime); got != tt.want {
			t.Errorf("%s: memoryLimit = %d, want %d", tt.name, got, tt.want)
		}
	}
}

func TestShouldReturn(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	tests := []struct {
		name       string
		prev, now  heapSample
		base       uint64
		wantReturn bool
	}{
		{"steady traffic: collections run", heapSample{cycles: 7}, heapSample{cycles: 9, live: 10 * mib, held: 400 * mib}, 10 * mib, false},
		{"idle, small excess", heapSample{cycles: 7}, heapSample{cycles: 7, live: 10 * mib, held: 50 * mib}, 10 * mib, false},
		{"idle after a burst", heapSample{cycles: 7}, heapSample{cycles: 7, live: 10 * mib, held: 400 * mib}, 10 * mib, true},
		{"last collection at the burst's peak", heapSample{cycles: 7}, heapSample{cycles: 7, live: 380 * mib, held: 400 * mib}, 10 * mib, true},
		{"a large live heap, returned once", heapSample{cycles: 7}, heapSample{cycles: 7, live: 380 * mib, held: 400 * mib}, 380 * mib, false},
	}
	for _, tt := range tests {
		if got := shouldReturn(tt.prev, tt.now, tt.base); got != tt.wantReturn {
			t.Errorf("%s: shouldReturn = %v, want %v", tt.name, got, tt.wantReturn)
		}
	}
}

// TestReturnMemory: garbage left by a burst, counted live by the last
// collection, is returned to the OS once no collection runs. The test
// makes the checks itself, so nothing waits for a ticker.
func TestReturnMemory(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(defaultGOGC))
	released := func() uint64 {
		s := []metrics.Sample{{Name: "/memory/classes/heap/released:bytes"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	r := newMemoryReturner() // its first sample, before the burst
	burst := make([][]byte, 64)
	for i := range burst {
		burst[i] = make([]byte, 4<<20)
		burst[i][0] = 1
	}
	runtime.GC() // the burst counted live
	before := released()
	runtime.KeepAlive(burst)
	burst = nil
	// The first check sees the collection above and returns nothing; the
	// next one, with no collection in between, returns the burst. A
	// collection of the runtime's own between two checks only moves the
	// return to the check after it.
	for range 4 {
		held, live, ok := r.check()
		if !ok {
			continue
		}
		t.Logf("held %d MiB, live after %d MiB", held>>20, live>>20)
		if after := released(); after < before+128<<20 {
			t.Errorf("released %d MiB more, want the burst's 256", (after-before)>>20)
		}
		return
	}
	t.Error("the burst's memory was not returned within 4 checks")
}

// TestReleaseStartup: the garbage left before the server serves is
// collected and its memory returned to the OS, with no collection of the
// collector's own to do it.
func TestReleaseStartup(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // no collection but ours
	sample := func(name string) uint64 {
		s := []metrics.Sample{{Name: name}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	runtime.GC()
	garbage := make([][]byte, 32)
	for i := range garbage {
		garbage[i] = make([]byte, 1<<20)
		garbage[i][0] = 1
	}
	runtime.KeepAlive(garbage)
	garbage = nil
	released := sample("/memory/classes/heap/released:bytes")
	before, after := releaseStartup()
	if before < after+24<<20 {
		t.Errorf("heap objects %d MiB before, %d MiB after: want the 32 MiB of garbage gone", before>>20, after>>20)
	}
	if got := sample("/memory/classes/heap/released:bytes"); got < released+24<<20 {
		t.Errorf("released %d MiB more to the OS, want the garbage's 32", (got-released)>>20)
	}
}

// TestGCPercent: GOGC stays at defaultGOGC while its headroom is within
// the bound, gives the bound past that, and not less than minGOGC.
func TestGCPercent(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	tests := []struct {
		name     string
		roots    uint64
		headroom uint64
		want     int
	}{
		{"nothing collected yet", 0, 128 * mib, defaultGOGC},
		{"a small heap", 4 * mib, 128 * mib, defaultGOGC},
		{"four times the roots is the bound", 32 * mib, 128 * mib, defaultGOGC},
		{"just past it", 33 * mib, 128 * mib, 387},
		{"twice the bound", 256 * mib, 128 * mib, 50},
		{"at the floor", 512 * mib, 128 * mib, minGOGC},
		{"past the floor", 8 << 30, 128 * mib, minGOGC},
		{"another bound", 256 * mib, 64 * mib, minGOGC},
		{"another bound, small heap", 16 * mib, 64 * mib, defaultGOGC},
	}
	for _, tt := range tests {
		if got := gcPercent(tt.roots, tt.headroom); got != tt.want {
			t.Errorf("%s: gcPercent(%d MiB, %d MiB) = %d, want %d", tt.name, tt.roots/mib, tt.headroom/mib, got, tt.want)
		}
	}
}

// TestGCTuner: in this process, the tuner checks the heap after every
// collection and sets the GOGC that bounds the headroom while the live
// heap is large, defaultGOGC again once it is small.
func TestGCTuner(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	const headroom = 32 << 20
	type check struct {
		cycles  uint64
		percent int
	}
	applied := make(chan check, 64)
	stop := startGCTuner(headroom, func(cycles uint64, percent int) {
		select {
		case applied <- check{cycles, percent}:
		default: // the test reads them as they come; none is left unread long
		}
	})
	defer stop()
	sample := func(name string) uint64 {
		s := []metrics.Sample{{Name: name}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	gogc := func() int { return int(sample("/gc/gogc:percent")) }
	if got := gogc(); got != defaultGOGC {
		t.Fatalf("GOGC %d once started, want %d", got, defaultGOGC)
	}
	// collect makes a collection and returns the GOGC the tuner applied
	// after it: that of the first check that read the heap once the
	// collection had completed. Checks that read it before (after
	// collections of the runtime's own) are passed over; the last of them
	// may have armed its sentinel while ours marked, too late for ours to
	// find it: then collect collects again.
	collect := func() int {
		for range 10 {
			runtime.GC()
			done := sample("/gc/cycles/total:gc-cycles")
			var c check
			select {
			case c = <-applied:
			case <-time.After(time.Minute): // a guard, not a measure: the check runs at once
				t.Fatalf("no check after collection %d", done)
			}
			for c.cycles < done && len(applied) > 0 {
				c = <-applied
			}
			if c.cycles >= done {
				return c.percent
			}
		}
		t.Fatal("no check after 10 collections")
		return 0
	}

	live := make([][]byte, 64) // 64 MiB live: 32 MiB is half of it
	for i := range live {
		live[i] = make([]byte, 1<<20)
		live[i][0] = 1
	}
	for i := range 3 {
		// roots are 64 MiB and what the test binary holds besides, less
		// than 64 MiB more: GOGC over 25 (half of it past 128 MiB), at
		// most 50.
		if p := collect(); p <= 25 || p > 50 {
			t.Errorf("collection %d with 64 MiB live: GOGC %d, want 26–50", i, p)
		}
		// What the runtime runs with: set by that check or a later one.
		if p := gogc(); p <= 25 || p > 50 {
			t.Errorf("collection %d with 64 MiB live: the runtime's GOGC %d, want 26–50", i, p)
		}
	}
	runtime.KeepAlive(live)
	live = nil
	if p := collect(); p != defaultGOGC {
		t.Errorf("GOGC %d after a collection with the 64 MiB freed, want %d", p, defaultGOGC)
	}
	stop()
	if got := gogc(); got != defaultGOGC {
		t.Errorf("GOGC %d after the heap was freed, want %d", got, defaultGOGC)
	}
}
