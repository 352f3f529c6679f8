package store

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
)

// The reserve: room the embedded file store holds back on the disk of
// store.dir (store.reserve bytes) for the turns running when that disk
// fills.
//
// nats-server's file store takes no write after one failed (a full disk):
// it keeps the write error until its files are opened again (see
// [keeper.restartJetStream]). Whatever fills the disk, the turns running
// then could not store another event, and their clients would be told
// they failed while their logs said nothing of it. So the store writes a
// file of store.reserve bytes beside the log when it opens, before the
// embedded server counts the disk's free space, and the keeper spends it
// in two steps:
//
//   - the disk fills (less than minFreeDisk free, or a write failed for
//     want of space): the file is cut to its last quarter. New turns are
//     refused; running turns go on in the room it gave back (the keeper
//     restarts the embedded JetStream when a write had failed);
//   - the disk fills again (less than spentFloor free, or another write
//     failed for want of space): the file is removed, and the store says
//     the reserve is spent ([ErrReserveSpent]): the turns still running
//     must end now, and the last quarter holds their last events.
//
// Once the disk has the reserve and minFreeDisk free again the file is
// written whole again, and the store takes new turns.
const (
	// reserveFile is the reserve's file in store.dir.
	reserveFile = "turnstile.reserve"
	// spentFloor is the free space below which the turns running in the
	// reserve must end.
	spentFloor = 1 << 20
	// restartFloor is the free space the embedded JetStream needs to be
	// restarted after a failed write.
	restartFloor = 256 << 10
)

// reserveStage says how much of the reserve the store holds.
type reserveStage uint8

const (
	// reserveWhole: the reserve is held whole (or none is configured and
	// the disk has not filled).
	reserveWhole reserveStage = iota
	// reserveInUse: the disk filled; the reserve's last quarter is held,
	// the rest is the running turns'.
	reserveInUse
	// reserveSpent: the disk filled past the reserve: running turns end.
	reserveSpent
)

// ErrReserveSpent is the failure of [Store.Room] once the disk under the
// embedded file store filled past its reserve: the turns still running
// must end (the last of the reserve holds their last events), and new ones
// are refused until space returns. It wraps [ErrFull], and has the method
// EndsTurns, true, by which a caller that does not import the store tells
// it from other reasons to refuse new turns.
var ErrReserveSpent error = reserveSpentError{}

type reserveSpentError struct{}

func (reserveSpentError) Error() string {
	return "the disk of store.dir filled past its reserve (store.reserve): running turns end"
}

// EndsTurns reports that the turns running must end.
func (reserveSpentError) EndsTurns() bool { return true }

// Unwrap makes it an [ErrFull].
func (reserveSpentError) Unwrap() error { return ErrFull }

// reserve is the reserve's file and what of it is held.
type reserve struct {
	path  string
	size  int64 // store.reserve
	stage reserveStage
	// held is what the file holds now: size, size/4 or 0.
	held int64
}

// last is what the reserve keeps for the last events of the turns
// running when the disk filled.
func (r *reserve) last() int64 { return r.size / 4 }

// take writes the reserve's file whole: size bytes that no filesystem
// compresses away, written and synced, so that their blocks are the
// disk's. A file of that size from an earlier start is kept.
func (r *reserve) take() error {
	if r.size <= 0 {
		return nil
	}
	if fi, err := os.Stat(r.path); err == nil && fi.Size() == r.size && allocated(fi) {
		r.held, r.stage = r.size, reserveWhole
		return nil
	}
	// What the file held is the disk's again if it cannot be held whole,
	// and a disk that would be left with less than minFreeDisk holds none.
	_ = os.Remove(r.path)
	r.held = 0
	if free, ok := diskFree(filepath.Dir(r.path)); ok && free < uint64(r.size)+minFreeDisk {
		return fmt.Errorf("%d bytes free, less than the reserve and %d bytes more", free, minFreeDisk)
	}
	f, err := os.OpenFile(r.path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	// Random bytes from a seeded generator: cheap, and not compressible.
	rng := rand.NewChaCha8([32]byte{'t', 'u', 'r', 'n', 's', 't', 'i', 'l', 'e'})
	_, err = io.CopyN(f, rng, r.size)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(r.path)
		return err
	}
	r.held, r.stage = r.size, reserveWhole
	return nil
}

// allocated reports whether a file's blocks hold its whole size (it is
// not sparse).
func allocated(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return !ok || st.Blocks*512 >= fi.Size()
}

// spend gives the disk what of the reserve the next stage frees: from
// whole to its last quarter, from that to nothing. It returns the stage
// reached.
func (r *reserve) spend() (reserveStage, error) {
	switch {
	case r.stage == reserveWhole && r.held > 0:
		if err := os.Truncate(r.path, r.last()); err != nil {
			return r.stage, err
		}
		r.held, r.stage = r.last(), reserveInUse
	case r.stage == reserveSpent:
	default:
		// The last quarter, or no reserve at all.
		if err := os.Remove(r.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return r.stage, err
		}
		r.held, r.stage = 0, reserveSpent
	}
	return r.stage, nil
}

// newReserve returns the reserve of store.dir dir.
func newReserve(dir string, size int64) *reserve {
	return &reserve{path: filepath.Join(dir, reserveFile), size: size}
}

// takeReserve writes the reserve at start, before the embedded server
// counts the disk's free space; a disk without room for it is logged, and
// the store goes on without one.
func (kp *keeper) takeReserve() {
	if kp.cfg.Mode != ModeEmbedded || kp.cfg.Dir == "" {
		return
	}
	kp.reserve = newReserve(kp.cfg.Dir, kp.cfg.Reserve)
	if err := kp.reserve.take(); err != nil {
		kp.logger.Warn("turn store: no room for the reserve on the disk of store.dir; when the disk fills, running turns end at once",
			"reserve", kp.cfg.Reserve, "dir", kp.cfg.Dir, "error", err)
	}
}
