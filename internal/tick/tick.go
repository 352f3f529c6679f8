// Package tick is the process's clock of shared ticks. Work that many
// turns each repeat at an interval (a reply's text written to the turn
// store at store.frame_interval, a run's lease renewed three times a lease
// TTL) waits for the ticks of this clock rather than for its own interval
// since it last ran, so the turns of a process, and of every process whose
// wall clock agrees, do it at the same moments: the store then takes their
// writes together, in one wake-up of each of its loops, one round of its
// replication, and a burst of goroutines that hand work to each other
// without sleeping between, instead of one of each per write.
//
// The ticks of an interval are its whole multiples from an epoch taken at a
// whole second of the wall clock when the process started, and read on the
// monotonic clock: a step of the wall clock moves none of them.
package tick

import "time"

// epoch is where ticks count from: a reading of the monotonic clock at a
// whole second of the wall clock, so that the ticks of processes whose
// clocks agree agree too, for any interval that divides a second (and, of
// one process, for any interval).
var epoch = func() time.Time {
	now := time.Now()
	return now.Add(-time.Duration(now.UnixNano() % int64(time.Second)))
}()

// After returns the first tick of the clock of ticks every interval that
// is at least least after t. A zero or negative interval has no ticks: it
// returns t plus least.
func After(t time.Time, every, least time.Duration) time.Time {
	if every <= 0 {
		return t.Add(least)
	}
	since := t.Sub(epoch) + least
	n := since / every // rounded toward zero: up below the epoch
	if since > n*every {
		n++
	}
	return epoch.Add(n * every)
}
