package store

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// TestTakeFrame is what takeFrame takes of the queue (as many events as
// fit maxFrame, at least one) and encodeFrame's encoding of them, into the
// buffer it is given when that is large enough (a pooled buffer).
func TestTakeFrame(t *testing.T) {
	big := []byte(strings.Repeat("x", maxFrame))
	tests := []struct {
		name   string
		events [][]byte
		bufCap int
		taken  int  // events in the frame
		reused bool // the frame is the buffer given
	}{
		{"one event, buffer large enough", [][]byte{[]byte("a")}, 64, 1, true},
		{"two events, buffer large enough", [][]byte{[]byte("ab"), []byte("cde")}, 64, 2, true},
		{"buffer too small", [][]byte{[]byte(strings.Repeat("y", 100))}, 8, 1, false},
		{"no buffer", [][]byte{[]byte("a")}, 0, 1, false},
		{"an event larger than a frame goes alone", [][]byte{big, []byte("next")}, 64, 1, false},
		{"what does not fit waits for the next frame", [][]byte{big[:maxFrame/2], big[:maxFrame/2]}, maxFrame, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := make([]pending, len(tt.events))
			for i, e := range tt.events {
				q[i] = pending{event: e}
			}
			buf := make([]byte, 3, tt.bufCap+3)[3:] // not at offset 0, to tell it apart
			batch := takeFrame(q)
			frame := encodeFrame(batch, buf)
			if len(batch) != tt.taken {
				t.Fatalf("took %d events, want %d", len(batch), tt.taken)
			}
			got, err := splitFrame(frame)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(got, tt.events[:tt.taken], bytes.Equal) {
				t.Errorf("the frame's events differ from those taken")
			}
			if f := (&outFrame{batch: batch}); f.size() != len(frame) || !f.holds(frame) {
				t.Errorf("the frame's size %d (encoded %d), or its events, differ from what it says of itself", f.size(), len(frame))
			}
			if reused := cap(buf) > 0 && &buf[:1][0] == &frame[:1][0]; reused != tt.reused {
				t.Errorf("frame in the given buffer: %v, want %v", reused, tt.reused)
			}
		})
	}
}
