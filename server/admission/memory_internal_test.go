package admission

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

const mib = 1 << 20

// TestMemoryRefusal: the decision on a projected memory of the larger of
// the gauge and the running turns' floor, plus the new turn's floor: a
// key at or over its share is refused past 60% of the limit, every turn
// past 85%.
func TestMemoryRefusal(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    memoryState
		want string // "" admitted; else a part of the refusal's message
	}{
		{"idle server", memoryState{used: 10 * mib, limit: 100 * mib, turn: mib, keys: 1}, ""},
		{"under the share mark", memoryState{used: 58 * mib, limit: 100 * mib, turn: mib, running: 10, keyRunning: 10, keys: 1}, ""},
		{"at the share mark, the only key", memoryState{used: 59 * mib, limit: 100 * mib, turn: mib, running: 10, keyRunning: 10, keys: 1}, ""},
		{"past the share mark, the only key", memoryState{used: 60 * mib, limit: 100 * mib, turn: mib, running: 10, keyRunning: 10, keys: 1}, "at least its share"},
		{"past the share mark, a key with no turn", memoryState{used: 70 * mib, limit: 100 * mib, turn: mib, running: 10, keyRunning: 0, keys: 2}, ""},
		{"past the share mark, a key under its share", memoryState{used: 70 * mib, limit: 100 * mib, turn: mib, running: 10, keyRunning: 3, keys: 3}, ""},
		{"past the share mark, a key at its share", memoryState{used: 70 * mib, limit: 100 * mib, turn: mib, running: 10, keyRunning: 5, keys: 2}, "at least its share"},
		{"past the share mark, no turn running", memoryState{used: 70 * mib, limit: 100 * mib, turn: mib, keys: 1}, ""},
		{"the running turns' floor over the gauge", memoryState{used: 0, limit: 100 * mib, turn: mib, running: 60, keyRunning: 60, keys: 1}, "at least its share"},
		{"the floor under the share mark", memoryState{used: 0, limit: 100 * mib, turn: mib, running: 58, keyRunning: 58, keys: 1}, ""},
		{"past the full mark, a key with no turn", memoryState{used: 85 * mib, limit: 100 * mib, turn: mib, running: 10, keyRunning: 0, keys: 2}, "starts no more turns"},
		{"past the full mark by the floor", memoryState{used: 0, limit: 100 * mib, turn: mib, running: 85, keyRunning: 0, keys: 3}, "starts no more turns"},
		{"past the full mark, nothing running", memoryState{used: 90 * mib, limit: 100 * mib, turn: mib, keys: 1}, "starts no more turns"},
		{"a zero floor", memoryState{used: 59 * mib, limit: 100 * mib, turn: 0, running: 1000, keyRunning: 1000, keys: 1}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := memoryRefusal(tc.s)
			switch {
			case tc.want == "" && r != nil:
				t.Fatalf("refused: %s", r.Message)
			case tc.want != "" && r == nil:
				t.Fatalf("admitted; want a refusal saying %q", tc.want)
			case r != nil && (!strings.Contains(r.Message, tc.want) || r.Limit != "memory_limit" || r.RetryAfter != time.Second):
				t.Fatalf("refusal %+v; want limit memory_limit, a retry in 1s and a message saying %q", r, tc.want)
			}
		})
	}
}

// TestMemoryEnter: Memory counts each key's running turns as they start
// and end; a key that filled its share is refused while another key's
// turns start, until the full mark; a turn ended twice is ended once; a
// limit of 0 bounds nothing.
func TestMemoryEnter(t *testing.T) {
	var used atomic.Uint64
	m := NewMemory(100*mib, mib, used.Load)
	var ends []func()
	enter := func(key string) error {
		t.Helper()
		end, err := m.Enter(key)
		if err == nil {
			ends = append(ends, end)
		}
		return err
	}
	for i := range 60 {
		if err := enter("silent"); err != nil {
			t.Fatalf("silent turn %d refused: %v", i, err)
		}
	}
	var r *Refusal
	if err := enter("silent"); !errors.As(err, &r) || r.Limit != "memory_limit" {
		t.Fatalf("silent's 61st turn: %v; want a memory_limit refusal", err)
	}
	if err := enter("good"); err != nil {
		t.Fatalf("good's turn refused: %v", err)
	}
	ends[len(ends)-1]()
	ends[len(ends)-1]() // ended once
	used.Store(84 * mib)
	if err := enter("good"); err != nil {
		t.Fatalf("good's turn at 84 MiB refused: %v", err)
	}
	used.Store(85 * mib)
	if err := enter("good"); !errors.As(err, &r) || !strings.Contains(r.Message, "no more turns") {
		t.Fatalf("good's turn at 85 MiB: %v; want refused", err)
	}
	for _, end := range ends {
		end()
	}
	used.Store(0)
	m.mu.Lock()
	running, keys := m.running, len(m.perKey)
	m.mu.Unlock()
	if running != 0 || keys != 0 {
		t.Fatalf("after every turn ended: %d running, %d keys counted", running, keys)
	}
	if err := enter("silent"); err != nil {
		t.Fatalf("silent's turn after the others ended: %v", err)
	}

	off := NewMemory(0, mib, func() uint64 { return 1 << 40 })
	if _, err := off.Enter("any"); err != nil || off.Limit() != 0 {
		t.Fatalf("no limit: %v, limit %d", err, off.Limit())
	}
}

