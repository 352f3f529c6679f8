package durable

import (
	"strings"
	"testing"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/server/delivery"
)

// TestRunWindowBounds: a run keeps only its latest events within the
// window's bounds, by count and, for those before its newest, by bytes,
// and always its newest one; the window is contiguous and ends at the last
// seq published.
func TestRunWindowBounds(t *testing.T) {
	for _, tc := range []struct {
		name      string
		events    int
		size      int // bytes of each event's text
		wantCount int
	}{
		{"few small events", 10, 10, 10},
		{"many small events: bound by count", 1000, 10, windowEvents},
		{"large events: bound by bytes", 100, 10 << 10, windowBytes/(10<<10+16) + 1},
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
			if size != r.windowSize || (len(r.window) > 1 && size-r.sizes[len(r.sizes)-1] > windowBytes) {
				t.Errorf("window of %d bytes (counted %d), bound %d", size, r.windowSize, windowBytes)
			}
			if cap(r.window) > 2*windowEvents {
				t.Errorf("the window's array holds %d events", cap(r.window))
			}
		})
	}
}

// TestWindowKeepsWhatALargeEventFollows (issue 37, row 2): an event
// larger than the window does not push out the events before it, which a
// stream one Send behind the run has still to send: that stream is served
// from the window, not sent to read the log. The event after it pushes
// it out, with all before it.
func TestWindowKeepsWhatALargeEventFollows(t *testing.T) {
	r := newRun(Key{TurnID: "t", Attempt: 1}, nil, func(error) {})
	ev := func(seq, size int) {
		r.publish(&turnstilev1.AgentEvent{Seq: uint64(seq), Payload: &turnstilev1.AgentEvent_TextDelta{TextDelta: &turnstilev1.TextDelta{Text: strings.Repeat("x", size)}}}, size+16)
	}
	for seq := 1; seq <= 10; seq++ {
		ev(seq, 1<<10)
	}
	ev(11, 2*windowBytes)
	got, state := r.Next(5, nil)
	if state == delivery.Behind || len(got) != 6 || got[0].Event.GetSeq() != 6 || got[5].Event.GetSeq() != 11 {
		t.Fatalf("Next(5) after a large event = %d events from seq %d, %v; want seqs 6 to 11", len(got), seqOf(got), state)
	}
	ev(12, 1<<10)
	if _, state := r.Next(5, nil); state != delivery.Behind {
		t.Errorf("Next(5) once an event followed the large one = %v, want Behind", state)
	}
	if got, state := r.Next(11, nil); len(got) != 1 || got[0].Event.GetSeq() != 12 || state == delivery.Behind {
		t.Errorf("Next(11) = %d events from seq %d, %v; want the one after the large one", len(got), seqOf(got), state)
	}
}

func seqOf(items []Item) uint64 {
	if len(items) == 0 {
		return 0
	}
	return items[0].Event.GetSeq()
}
