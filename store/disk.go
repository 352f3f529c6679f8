package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// checkDisk returns an ErrFull when the disk of store.dir cannot take new
// turns, for the embedded file store: it has less than minFreeDisk free,
// or it filled and the running turns are spending the reserve (reserve.go;
// [ErrReserveSpent] once that is spent too). It spends the reserve as the
// disk fills, and writes it whole again once space returns. When the
// embedded server failed a write (its health report says so), it stops the
// store's publishes and restarts the server's JetStream, which takes no
// write after a failed one, as soon as the disk has room for it: at once
// when the reserve gave it room, so that running turns go on
// (failedwrite.go).
func (kp *keeper) checkDisk(ctx context.Context) error {
	if kp.srv == nil || kp.cfg.Dir == "" {
		return nil
	}
	free, ok := diskFree(kp.cfg.Dir)
	if !ok {
		return nil
	}
	werr := kp.writeFailure()
	failed := strings.Contains(werr, "no space left")
	if werr != "" {
		// Its publishes under way get no answer: stop them.
		kp.writes.halt()
	}
	kp.mu.Lock()
	if free < minFreeDisk || failed {
		kp.suspect = true
	}
	kp.mu.Unlock()

	r := kp.reserve
	if r == nil {
		r = newReserve(kp.cfg.Dir, 0)
		kp.reserve = r
	}
	// Spend the reserve as the disk fills: a stage a pass, the disk's
	// free space read again after each.
	spend := false
	switch r.stage {
	case reserveWhole:
		spend = failed || free < minFreeDisk && r.held > 0
	case reserveInUse:
		spend = failed || free < spentFloor
	}
	if spend {
		stage, err := r.spend()
		if err != nil {
			kp.logger.Error("turn store: cannot release the reserve", "error", err)
		}
		switch stage {
		case reserveInUse:
			kp.logger.Warn("turn store: the disk of store.dir is full; new turns are refused, running turns go on in the reserve",
				"free", free, "released", r.size-r.held)
		case reserveSpent:
			kp.logger.Error("turn store: the disk of store.dir filled past the reserve; the turns still running end, their last events in what is left",
				"free", free, "released", r.last())
		}
		free, _ = diskFree(kp.cfg.Dir)
	}
	kp.mu.Lock()
	// A server that failed a write is restarted as soon as it has room to
	// take writes; one whose write timed out is probed then, and one that
	// may have failed a write unseen (the disk filled) once the disk has
	// room again.
	probe := werr == "" && (kp.broken && free >= restartFloor || kp.suspect && free >= minFreeDisk)
	kp.mu.Unlock()
	restart := werr != "" && free >= restartFloor
	if probe {
		if err := kp.probe(ctx); err != nil {
			kp.logger.Warn("turn store: the embedded server takes no writes", "error", err)
			restart = true
		}
	}
	if restart {
		kp.logger.Warn("turn store: the embedded server takes no writes since one failed; restarting its JetStream", "error", werr)
		kp.writes.halt()
		err := kp.restartJetStream()
		if err == nil {
			err = kp.probe(ctx)
		}
		if err != nil {
			// Its publishes wait (up to their own bound) for the next pass.
			kp.logger.Error("turn store: cannot restart the embedded JetStream", "error", err)
			return fmt.Errorf("%w: the embedded server takes no writes: %w", ErrFull, err)
		}
		kp.logger.Info("turn store: the embedded JetStream was restarted and takes writes again")
	}
	if probe || restart {
		kp.writes.resume()
		kp.mu.Lock()
		kp.broken = false
		kp.suspect = free < minFreeDisk
		kp.mu.Unlock()
	}
	// Space returned: the reserve is written whole again (the file holds
	// r.held of it now), or, on a disk without room for all of it, the
	// store takes turns again with what it holds.
	if werr == "" && r.held < r.size && free+uint64(r.held) >= uint64(r.size)+minFreeDisk {
		if err := r.take(); err != nil {
			kp.logger.Warn("turn store: cannot write the reserve again", "error", err)
		} else {
			kp.logger.Info("turn store: the disk of store.dir has room again; the reserve is held whole", "reserve", r.size)
			free, _ = diskFree(kp.cfg.Dir)
		}
	}
	if werr == "" && r.stage != reserveWhole && free >= minFreeDisk && (r.held == r.size || free+uint64(r.held) < uint64(r.size)+minFreeDisk) {
		r.stage = reserveWhole
	}
	switch {
	case r.stage == reserveSpent:
		return fmt.Errorf("%w (%d bytes free)", ErrReserveSpent, free)
	case werr != "" && !restart:
		return fmt.Errorf("%w: the embedded server takes no writes since one failed (%d bytes free)", ErrFull, free)
	case r.stage == reserveInUse:
		return fmt.Errorf("%w: the disk of store.dir filled; running turns go on in its reserve (%d bytes free)", ErrFull, free)
	case free < minFreeDisk:
		return fmt.Errorf("%w: the disk of store.dir has %d bytes free", ErrFull, free)
	}
	return nil
}

// diskFree returns the bytes free on the disk of dir for this process.
func diskFree(dir string) (uint64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return st.Bavail * uint64(st.Bsize), true
}

// probeSubject is where the keeper writes its probe: a token no turn id
// encodes to (base64 never has one character).
const probeSubject = subjectRoot + ".-.0.probe"

// probe stores a small record and removes it.
func (kp *keeper) probe(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := kp.js.PublishMsg(pctx, &nats.Msg{Subject: probeSubject, Data: []byte("probe")}); err != nil {
		return err
	}
	return kp.stream.Purge(pctx, jetstream.WithPurgeSubject(probeSubject))
}

// restartJetStream restarts the embedded server's JetStream, which opens
// the stream's files anew: a file store that failed a write (its disk was
// full) refuses every later one until then.
func (kp *keeper) restartJetStream() error {
	// No publish of an append or a record is under way meanwhile: one
	// would get no answer (see keeper.gate).
	kp.gate.Lock()
	defer kp.gate.Unlock()
	cfg := kp.srv.JetStreamConfig()
	if cfg == nil {
		return errors.New("JetStream is not enabled")
	}
	if err := kp.srv.ShutdownJetStream(); err != nil {
		return err
	}
	// EnableJetStream places its directory under the one it is given.
	cfg.StoreDir = kp.cfg.Dir
	if err := kp.srv.EnableJetStream(cfg); err != nil {
		return err
	}
	// The lease bucket was in memory (see dropFileLeases): make it again.
	// It stays empty: the embedded store's runs are held in the process,
	// not by leases (see [leases.local]).
	ctx, cancel := context.WithTimeout(context.Background(), setUpTry)
	defer cancel()
	return kp.owners.remakeLeases(ctx)
}
