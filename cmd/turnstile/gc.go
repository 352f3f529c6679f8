package main

import (
	"context"
	"math"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"
)

// defaultGOGC is the server's GOGC when the operator sets none, while its
// live heap is small (see [gcHeadroom] for a large one). A turn allocates
// some 50 KB that is garbage once it ends, over a live heap of a few MB:
// at Go's default of 100 the collector runs every few dozen turns. 400
// runs it a quarter as often, for a heap that peaks a few MB higher.
const defaultGOGC = 400

// memoryLimitShare is the share of the container's memory limit the heap
// may use before the collector works harder (GOMEMLIMIT), so that a high
// GOGC cannot take the process past its limit.
const memoryLimitShare = 0.9

// cgroupMemoryMax is where cgroup v2 publishes the container's limit.
const cgroupMemoryMax = "/sys/fs/cgroup/memory.max"

// gcSettings returns the collector settings the server applies: GOGC
// defaultGOGC, its headroom bounded by [startGCTuner], unless the operator
// set GOGC, and a memory limit of
// memoryLimitShare of the container's limit (memoryMax, the contents of
// cgroup's memory.max) unless the operator set GOMEMLIMIT or there is no
// limit. Zero values mean "leave alone".
func gcSettings(getenv func(string) string, memoryMax string) (gogc int, memLimit int64) {
	if getenv("GOGC") == "" {
		gogc = defaultGOGC
	}
	if getenv("GOMEMLIMIT") == "" {
		if n, err := strconv.ParseInt(strings.TrimSpace(memoryMax), 10, 64); err == nil && n > 0 {
			memLimit = int64(float64(n) * memoryLimitShare)
		}
	}
	return gogc, memLimit
}

// setGCDefaults applies [gcSettings] to the running process, for as long
// as it runs.
func setGCDefaults() {
	memMax, _ := os.ReadFile(cgroupMemoryMax)
	gogc, limit := gcSettings(os.Getenv, string(memMax))
	if gogc > 0 {
		startGCTuner(gcHeadroom, nil)
	}
	if limit > 0 {
		debug.SetMemoryLimit(limit)
	}
}

// memoryLimit returns the server's server.memory_limit: configured when
// set (0 is no bound), else the Go runtime's memory limit, runtimeLimit
// (GOMEMLIMIT, or what [setGCDefaults] derived from the container's),
// when there is one (math.MaxInt64 is none).
func memoryLimit(configured *int64, runtimeLimit int64) int64 {
	if configured != nil {
		return *configured
	}
	if runtimeLimit <= 0 || runtimeLimit == math.MaxInt64 {
		return 0
	}
	return runtimeLimit
}

// runtimeMemoryLimit returns the Go runtime's memory limit, unchanged.
func runtimeMemoryLimit() int64 { return debug.SetMemoryLimit(-1) }

// releaseStartup collects the garbage of the server's start-up and returns
// the memory it freed to the OS; serve calls it once, when the server
// serves. Start-up (the packages' initialisation, the configuration, the
// store's recovery, the providers' clients) leaves a few MB of garbage, and
// with GOGC at defaultGOGC the first collection waits until the heap is 4
// MB times GOGC/100: an idle server kept that garbage resident until its
// first turns. It returns the heap's objects, dead ones included, before
// and after, in bytes.
func releaseStartup() (before, after uint64) {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	before = s[0].Value.Uint64()
	debug.FreeOSMemory()
	metrics.Read(s)
	return before, s[0].Value.Uint64()
}

// After a burst (a few large requests) the heap holds what the burst left
// for as long as no collection runs, and with GOGC 400 and little traffic
// after it, none runs for minutes: the process keeps the burst's peak.
// returnMemory checks every memoryCheckInterval and, when no collection
// ran since the last check while the heap holds much more than its live
// part, collects and returns the free memory to the OS
// (debug.FreeOSMemory). Under steady traffic collections run every few
// turns, so the check never fires there and GOGC keeps its throughput.
const (
	memoryCheckInterval = 10 * time.Second
	// memoryExcessFloor is the excess (heap held over live heap) below
	// which nothing is returned: a few dozen MB are not worth a
	// collection.
	memoryExcessFloor = 64 << 20
)

// heapSample is what returnMemory reads of the runtime.
type heapSample struct {
	cycles uint64 // collections so far
	live   uint64 // live heap as of the last collection
	held   uint64 // heap memory not returned to the OS: objects, dead ones included, and free spans
}

// heapSamples are the runtime/metrics returnMemory reads.
var heapSamples = []string{"/gc/cycles/total:gc-cycles", "/gc/heap/live:bytes", "/memory/classes/heap/objects:bytes", "/memory/classes/heap/free:bytes", "/memory/classes/heap/unused:bytes"}

func readHeap(s []metrics.Sample) heapSample {
	metrics.Read(s)
	u := func(i int) uint64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return s[i].Value.Uint64()
	}
	return heapSample{cycles: u(0), live: u(1), held: u(2) + u(3) + u(4)}
}

// shouldReturn reports whether the heap, sampled at now after prev, holds
// a burst's leftovers: no collection ran in between, and what it holds
// exceeds twice its live part by more than memoryExcessFloor. The live
// part is the smaller of the last collection's and base, the live heap
// after the last return: a collection that ran at the burst's peak
// counted the burst as live.
func shouldReturn(prev, now heapSample, base uint64) bool {
	return now.cycles == prev.cycles && now.held > 2*min(now.live, base)+memoryExcessFloor
}

// memoryReturner is returnMemory's state between two checks.
type memoryReturner struct {
	s    []metrics.Sample
	prev heapSample
	base uint64 // the live heap after the last return
}

// newMemoryReturner takes the first sample, which the first check compares
// with.
func newMemoryReturner() *memoryReturner {
	r := &memoryReturner{s: make([]metrics.Sample, len(heapSamples))}
	for i, name := range heapSamples {
		r.s[i].Name = name
	}
	r.prev = readHeap(r.s)
	r.base = r.prev.live
	return r
}

// check samples the heap and, when [shouldReturn] says so, collects and
// returns the free memory to the OS; returned reports whether it did,
// with the bytes held before and the live heap after.
func (r *memoryReturner) check() (held, live uint64, returned bool) {
	now := readHeap(r.s)
	if shouldReturn(r.prev, now, r.base) {
		debug.FreeOSMemory()
		held = now.held
		now = readHeap(r.s)
		r.base = now.live
		returned = true
	}
	r.prev = now
	return held, now.live, returned
}

// returnMemory checks every interval until ctx is done; freed is called
// with the bytes held before each return and the live heap after it (for
// the log).
func returnMemory(ctx context.Context, interval time.Duration, freed func(held, live uint64)) {
	r := newMemoryReturner()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if held, live, ok := r.check(); ok {
			freed(held, live)
		}
	}
}
