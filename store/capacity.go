package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The log's capacity. The stream refuses a record that does not fit
// (DiscardNew) rather than drop the oldest, which could belong to a run
// still going: no bound of the store ever removes a running run's
// records. Size-based retention is the keeper's job instead: every
// keepEvery, or at once after a write was refused, it reads the log's size
// and, above highWater of its limit, purges the oldest runs that are not
// running (see running) until the log is under lowWater, or has room for
// the record refused, looking at no more than maxExamined runs per pass. While the
// log is still above highWater after that, or the disk or JetStream cannot
// take more, [Store.Room] refuses new turns; running ones go on in the
// room left above the mark. The runs the log holds are bounded the same
// way ([Config.MaxTurns]): each costs the stream's index of subjects
// memory as long as it is kept (nats-server's, in the embedded store's
// process), whatever its size. Above highWater of the bound the keeper
// purges the oldest finished runs down to lowWater of it, and when only
// running runs are left at the bound, new turns are refused.
const (
	highWater   = 0.90
	lowWater    = 0.80
	keepEvery   = time.Second
	kickGap     = 50 * time.Millisecond
	maxExamined = 512
	// minFreeDisk is the free space below which the embedded file store
	// takes no new turn: what running turns may still write.
	minFreeDisk = 16 << 20
	// warnEvery spaces the warnings that retention is shorter than
	// configured.
	warnEvery = 10 * time.Minute
)

// ErrFull is the failure of [Store.Room] when the log cannot take a new
// turn: it is full of running turns, or its disk or JetStream's storage
// is. It passes when space returns.
var ErrFull = errors.New("store: the turn log is full")

// Usage is the log's size as the keeper last read it.
type Usage struct {
	// Bytes is what the log holds, every run's.
	Bytes uint64
	// Limit is what it may hold: store.max_bytes, or less when JetStream's
	// own storage limit leaves less; 0 when neither bounds it.
	Limit uint64
	// Oldest is when the oldest record kept was written; zero when the log
	// is empty.
	Oldest time.Time
	// Turns is how many runs the log holds: half its subjects, a run's
	// records and its events being two.
	Turns uint64
	// Evicted counts the runs the keeper removed since the store opened.
	Evicted uint64
	// Full is the reason new turns are refused, nil when they are not.
	Full error
}

// Room reports whether the log can take a new turn now: nil, or an error
// wrapping [ErrFull] that says why not. It does no I/O.
func (s *Store) Room() error { return s.keeper.room() }

// Usage returns the log's size as last read (every keepEvery).
func (s *Store) Usage() Usage { return s.keeper.used() }

// OnRoom calls fn with the outcome of [Store.Room] now, then, on the
// keeper's goroutine, each time it changes, until the store closes. The
// calls are in order: the last one holds the outcome in force.
func (s *Store) OnRoom(fn func(full error)) { s.keeper.onRoom(fn) }

// keeper keeps the log within its bounds and the store able to write: it
// owns the log's capacity (the usage it last read, the room it refuses new
// turns for, the OnRoom functions told when that changes), the embedded
// file store's reserve (reserve.go) and what stops and lets go the
// publishes around a restart of the embedded JetStream after a failed
// write (failedwrite.go), and the eviction of finished runs (evict.go).
// Its goroutine ([keeper.keep]) makes a pass every keepEvery, or at once
// when a write was refused ([keeper.noteWrite]); Close stops it.
type keeper struct {
	cfg    Config
	logger *slog.Logger
	closed <-chan struct{} // the store's: closed by Close

	// Set by start, before the keeper's goroutine, and read-only after.
	srv    *natsserver.Server  // the embedded server; nil with a NATS cluster
	js     jetstream.JetStream // the keeper's own: the store's as it opened
	stream jetstream.Stream    // the log
	owners owners              // who holds the runs: see [keeper.evict]

	kick chan struct{} // wakes the keeper; buffered, 1
	done sync.WaitGroup
	// notify orders the calls of the OnRoom functions.
	notify sync.Mutex

	// reserve is the embedded file store's reserve (reserve.go); nil
	// without one. Only the keeper's goroutine touches it after Open.
	reserve *reserve
	// gate is held (read) by each publish attempt of an append or a
	// record with the embedded file store, and (write) by a restart of its
	// JetStream, which waits for the attempts under way: one made during
	// the restart would get no answer, and, without a message id, could
	// not be made again. writes stops them first (failedwrite.go); it has
	// its own lock.
	gate   sync.RWMutex
	writes writes

	// mu guards the fields below it.
	mu       sync.Mutex
	usage    Usage
	need     uint64    // the bytes of the largest write refused for room since then
	suspect  bool      // the disk filled, or a write of the embedded server timed out: probe it
	broken   bool      // a write of the embedded server timed out since its last good probe
	warned   time.Time // the last retention warning
	onChange []func(error)
}

