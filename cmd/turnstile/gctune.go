package main

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// GOGC sets the collector's headroom, the heap it lets grow between two
// collections, as a share of what the last one found live (with the
// goroutines' stacks and the globals): at defaultGOGC, four times it.
// That suits the server's usual heap, a few MB live under turns that
// leave some 50 KB of garbage each, and not a large one: 1,000 turns
// whose clients read nothing keep 500–700 MB live, and four times that in
// garbage could pile up before the next collection, which the store on,
// allocating more (its copies of every event), reached: peaks of 1.7–2.3
// GiB of RSS against 0.9–1.0 with the store off; 1.0–1.2 against 0.6–0.7
// with the headroom bounded (BENCHMARKS.md, issue 37, row 2). So when
// the operator sets no GOGC, serve sets, after each collection, the GOGC
// that gives a headroom of at most gcHeadroom: defaultGOGC while the live
// heap is under a quarter of it, less past that.
const gcHeadroom = 128 << 20

// minGOGC is the least GOGC serve sets: past 512 MiB live the headroom is
// a quarter of the live heap, not gcHeadroom, so that a heap of GB is not
// marked whole every 128 MiB allocated. The memory limit (GOMEMLIMIT, of
// the container's by default) stays the bound past that.
const minGOGC = 25

// gcPercent returns the GOGC that gives the collector a headroom of at
// most headroom bytes over a heap whose last collection scanned roots
// bytes (the live heap, the goroutines' stacks and the globals: what
// GOGC is a share of): defaultGOGC while its share is within headroom,
// less as roots grow, not below minGOGC.
func gcPercent(roots, headroom uint64) int {
	if roots == 0 || roots*defaultGOGC/100 <= headroom {
		return defaultGOGC
	}
	return max(int(headroom*100/roots), minGOGC)
}

// gcTunerSamples are the runtime/metrics a gcTuner reads after each
// collection: the collections so far, then the three parts of the heap
// goal's base.
var gcTunerSamples = []string{"/gc/cycles/total:gc-cycles", "/gc/heap/live:bytes", "/gc/scan/stack:bytes", "/gc/scan/globals:bytes"}

// gcTuner applies [gcPercent] after each collection. Its hook is a
// cleanup on a sentinel object, which the runtime runs once a collection
// finds the object unreachable; the hook then allocates the next one.
// It starts no goroutine: cleanups run on the runtime's.
type gcTuner struct {
	headroom uint64
	applied  func(cycles uint64, percent int) // called after each cycle's check; nil in serve

	mu      sync.Mutex // held by a check and by stop, so nothing applies after stop
	stopped bool
	percent int // the GOGC last set
	samples []metrics.Sample
}

// gcSentinel is the object whose collection tells a gcTuner a cycle ran.
// It is larger than the runtime's tiny objects (16 bytes without
// pointers), which share a slot and may outlive their cleanup's turn.
type gcSentinel struct{ _ [32]byte }

// startGCTuner sets GOGC to defaultGOGC and starts bounding the headroom
// to headroom bytes; applied, when not nil, is called after each check
// with the collections completed when it read the heap and the GOGC it
// left set. stop ends it: once it returns, the tuner sets nothing more
// (GOGC stays at what it last set).
func startGCTuner(headroom uint64, applied func(cycles uint64, percent int)) (stop func()) {
	t := &gcTuner{headroom: headroom, applied: applied, percent: defaultGOGC,
		samples: make([]metrics.Sample, len(gcTunerSamples))}
	for i, name := range gcTunerSamples {
		t.samples[i].Name = name
	}
	debug.SetGCPercent(defaultGOGC)
	t.arm()
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		t.stopped = true
	}
}

// arm allocates a sentinel whose collection calls cycle.
func (t *gcTuner) arm() {
	runtime.AddCleanup(new(gcSentinel), (*gcTuner).cycle, t)
}

// cycle runs after a collection: it sets the GOGC [gcPercent] gives the
// heap that collection left, and arms the next cycle's sentinel.
func (t *gcTuner) cycle() {
	t.mu.Lock()
	if t.stopped {
		t.mu.Unlock()
		return
	}
	metrics.Read(t.samples)
	var cycles, roots uint64
	for i, s := range t.samples {
		if s.Value.Kind() != metrics.KindUint64 {
			continue
		}
		if i == 0 {
			cycles = s.Value.Uint64()
		} else {
			roots += s.Value.Uint64()
		}
	}
	if p := gcPercent(roots, t.headroom); p != t.percent {
		debug.SetGCPercent(p)
		t.percent = p
	}
	percent := t.percent
	t.arm() // before applied, so that a collection the caller makes next finds it
	t.mu.Unlock()
	if t.applied != nil {
		t.applied(cycles, percent)
	}
}
