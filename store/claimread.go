package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// claimReads are what a claim of a run reads before it takes the run's
// lease, all at once (see [Store.readForClaim]): none of them waits for
// another, so a claim pays one round trip for them where it paid one each
// (the lease, the owner record, the owner record again after the lease:
// BENCHMARKS.md, issue 37, row 4). The run's first record is not among
// them: only a claim that won the lease reads it, beside its fence (see
// [Store.Claim]).
type claimReads struct {
	// last is the run's last owner record: the one the claim's fence
	// expects, unless another claim's fence comes between (see
	// [Store.fence]).
	last *jetstream.RawStreamMsg
	// lease is the last entry of the run's lease, nil when it could not be
	// read (mode nats only): whether the owner released the run (see
	// [claimReads.released]).
	lease *nats.Msg
}

// readForClaim reads, at once, what a claim of run k reads before it
// takes the run's lease: its last owner record and (mode nats) its
// lease's last entry. It fails with [fs.ErrNotExist] when the run has no
// record.
func (s *Store) readForClaim(ctx context.Context, k runKey) (claimReads, error) {
	var r claimReads
	var wg sync.WaitGroup
	if !s.leases.local {
		wg.Go(func() { r.lease = s.leases.leaseEntry(ctx, k) })
	}
	last, err := s.stream.GetLastMsgForSubject(ctx, k.own())
	wg.Wait()
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return claimReads{}, fmt.Errorf("store: run %q attempt %d: %w", k.turnID, k.attempt, fs.ErrNotExist)
	}
	if err != nil {
		return claimReads{}, fmt.Errorf("store: claim: %w", err)
	}
	r.last = last
	return r, nil
}

// readFirst returns run k's first record, Create's, which holds the run's
// request: [fs.ErrNotExist] when the run has none.
func (s *Store) readFirst(ctx context.Context, k runKey) ([]byte, error) {
	m, err := s.stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(k.own()))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("store: run %q attempt %d: %w", k.turnID, k.attempt, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("store: claim: %w", err)
	}
	return m.Data, nil
}

// leaseEntry returns the last entry of run k's lease, read by one direct
// get, which any replica of the bucket's stream answers; nil when it
// cannot be read or the key has none.
func (l *leases) leaseEntry(ctx context.Context, k runKey) *nats.Msg {
	ctx, cancel := context.WithTimeout(ctx, min(l.cfg.LeaseTTL, time.Second))
	defer cancel()
	m, err := l.nc.RequestWithContext(ctx, directGetPrefix+leaseStream+".$KV."+LeaseBucket+"."+k.lease(), nil)
	if err != nil || m.Header.Get(statusHeader) != "" {
		return nil
	}
	return m
}

// released returns the revision of the lease's last entry when it is a
// release ([leases.releaseLease]) by the replica that the run's last
// owner record names: its owner gave the run up, and a claim need not ask
// it whether it renews (an owner that is exiting may no longer answer, and
// the question would wait its whole timeout). Anything else (a lease, an
// expiry's marker, a tombstone, a release by a replica that no longer
// owned the run, what could not be read) is 0.
func (r claimReads) released() uint64 {
	m := r.lease
	if m == nil || m.Header.Get(kvOperation) != "PURGE" || len(m.Data) == 0 {
		return 0
	}
	rev, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil || r.last.Header.Get(ownerHeader) != string(m.Data) {
		return 0
	}
	return rev
}

// claimHeader numbers, in each owner record a claim writes (its fence),
// the run's claims up to it: 1 for the first, whose fence follows the
// creator's record, which has none. A claim counts its own from the
// record it fences over, where it asked the stream for the number of the
// run's owner records (a JetStream API request of its own).
const claimHeader = "Turnstile-Claim"

// claimNumber returns the number of the claim whose fence follows owner
// record last: 1 after the run's first record (Create's, the only owner
// record written expecting none before it on its subject, which its
// stored header says), else one more than last's [claimHeader]. It
// reports false when last names no number (a replica of the version
// before wrote it): the stream counts them then (see [Store.claimNumber]).
// A claim need not read the first record to tell it from the others, so
// only a claim that won the lease reads it (see [Store.Claim]).
func claimNumber(last *jetstream.RawStreamMsg) (int, bool) {
	if n, err := strconv.Atoi(last.Header.Get(claimHeader)); err == nil && n >= 1 {
		return n + 1, true
	}
	if last.Header.Get(jetstream.ExpectedLastSubjSeqHeader) == "0" {
		return 1, true
	}
	return 0, false
}