// owners is what the keeper asks of the runs' ownership.
type owners interface {
	// running reports whether run k may still be written to: the keeper
	// evicts no run that is.
	running(ctx context.Context, k runKey) (bool, error)
	// remakeLeases makes the lease bucket again, in memory, after a
	// restart of the embedded JetStream.
	remakeLeases(ctx context.Context) error
}

// newKeeper returns the keeper of a store of cfg, which closed's close
// stops; [keeper.start] starts it.
func newKeeper(cfg Config, logger *slog.Logger, closed <-chan struct{}) *keeper {
	return &keeper{cfg: cfg, logger: logger, closed: closed}
}

// room reports whether the log can take a new turn now: see [Store.Room].
func (kp *keeper) room() error {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	return kp.usage.Full
}

// used returns the log's size as last read: see [Store.Usage].
func (kp *keeper) used() Usage {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	return kp.usage
}

// onRoom adds fn to the functions told the outcome of room: see
// [Store.OnRoom].
func (kp *keeper) onRoom(fn func(full error)) {
	kp.notify.Lock()
	defer kp.notify.Unlock()
	kp.mu.Lock()
	kp.onChange = append(kp.onChange, fn)
	kp.mu.Unlock()
	fn(kp.room())
}

// tell calls the OnRoom functions with the outcome of Room now.
func (kp *keeper) tell() {
	kp.notify.Lock()
	defer kp.notify.Unlock()
	kp.mu.Lock()
	fns, full := kp.onChange, kp.usage.Full
	kp.mu.Unlock()
	for _, fn := range fns {
		fn(full)
	}
}

// start starts the keeper's goroutine, which Close stops: srv is the
// embedded server (nil with a NATS cluster), js and stream the store's as
// it opened.
func (kp *keeper) start(srv *natsserver.Server, js jetstream.JetStream, stream jetstream.Stream, o owners) {
	kp.srv, kp.js, kp.stream, kp.owners = srv, js, stream, o
	kp.kick = make(chan struct{}, 1)
	kp.done.Add(1)
	go kp.keep()
}

// wait waits until the keeper's goroutine ended, once the store's closed
// is closed.
func (kp *keeper) wait() { kp.done.Wait() }

func (kp *keeper) keep() {
	defer kp.done.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-kp.closed
		cancel()
	}()
	t := time.NewTicker(keepEvery)
	defer t.Stop()
	for {
		kp.keepOnce(ctx)
		// Refused writes wake it at most every kickGap: while the log is
		// full of running runs, their waiting events would keep it busy.
		gap := time.NewTimer(kickGap)
		select {
		case <-kp.closed:
			gap.Stop()
			return
		case <-gap.C:
		}
		select {
		case <-kp.closed:
			return
		case <-t.C:
		case <-kp.kick:
		}
	}
}

// noteWrite is told the outcome of each publish to the log, msg with
// size bytes of data (a frame's, which is not kept in msg between
// attempts: see [outFrame]): a write refused for room starts a pass of the keeper, which makes room for it,
// and refuses new turns when it cannot.
func (kp *keeper) noteWrite(msg *nats.Msg, size int, err error) {
	if err == nil || kp.kick == nil {
		return
	}
	full := roomError(err)
	if full == nil && !(kp.srv != nil && errors.Is(err, context.DeadlineExceeded)) {
		return
	}
	kp.mu.Lock()
	if full != nil {
		// What JetStream counts: subject, headers, data, and its own
		// bytes per record.
		need := uint64(len(msg.Subject) + size + 64)
		for k, vs := range msg.Header {
			for _, v := range vs {
				need += uint64(len(k) + len(v) + 4)
			}
		}
		kp.need = max(kp.need, need)
	}
	// The embedded server answers no write after a failed one (a full
	// disk): the keeper finds out.
	kp.suspect = kp.suspect || kp.srv != nil
	kp.broken = kp.broken || kp.srv != nil
	kp.mu.Unlock()
	select {
	case kp.kick <- struct{}{}:
	default:
	}
}

