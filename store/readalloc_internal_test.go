package store

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/internal/natstest"
)

// TestBatchReadHoldsNoLargeBuffer (issue 37, row 4): a read of a run's
// log allocates about what it reads. It made a synchronous subscription
// per request, whose channel holds 64K messages: 512 KiB allocated and
// cleared for each read, which, for a replica reading many runs at once
// (taking over many), was the collector's work the reads waited for.
func TestBatchReadHoldsNoLargeBuffer(t *testing.T) {
	url := natstest.Start(t)
	s := openTestReplica(t, url, time.Second)
	ctx := t.Context()
	const id, frames = "small", 8
	if created, _, err := s.Create(ctx, id, 1, []byte("req"), func(string) []byte { return nil }); err != nil || !created {
		t.Fatalf("Create = %v, %v", created, err)
	}
	for i := range frames {
		acked := make(chan error, 1)
		if err := s.Append(ctx, id, 1, fmt.Appendf(nil, "event %d", i), func(err error) { acked <- err }); err != nil {
			t.Fatal(err)
		}
		if err := <-acked; err != nil {
			t.Fatal(err)
		}
	}
	k := runKey{id, 1}
	read := func() {
		events, err := s.readAll(ctx, k)
		if err != nil || len(events) != frames {
			t.Fatalf("readAll: %d events, %v", len(events), err)
		}
	}
	read()
	const reads = 50
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range reads {
		read()
	}
	runtime.ReadMemStats(&after)
	// The server runs in this process too: what it allocates to answer
	// is counted with the rest.
	if per := (after.TotalAlloc - before.TotalAlloc) / reads; per > 256<<10 {
		t.Errorf("a read of %d small frames allocated %d bytes, want under 256 KiB", frames, per)
	}
}
