package store

import (
	"context"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// evictGoal is what the keeper removes finished runs for: the log's
// bytes and runs at most.
type evictGoal struct {
	bytes, turns uint64
}

// unmet reports whether a log of bytes and turns is over the goal.
func (g evictGoal) unmet(bytes, turns uint64) bool { return bytes > g.bytes || turns > g.turns }

// runsOf returns how many runs a log of subjects holds: two subjects a
// run, its records' and its events', counting one that has only its
// record yet.
func runsOf(subjects uint64) uint64 { return (subjects + 1) / 2 }

// evict purges the oldest runs that are not running, from stream
// sequence first on, until the log meets goal or maxExamined runs were
// looked at; it returns how many it purged, and exhausted when it looked
// at every run the log holds. bytes and turns are what the log holds now.
func (kp *keeper) evict(ctx context.Context, first uint64, goal evictGoal, bytes, turns uint64) (purged int, exhausted bool) {
	seq := first
	for examined := 0; examined < maxExamined && goal.unmet(bytes, turns); examined++ {
		m, err := kp.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subjectRoot+".*.*.own"))
		if err != nil {
			if !errors.Is(err, jetstream.ErrMsgNotFound) && ctx.Err() == nil {
				kp.logger.Warn("turn store: cannot read the log to make room", "error", err)
			}
			exhausted = errors.Is(err, jetstream.ErrMsgNotFound)
			break
		}
		seq = m.Sequence + 1
		k, ok := runOf(m.Subject)
		if !ok {
			continue
		}
		running, err := kp.owners.running(ctx, k)
		if err != nil {
			kp.logger.Warn("turn store: cannot tell whether a run is running", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
			continue
		}
		if running {
			continue
		}
		if err := kp.stream.Purge(ctx, jetstream.WithPurgeSubject(k.prefix()+".>")); err != nil {
			kp.logger.Warn("turn store: cannot remove a finished run", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
			continue
		}
		purged++
		info, err := kp.stream.Info(ctx)
		if err != nil {
			break
		}
		bytes, turns = info.State.Bytes, runsOf(info.State.NumSubjects)
	}
	return purged, exhausted
}

// runOf returns the run whose owner record subject is subj.
func runOf(subj string) (runKey, bool) {
	parts := strings.Split(subj, ".")
	if len(parts) != 5 {
		return runKey{}, false
	}
	id, err := base64.RawURLEncoding.DecodeString(parts[2])
	n, aerr := strconv.ParseUint(parts[3], 10, 32)
	if err != nil || aerr != nil {
		return runKey{}, false
	}
	return runKey{turnID: string(id), attempt: uint32(n)}, true
}

// running reports whether run k may still be written to: it has a lease
// (with the embedded server, whose runs are all this replica's: this
// process owns it or is claiming it), or its last owner record is recent
// enough that its owner may not have written the lease yet (Create writes
// it without waiting): a lease TTL, or with the embedded server 100ms (the
// moment between Create's record and its entry in the process's runs). A
// run whose owner died is not running: its log may go before a replica
// takes it over, which then finds it gone.
func (l *leases) running(ctx context.Context, k runKey) (bool, error) {
	young := l.cfg.LeaseTTL
	if l.local {
		l.mu.Lock()
		_, mine := l.runs[k]
		l.mu.Unlock()
		if mine {
			return true, nil
		}
		young = 100 * time.Millisecond
	}
	if leased, err := l.leased(ctx, k); err != nil || leased {
		return leased, err
	}
	m, err := l.stream.GetLastMsgForSubject(ctx, k.own())
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	return time.Since(m.Time) < young, nil
}
