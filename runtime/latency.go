package runtime

import (
	"math"
	"slices"
	"sync"
	"time"
)

// latencyWindow is the number of recent time-to-first-chunk samples kept per
// model for quantile hedge delays: enough for a stable 95th percentile,
// small enough that the delay follows the model when it gets slower.
const latencyWindow = 256

// minLatencySamples is the number of samples a quantile needs before it is
// trusted; until then a model with a quantile delay is not hedged.
const minLatencySamples = 20

// latencies keeps a model's most recent times to first chunk in a ring of
// bounded size. It is safe for concurrent use.
type latencies struct {
	mu   sync.Mutex
	ring [latencyWindow]time.Duration
	n    int // samples held, up to latencyWindow
	next int // where the next sample goes
}

// add records a time to first chunk.
func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ring[l.next] = d
	l.next = (l.next + 1) % latencyWindow
	l.n = min(l.n+1, latencyWindow)
}

// quantile returns the q-quantile (0 < q < 1) of the samples held, by the
// nearest-rank method, and false while there are too few of them.
func (l *latencies) quantile(q float64) (time.Duration, bool) {
	l.mu.Lock()
	if l.n < minLatencySamples {
		l.mu.Unlock()
		return 0, false
	}
	s := slices.Clone(l.ring[:l.n])
	l.mu.Unlock()
	slices.Sort(s)
	rank := int(math.Ceil(q * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1], true
}
