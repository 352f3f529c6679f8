package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstile-dev/turnstile/internal/tick"
)

// renewLoop starts the renewal of the run's lease: three times per lease
// TTL until the run ends, and sooner after a renewal that failed (the
// bucket's leader went away: the cluster is electing another): the lease
// is written again as soon as a leader takes it. A renewal is one update
// of the lease against the revision this replica wrote last; only when
// that is refused (another write came between: another replica's claim,
// or the lease expired, as a bucket whose leader was lost for longer than
// the TTL expires it) or its outcome is unknown does the renewal read the
// lease: an expired lease is taken again unless another replica holds it,
// and a lease another replica holds means the run is lost.
//
// Each attempt, failed or not, is a beat ([writer.renewing]): it is how
// the owner tells a replica about to take the run over that it is alive
// and renewing, which a lease expired for want of a leader does not say.
//
// The renewal runs on a timer ([writer.renewTick]), not on a goroutine of
// its own: between attempts a run holds none (a goroutine per run, for
// the run's whole life, was a held turn's memory: BENCHMARKS.md, issue
// #26). w.renew counts it from the caller's Add until it ends: when w.stop
// is closed (at once with [writer.haltRenewal], else at the next attempt),
// the store closes, or the run is lost.
func (w *writer) renewLoop() {
	w.beat()
	w.renewMu.Lock()
	defer w.renewMu.Unlock()
	w.renewHalted, w.renewEnded = false, false
	w.renewTimer = time.AfterFunc(w.s.renewWait(), w.renewTick)
}

// renewTick is one attempt of the renewal, on the timer's goroutine; it
// sets the timer for the next one.
func (w *writer) renewTick() {
	if w.renewStopped() {
		return
	}
	w.beat()
	w.trying.Store(true)
	renewed, lost := w.renewOnce()
	w.trying.Store(false)
	w.beat()
	w.renewMu.Lock()
	defer w.renewMu.Unlock()
	switch {
	case lost || w.renewHalted || w.stopped():
		w.renewEnd()
	case renewed:
		w.renewTimer.Reset(w.s.renewWait())
	default:
		w.renewTimer.Reset(min(renewRetry, w.s.cfg.LeaseTTL/3))
	}
}

// renewStopped ends the renewal, and reports so, when it was stopped
// while its timer ran out.
func (w *writer) renewStopped() bool {
	w.renewMu.Lock()
	defer w.renewMu.Unlock()
	if w.renewHalted || w.stopped() {
		w.renewEnd()
		return true
	}
	return false
}

// stopped reports whether the run's renewal was told to stop: w.stop is
// closed, or the store is.
func (w *writer) stopped() bool {
	select {
	case <-w.stop:
		return true
	case <-w.s.closed:
		return true
	default:
		return false
	}
}

// haltRenewal ends the renewal: at once when it waits for its timer,
// else when the attempt under way ends (w.renew.Wait waits for that).
func (w *writer) haltRenewal() {
	w.renewMu.Lock()
	defer w.renewMu.Unlock()
	w.renewHalted = true
	if w.renewTimer != nil && w.renewTimer.Stop() {
		w.renewEnd()
	}
}

// renewEnd records that the renewal ended, once; w.renewMu is held.
func (w *writer) renewEnd() {
	if w.renewEnded {
		return
	}
	w.renewEnded = true
	w.beatAt.Store(0) // stopped: a claim need not wait
	w.renew.Done()
}

// renewWait returns how long a run waits for its lease's next renewal:
// until the next tick of the process's clock of renewals, three a lease
// TTL (package internal/tick), so the renewals of every run of the process
// (and of every replica whose clock agrees) come together and the lease
// bucket takes them in one round of its replication; two renewals are at
// most a third of the TTL apart.
func (s *Store) renewWait() time.Duration {
	every := s.cfg.LeaseTTL / 3
	return time.Until(tick.After(time.Now(), every, time.Nanosecond))
}

// renewRetry is the pause before a failed renewal is made again.
const renewRetry = 100 * time.Millisecond

// beat records that the renewal is running now.
func (w *writer) beat() { w.beatAt.Store(time.Now().UnixNano()) }

// renewing reports whether the lease's renewal is running: an attempt is
// under way (against a cluster electing a leader it may wait up to a
// lease TTL), or one ended within half a lease TTL (they are at most a
// third apart). A renewal that stopped (the run ended, the process is
// paused) is not. With the embedded store, whose runs have no lease, a run
// this process owns is held as long as the process lives: it is.
func (w *writer) renewing() bool {
	return w.s.leases.local || w.trying.Load() || time.Since(time.Unix(0, w.beatAt.Load())) < w.s.cfg.LeaseTTL/2
}

// renewOnce renews the lease once; it reports whether the lease was
// written, and whether the run is lost.
func (w *writer) renewOnce() (renewed, lost bool) {
	s := w.s
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.LeaseTTL)
	defer cancel()
	if w.lease != nil {
		// The first write's revision; its acknowledgement came long ago.
		select {
		case ack := <-w.lease.Ok():
			w.leaseRev = ack.Sequence
		case <-w.lease.Err():
		case <-ctx.Done():
		}
		s.pub.forgetAck(w.lease)
		w.lease = nil
	}
	var err error
	if w.leaseRev != 0 {
		var rev uint64
		rev, err = s.leases.kv.Update(ctx, w.key.lease(), []byte(s.id), w.leaseRev)
		if err == nil {
			w.leaseRev = rev
			return true, false
		}
		// Refused: somebody else wrote it. Unknown (no answer): it may
		// have been written; either way the next revision is read.
		w.leaseRev = 0
		if !isWrongLastSeq(err) {
			s.logger.Warn("turn lease not renewed", "turn_id", w.key.turnID, "attempt", w.key.attempt, "error", err)
			return false, false
		}
	}
	e, err := s.leases.kv.Get(ctx, w.key.lease())
	switch {
	case err == nil && string(e.Value()) == s.id:
		w.leaseRev, err = s.leases.kv.Update(ctx, w.key.lease(), []byte(s.id), e.Revision())
	case errors.Is(err, jetstream.ErrKeyNotFound):
		w.leaseRev, err = s.leases.kv.Create(ctx, w.key.lease(), []byte(s.id))
	case err == nil:
		err = fmt.Errorf("%w: replica %s holds its lease", ErrLost, e.Value())
		w.fail(err)
		go w.onSignal(SignalLost)
		return false, true
	}
	if err != nil {
		s.logger.Warn("turn lease not renewed", "turn_id", w.key.turnID, "attempt", w.key.attempt, "error", err)
		return false, false
	}
	return true, false
}
