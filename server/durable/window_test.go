package durable

import (
	"strings"
	"testing"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// TestRunWindowBounds: a run keeps only its latest events within the
// window's bounds, by count and by bytes, and always its newest one; the
// window is contiguous and ends at the last seq published.
func TestRunWindowBounds(t *testing.T) {
	for _, tc := range []struct {
		name      string
		events    int
		size      int // bytes of each event's text
		wantCount int
	}{
		{"few small events", 10, 10, 10},
		{"many small events: bound by count", 1000, 10, windowEvents},
		{"large events: bound by bytes", 100, 10 << 10, windowBytes / (10<<10 + 16)},
		{"events larger than the window: the newest stays", 5, 2 * windowBytes, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRun(Key{TurnID: "t", Attempt: 1}, nil, func(error) {})
			for i := range tc.events {
				ev := &turnstilev1.AgentEvent{Seq: uint64(i + 1), Payload: &turnstilev1.AgentEvent_TextDelta{TextDelta: &turnstilev1.TextDelta{Text: strings.Repeat("x", tc.size)}}}
				r.publish(ev, tc.size+16)
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			if len(r.window) != tc.wantCount || r.last != uint64(tc.events) {
				t.Fatalf("window of %d events up to seq %d, want %d up to %d", len(r.window), r.last, tc.wantCount, tc.events)
			}
			size := 0
			for i, ev := range r.window {
				if ev.GetSeq() != r.first()+uint64(i) {
					t.Fatalf("window[%d] has seq %d, want %d", i, ev.GetSeq(), r.first()+uint64(i))
				}
				size += r.sizes[i]
			}
			if size != r.windowSize || (len(r.window) > 1 && size > windowBytes) {
				t.Errorf("window of %d bytes (counted %d), bound %d", size, r.windowSize, windowBytes)
			}
			if cap(r.window) > 2*windowEvents {
				t.Errorf("the window's array holds %d events", cap(r.window))
			}
		})
	}
}
