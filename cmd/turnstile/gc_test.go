package main

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
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
