package admission

import (
	"fmt"
	"runtime/metrics"
	"sync"
)

// Memory bounds the turns the server starts by the memory it has
// (server.memory_limit): counts of turns (max_concurrent_turns, a key's
// concurrent_turns) know nothing of what each turn holds, and turns
// whose clients read nothing hold what they streamed for as long as they
// run, so enough of them take a process past its container's limit.
//
// Before a turn starts, the memory the process would hold with it is
// projected: the larger of what it holds now (the gauge) and what its
// running turns hold at least (TurnMemory each), plus TurnMemory for the
// new turn. Over [memoryShareMark] of the limit, a key that runs at least
// its share of the running turns (their number over the keys running
// any, the new turn's key counted) is refused: one key's turns whose
// clients read nothing cannot take the memory another key's turns need.
// Over [memoryFullMark] of the limit, every new turn is refused. The
// projection counts every running turn at once, so a burst of turns
// cannot pass before what they hold shows in the gauge.
type Memory struct {
	limit int64
	turn  int64
	gauge func() uint64

	mu      sync.Mutex
	running int
	perKey  map[string]int
}

// The marks of [Memory], as shares of the limit: over the first, a key
// that runs at least its share of the running turns is refused new ones;
// over the second, every new turn is. The room between them is the other
// keys'; the room above the second is the running turns' and the
// collector's (the Go runtime's GOMEMLIMIT, which the limit defaults to,
// makes it collect harder as the process nears the limit).
const (
	memoryShareMark = 0.6
	memoryFullMark  = 0.85
)

// DefaultTurnMemory is what a running turn is counted to hold at least
// when the server projects its memory, with the turn store or without:
// what a turn whose client reads nothing makes the process hold at its
// peak, its stream's queue and window, its reply, and with a store the
// run's window and its events on their way to the log, with the garbage
// they leave. 1,000 such turns of 20,000-word replies peak at 0.8-0.9 GiB
// of RSS with the store on and 0.7-0.8 GiB with it off; under a 1 GiB
// data-segment limit, 552 of them admitted at 1 MiB each peaked at 552-564
// MiB with the store on, the other key's turns completing
// (BENCHMARKS.md, issue 37). Store-on turns were counted at 2 MiB while
// they held about twice what store-off ones did.
const DefaultTurnMemory = 1 << 20

// NewMemory returns the bound of limit bytes, with turn bytes counted for
// each running turn and gauge reading what the process holds. A limit of
// 0 or less bounds nothing: Enter admits every turn.
func NewMemory(limit, turn int64, gauge func() uint64) *Memory {
	return &Memory{limit: limit, turn: turn, gauge: gauge, perKey: map[string]int{}}
}

// Limit returns the limit in bytes; 0 when there is none.
func (m *Memory) Limit() int64 {
	if m == nil || m.limit <= 0 {
		return 0
	}
	return m.limit
}

// Enter starts a turn of the key named key ("" without keys), or fails
// with the *Refusal that says the server's memory is near its limit. The
// returned function ends the turn (once).
func (m *Memory) Enter(key string) (func(), error) {
	if m.Limit() == 0 {
		return func() {}, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	keys := len(m.perKey)
	if m.perKey[key] == 0 {
		keys++
	}
	if r := memoryRefusal(memoryState{used: m.gauge(), limit: m.limit, turn: m.turn,
		running: m.running, keyRunning: m.perKey[key], keys: keys}); r != nil {
		return nil, r
	}
	m.running++
	m.perKey[key]++
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			m.running--
			if m.perKey[key]--; m.perKey[key] == 0 {
				delete(m.perKey, key)
			}
		})
	}, nil
}

