package tick

import (
	"strings"
	"testing"
	"time"
)

// TestAfter: the first tick at least least after t, on the grid of
// whole intervals from the epoch.
func TestAfter(t *testing.T) {
	const every = 100 * time.Millisecond
	tests := []struct {
		name  string
		t     time.Duration // after the epoch
		least time.Duration
		want  time.Duration // after the epoch
	}{
		{"on a tick, half an interval", 10 * every, every / 2, 11 * every},
		{"just after a tick", 10*every + time.Millisecond, every / 2, 11 * every},
		{"at half", 10*every + every/2, every / 2, 11 * every},
		{"just past half", 10*every + every/2 + time.Millisecond, every / 2, 12 * every},
		{"just before a tick", 11*every - time.Millisecond, every / 2, 12 * every},
		{"the next tick", 10*every + time.Millisecond, time.Nanosecond, 11 * every},
		{"the next tick, on a tick", 10 * every, time.Nanosecond, 11 * every},
		{"at least, at once", 10 * every, 0, 10 * every},
		{"at the epoch", 0, every / 2, every},
		{"before the epoch", -3 * every / 2, every / 2, -every},
		{"well before the epoch", -25 * every / 2, time.Nanosecond, -12 * every},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := After(epoch.Add(tt.t), every, tt.least)
			if d := got.Sub(epoch); d != tt.want {
				t.Errorf("After(epoch%+v, %v, %v) = epoch%+v, want epoch%+v", tt.t, every, tt.least, d, tt.want)
			}
		})
	}
}

// TestAfterGaps: with least half an interval, two ticks in a row taken
// from the one before are an interval apart, and the first is between
// half an interval and one and a half after t, wherever t falls.
func TestAfterGaps(t *testing.T) {
	const every = 100 * time.Millisecond
	for off := time.Duration(0); off < 3*every; off += 7 * time.Millisecond {
		start := epoch.Add(off)
		first := After(start, every, every/2)
		if gap := first.Sub(start); gap < every/2 || gap >= 3*every/2 {
			t.Errorf("from epoch%+v: first gap %v, want in [%v, %v)", off, gap, every/2, 3*every/2)
		}
		if next := After(first, every, every/2); next.Sub(first) != every {
			t.Errorf("from epoch%+v: then %v, want %v", off, next.Sub(first), every)
		}
	}
}

// TestAfterNoInterval: a zero interval has no ticks.
func TestAfterNoInterval(t *testing.T) {
	now := time.Now()
	if got := After(now, 0, time.Second); !got.Equal(now.Add(time.Second)) {
		t.Errorf("After(now, 0, 1s) = now%+v", got.Sub(now))
	}
}

// TestAfterMonotonic: a tick is a reading of the monotonic clock (what
// timers and time.Until use), and the epoch is at a whole second of the
// wall clock.
func TestAfterMonotonic(t *testing.T) {
	got := After(time.Now(), 100*time.Millisecond, 50*time.Millisecond)
	// Time.String ends with "m=±<seconds>" when it has a monotonic
	// reading.
	if !strings.Contains(got.String(), " m=") {
		t.Errorf("tick %s has no monotonic reading", got)
	}
	if ns := epoch.UnixNano() % int64(time.Second); ns != 0 {
		t.Errorf("the epoch is %dns past a whole second", ns)
	}
}