// waitRoom reports whether a publish to subj that failed with err is made
// again once the keeper (woken by noteWrite) made room: a record refused
// because the log is full. A running run's event frame is, for as long as
// its publish may take (backpressure on the turn); a new run's record is
// while the keeper has not found the log full of running runs, which
// refuses the turn.
func (kp *keeper) waitRoom(subj string, err error) bool {
	if roomError(err) == nil {
		return false
	}
	return strings.HasSuffix(subj, ".ev") || kp.room() == nil
}

// roomError returns the ErrFull of a write JetStream refused for room,
// nil for any other failure.
func roomError(err error) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return nil
	}
	switch {
	case apiErr.ErrorCode == 10077 && strings.Contains(apiErr.Description, "maximum bytes"):
		return fmt.Errorf("%w: it holds store.max_bytes", ErrFull) // 10077: stream store failed
	case apiErr.ErrorCode == 10023, apiErr.ErrorCode == 10047: // insufficient resources
		return fmt.Errorf("%w: JetStream has no storage left for it", ErrFull)
	case diskFull(err):
		return fmt.Errorf("%w: its disk is full", ErrFull)
	}
	return nil
}

// diskFull reports whether JetStream refused a write because the disk
// under its files is full.
func diskFull(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && strings.Contains(apiErr.Description, "no space left")
}

// keepOnce is one pass of the keeper.
func (kp *keeper) keepOnce(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	full := kp.checkDisk(ctx)
	info, err := kp.stream.Info(ctx)
	if err != nil {
		if ctx.Err() == nil && !isClosed(kp.closed) {
			kp.logger.Warn("turn store: cannot read the log's size", "error", err)
		}
		return
	}
	limit := kp.limit(ctx, info.State.Bytes)
	bytes := info.State.Bytes
	kp.mu.Lock()
	need := kp.need
	kp.need = 0
	kp.mu.Unlock()
	target := uint64(lowWater * float64(limit))
	if need > 0 && limit > need {
		// A record was refused: room for it, below the low-water mark.
		target = min(target, limit-need)
	}
	// The bound on the runs held: none below highWater of it.
	turns := runsOf(info.State.NumSubjects)
	goal := evictGoal{bytes: target, turns: math.MaxUint64}
	if limit == 0 || float64(bytes) <= highWater*float64(limit) && (need == 0 || bytes <= target) {
		goal.bytes = math.MaxUint64
	}
	maxTurns := uint64(max(kp.cfg.MaxTurns, 0))
	if maxTurns > 0 && float64(turns) > highWater*float64(maxTurns) {
		goal.turns = uint64(lowWater * float64(maxTurns))
	}
	var (
		evicted   int
		exhausted bool
	)
	if goal.unmet(bytes, turns) {
		evicted, exhausted = kp.evict(ctx, info.State.FirstSeq, goal, bytes, turns)
		if evicted > 0 {
			if info, err = kp.stream.Info(ctx); err != nil {
				return
			}
			bytes, turns = info.State.Bytes, runsOf(info.State.NumSubjects)
		}
	}
	if full == nil && limit > 0 && (float64(bytes) >= highWater*float64(limit) || bytes+need > limit) {
		full = fmt.Errorf("%w: %d of %d bytes held by turns still running", ErrFull, bytes, limit)
	}
	if full == nil && maxTurns > 0 && turns >= maxTurns && exhausted {
		// Every run left is running: none can go.
		full = fmt.Errorf("%w: %d turns still running hold store.max_turns (%d)", ErrFull, turns, maxTurns)
	}
	var oldest time.Time
	if info.State.Msgs > 0 {
		oldest = info.State.FirstTime
	}
	kp.mu.Lock()
	kp.usage.Evicted += uint64(evicted)
	was := kp.usage.Full
	kp.usage = Usage{Bytes: bytes, Limit: limit, Oldest: oldest, Turns: turns, Evicted: kp.usage.Evicted, Full: full}
	warn := evicted > 0 && !oldest.IsZero() && time.Since(oldest) < kp.cfg.Retention && time.Since(kp.warned) >= warnEvery
	if warn {
		kp.warned = time.Now()
	}
	kp.mu.Unlock()
	if evicted > 0 {
		kp.logger.Info("turn store: removed the oldest finished runs to make room", "runs", evicted, "bytes", bytes, "limit", limit, "turns", turns, "max_turns", kp.cfg.MaxTurns)
	}
	if warn {
		kp.logger.Warn("turn store: retention is shorter than configured: the log is full, and the oldest run kept is younger than store.retention; raise store.max_bytes or store.max_turns, or lower store.retention",
			"retention", kp.cfg.Retention, "oldest_kept", time.Since(oldest).Round(time.Second), "max_bytes", kp.cfg.MaxBytes, "limit", limit, "max_turns", kp.cfg.MaxTurns, "turns", turns)
	}
	switch {
	case (was == nil) != (full == nil):
		if full != nil {
			kp.logger.Warn("turn store: full; new turns are refused until space returns", "reason", full.Error())
		} else {
			kp.logger.Info("turn store: space returned; new turns are taken again")
		}
		kp.tell()
	case errors.Is(was, ErrReserveSpent) != errors.Is(full, ErrReserveSpent):
		// Still full, but the running turns must end now, or need not.
		kp.tell()
	}
}