// Resume starts a turn this replica takes over from one that went away,
// counted from before its claim, or fails with the *Refusal that says
// the memory is past [memoryFullMark] of the limit. A key's share does
// not apply: the turn was admitted within it where it started (as its
// key's concurrent_turns). But a replica near its limit takes no more
// turns of anyone's, so that the turns of a replica that died do not
// take its survivors past their limits one after the other: another
// replica takes the turn, or its first watcher ends it with a retryable
// error. Name the turn's client key once its record is read; End it
// when it ends.
func (m *Memory) Resume() (*Resumed, error) {
	if m.Limit() == 0 {
		return &Resumed{}, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := memoryRefusal(memoryState{used: m.gauge(), limit: m.limit, turn: m.turn,
		running: m.running, keys: max(len(m.perKey), 1)}); r != nil {
		return nil, r
	}
	m.running++
	return &Resumed{m: m}, nil
}

// Resumed is a turn taken over that [Memory] counts (see [Memory.Resume]).
type Resumed struct {
	m     *Memory // nil: not counted (no limit)
	key   string
	named bool
	ended bool
}

// Name counts the turn as its client key's (once; "" without keys).
func (r *Resumed) Name(key string) {
	if r.m == nil {
		return
	}
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	if r.named || r.ended {
		return
	}
	r.key, r.named = key, true
	r.m.perKey[key]++
}

// End ends the turn (once).
func (r *Resumed) End() {
	if r.m == nil {
		return
	}
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	if r.ended {
		return
	}
	r.ended = true
	r.m.running--
	if r.named {
		if r.m.perKey[r.key]--; r.m.perKey[r.key] == 0 {
			delete(r.m.perKey, r.key)
		}
	}
}

// Heaviest returns the key that runs the most turns (the first by name
// among equals), and whether what the process holds, as the gauge reads
// it alone, is past [memoryFullMark] of the limit: then the server sheds
// that key's turns that nobody reads, so that its retried turns and the
// other keys' find room. False without a limit or a turn running.
func (m *Memory) Heaviest() (key string, over bool) {
	if m.Limit() == 0 {
		return "", false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	most := 0
	for k, n := range m.perKey {
		if n > most || n == most && k < key {
			key, most = k, n
		}
	}
	return key, most > 0 && float64(m.gauge()) > memoryFullMark*float64(m.limit)
}

// memoryState is what [memoryRefusal] decides on.
type memoryState struct {
	used       uint64 // what the process holds now (the gauge), in bytes
	limit      int64  // the limit, in bytes; positive
	turn       int64  // what a running turn holds at least, in bytes
	running    int    // the turns running
	keyRunning int    // the turns of the new turn's key running
	keys       int    // the keys running turns, the new turn's counted
}

// memoryRefusal returns why a turn may not start in s, or nil when it
// may (see [Memory]).
func memoryRefusal(s memoryState) *Refusal {
	projected := float64(max(s.used, uint64(s.running)*uint64(s.turn))) + float64(s.turn)
	limit := float64(s.limit)
	refuse := func(why string) *Refusal {
		return &Refusal{Limit: "memory_limit", RetryAfter: busyRetry,
			Message: fmt.Sprintf("the server's memory is near its limit (server.memory_limit: %d MiB) %s; retry shortly or on another replica", s.limit>>20, why)}
	}
	switch {
	case projected > memoryFullMark*limit:
		return refuse("and it starts no more turns")
	case projected > memoryShareMark*limit && s.running > 0 && s.keyRunning*s.keys >= s.running:
		return refuse(fmt.Sprintf("and this client key runs %d of the server's %d turns, at least its share", s.keyRunning, s.running))
	}
	return nil
}

// The runtime/metrics [RuntimeMemory] reads: all the Go runtime holds,
// the heap's parts (objects, dead ones included until they are swept;
// spans unused, free and returned to the OS), and the heap's live
// objects as of the last collection.
var memorySamples = []string{
	"/memory/classes/total:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/unused:bytes",
	"/memory/classes/heap/free:bytes",
	"/memory/classes/heap/released:bytes",
	"/gc/heap/live:bytes",
}

// RuntimeMemory returns the gauge of the Go runtime: what the process
// would hold after a collection, its live heap as of the last one and
// everything the runtime holds beside its heap (stacks, its own
// structures). Not the heap's garbage: with a high GOGC, or a memory
// limit the collector works to keep, the heap holds garbage up to its
// goal, which says nothing of what the running turns keep.
func RuntimeMemory() func() uint64 {
	var mu sync.Mutex
	s := make([]metrics.Sample, len(memorySamples))
	for i, name := range memorySamples {
		s[i].Name = name
	}
	return func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		metrics.Read(s)
		v := make([]uint64, len(s))
		for i := range s {
			if s[i].Value.Kind() == metrics.KindUint64 {
				v[i] = s[i].Value.Uint64()
			}
		}
		heap := v[1] + v[2] + v[3] + v[4]
		if v[0] < heap {
			return v[5]
		}
		return v[0] - heap + v[5]
	}
}