// TestMemoryResume: a turn taken over is refused only past the full
// mark, whatever its key's share (it was admitted within it where it
// started), is counted as a running turn from before its key is known and
// as its key's once named, and ends once; without a limit nothing is
// counted.
func TestMemoryResume(t *testing.T) {
	var used atomic.Uint64
	m := NewMemory(100*mib, mib, used.Load)
	var ends []func()
	for range 60 {
		end, err := m.Enter("silent")
		if err != nil {
			t.Fatal(err)
		}
		ends = append(ends, end)
	}
	if _, err := m.Enter("silent"); err == nil {
		t.Fatal("silent's 61st turn admitted; want it past its share")
	}
	count := func() (int, int) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.running, m.perKey["silent"]
	}
	// Past the share mark, silent's turn taken over still runs here.
	r, err := m.Resume()
	if err != nil {
		t.Fatalf("a takeover past the share mark: %v", err)
	}
	if running, silent := count(); running != 61 || silent != 60 {
		t.Fatalf("before its key is named: %d running, %d of silent's; want 61, 60", running, silent)
	}
	r.Name("silent")
	r.Name("other") // named once
	if running, silent := count(); running != 61 || silent != 61 {
		t.Fatalf("named: %d running, %d of silent's; want 61, 61", running, silent)
	}
	r.End()
	r.End() // ended once
	if running, silent := count(); running != 60 || silent != 60 {
		t.Fatalf("ended: %d running, %d of silent's; want 60, 60", running, silent)
	}
	// Ended before its key was read (the claim failed): nothing named.
	r, err = m.Resume()
	if err != nil {
		t.Fatal(err)
	}
	r.End()
	r.Name("silent")
	if running, silent := count(); running != 60 || silent != 60 {
		t.Fatalf("ended unnamed: %d running, %d of silent's; want 60, 60", running, silent)
	}
	// Past the full mark, no turn is taken over.
	used.Store(85 * mib)
	var refusal *Refusal
	if _, err := m.Resume(); !errors.As(err, &refusal) || refusal.Limit != "memory_limit" || !strings.Contains(refusal.Message, "no more turns") {
		t.Fatalf("a takeover at 85 MiB of 100: %v; want a memory_limit refusal", err)
	}
	for _, end := range ends {
		end()
	}
	if running, silent := count(); running != 0 || silent != 0 {
		t.Fatalf("after every turn ended: %d running, %d of silent's", running, silent)
	}
	off, err := NewMemory(0, mib, func() uint64 { return 1 << 40 }).Resume()
	if err != nil {
		t.Fatalf("no limit: %v", err)
	}
	off.Name("any")
	off.End()
}

// TestRuntimeMemory: the runtime's gauge reads what the process holds:
// more than nothing, less than everything it mapped.
func TestRuntimeMemory(t *testing.T) {
	if got := RuntimeMemory()(); got == 0 || got > 1<<40 {
		t.Fatalf("RuntimeMemory() = %d", got)
	}
}

// TestMemoryHeaviest: the key running the most turns, and whether the
// gauge alone is past 85% of the limit; the floor of the running turns
// does not make it so.
func TestMemoryHeaviest(t *testing.T) {
	var used atomic.Uint64
	m := NewMemory(100*mib, mib, used.Load)
	if key, over := m.Heaviest(); key != "" || over {
		t.Fatalf("no turn running: %q, %v", key, over)
	}
	for _, k := range []string{"b", "a", "b", "c", "a"} {
		if _, err := m.Enter(k); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		used uint64
		over bool
	}{{85 * mib, false}, {85*mib + 1, true}, {0, false}} {
		used.Store(tc.used)
		if key, over := m.Heaviest(); key != "a" || over != tc.over {
			t.Errorf("at %d bytes: %q, %v; want \"a\" (first of a and b), %v", tc.used, key, over, tc.over)
		}
	}
	if _, over := NewMemory(0, mib, func() uint64 { return 1 << 40 }).Heaviest(); over {
		t.Error("no limit: over")
	}
}