// limit returns what the log may hold: store.max_bytes, or what
// JetStream's storage limit leaves it (the log's bytes plus what may still
// be stored: the account's limit, or the embedded server's own) when that
// is less; 0 is no bound.
func (kp *keeper) limit(ctx context.Context, held uint64) uint64 {
	var limit uint64
	if kp.cfg.MaxBytes > 0 {
		limit = uint64(kp.cfg.MaxBytes)
	}
	ai, err := kp.js.AccountInfo(ctx)
	if err != nil {
		return limit
	}
	memory := kp.cfg.Mode == ModeEmbedded && kp.cfg.Dir == ""
	used, most := ai.Store, ai.Limits.MaxStore
	if memory {
		used, most = ai.Memory, ai.Limits.MaxMemory
	}
	if most <= 0 && kp.srv != nil {
		if cfg := kp.srv.JetStreamConfig(); cfg != nil {
			most = cfg.MaxStore
			if memory {
				most = cfg.MaxMemory
			}
		}
	}
	if most <= 0 {
		return limit
	}
	var left uint64
	if uint64(most) > used {
		left = uint64(most) - used
	}
	if account := held + left; limit == 0 || account < limit {
		return account
	}
	return limit
}

// noRoomToStart explains a stream JetStream refused for its size: the
// embedded server takes up to 75% of the disk's free space when it starts,
// and refuses a stream whose max_bytes is larger. srv is the embedded
// server, nil with a NATS cluster.
func noRoomToStart(err error, cfg Config, srv *natsserver.Server) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10047 && apiErr.ErrorCode != 10023 {
		return err
	}
	if srv != nil {
		var most int64
		if js := srv.JetStreamConfig(); js != nil {
			most = js.MaxStore
			if cfg.Dir == "" {
				most = js.MaxMemory
			}
		}
		where := "the disk of store.dir (" + cfg.Dir + ")"
		if cfg.Dir == "" {
			where = "memory"
		}
		return fmt.Errorf("store.max_bytes (%d bytes) is more than the embedded JetStream may use on %s: %d bytes (three quarters of what was free when it started); set store.max_bytes to at most that, free space, or point store.dir at a larger disk: %w",
			cfg.MaxBytes, where, most, err)
	}
	return fmt.Errorf("store.max_bytes (%d bytes) is more than the NATS account or servers may store (their JetStream max_file_store or the account's limit); lower store.max_bytes or raise theirs: %w", cfg.MaxBytes, err)
}
