package store_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
)

// TestLogReadInBatches: a run's log is read back in batches of frames (a
// direct get request each, bounded in frames and in bytes): a log of
// more frames than a batch holds, some of them larger than a batch's
// bytes together, reads back whole and in order: by a claim of the run
// (its whole log at once), and by watches from its start and from any
// event.
func TestLogReadInBatches(t *testing.T) {
	const n = 600 // frames: more than two batches of 256
	event := func(i int) []byte {
		size := 16
		if i%100 == 7 {
			size = 400 << 10 // each one past a batch's bytes
		}
		return append(fmt.Appendf(nil, "e%04d:", i), bytes.Repeat([]byte{'x'}, size)...)
	}
	for _, dir := range []string{"", "file"} {
		t.Run(fmt.Sprintf("dir=%q", dir), func(t *testing.T) {
			if dir != "" {
				dir = t.TempDir()
			}
			s := open(t, dir)
			ctx := context.Background()
			const id = "batched"
			if created, _, err := s.Create(ctx, id, 1, []byte("req"), func(string) []byte { return nil }); err != nil || !created {
				t.Fatalf("Create = %v, %v", created, err)
			}
			for i := 1; i <= n; i++ {
				// Each event acknowledged before the next is appended: a
				// frame of its own.
				acked := make(chan error, 1)
				if err := s.Append(ctx, id, 1, event(i), func(err error) { acked <- err }); err != nil {
					t.Fatal(err)
				}
				if err := <-acked; err != nil {
					t.Fatalf("ack %d: %v", i, err)
				}
			}
			// Handed off and claimed again: the claim reads the whole log.
			if err := s.Release(ctx, id, 1); err != nil {
				t.Fatal(err)
			}
			_, events, _, err := s.Claim(ctx, id, 1, func(string) []byte { return nil })
			if err != nil {
				t.Fatal(err)
			}
			if len(events) != n {
				t.Fatalf("the claim read %d events, want %d", len(events), n)
			}
			for i, b := range events {
				if !bytes.Equal(b, event(i+1)) {
					t.Fatalf("the claim's event %d is %.12q (%d bytes), want %.12q", i+1, b, len(b), event(i+1))
				}
			}
			if err := s.Finish(ctx, id, 1); err != nil {
				t.Fatal(err)
			}
			for _, after := range []uint64{0, 1, 255, 256, 257, 306, n - 1} {
				got := collect(t, s, id, 1, after, n-int(after))
				if len(got) != n-int(after) {
					t.Fatalf("after %d: %d events, want %d", after, len(got), n-int(after))
				}
				for j, b := range got {
					if want := event(int(after) + j + 1); !bytes.Equal([]byte(b), want) {
						t.Fatalf("after %d: event %d is %.12q (%d bytes), want %.12q (%d bytes)", after, int(after)+j+1, b, len(b), want, len(want))
					}
				}
			}
		})
	}
}
