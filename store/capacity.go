package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"syscall"
	"time"

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

// capacity is the keeper's state.
type capacity struct {
	js   jetstream.JetStream // the keeper's own: s.js as the store opened
	kick chan struct{}       // wakes the keeper; buffered, 1
	done sync.WaitGroup
	// notify orders the calls of the OnRoom functions.
	notify sync.Mutex

	// reserve is the embedded file store's reserve (reserve.go); nil
	// without one. Only the keeper touches it after Open.
	reserve *reserve
	// gate is held (read) by each publish attempt of an append or a
	// record with the embedded file store, and (write) by a restart of its
	// JetStream, which waits for the attempts under way: one made during
	// the restart would get no answer, and, without a message id, could
	// not be made again. writes stops them first (failedwrite.go).
	gate   sync.RWMutex
	writes writes

	mu       sync.Mutex
	usage    Usage
	need     uint64    // the bytes of the largest write refused for room since then
	suspect  bool      // the disk filled, or a write of the embedded server timed out: probe it
	broken   bool      // a write of the embedded server timed out since its last good probe
	warned   time.Time // the last retention warning
	onChange []func(error)
}

// Room reports whether the log can take a new turn now: nil, or an error
// wrapping [ErrFull] that says why not. It does no I/O.
func (s *Store) Room() error {
	s.room.mu.Lock()
	defer s.room.mu.Unlock()
	return s.room.usage.Full
}

// Usage returns the log's size as last read (every keepEvery).
func (s *Store) Usage() Usage {
	s.room.mu.Lock()
	defer s.room.mu.Unlock()
	return s.room.usage
}

// OnRoom calls fn with the outcome of [Store.Room] now, then, on the
// keeper's goroutine, each time it changes, until the store closes. The
// calls are in order: the last one holds the outcome in force.
func (s *Store) OnRoom(fn func(full error)) {
	s.room.notify.Lock()
	defer s.room.notify.Unlock()
	s.room.mu.Lock()
	s.room.onChange = append(s.room.onChange, fn)
	s.room.mu.Unlock()
	fn(s.Room())
}

// tell calls the OnRoom functions with the outcome of Room now.
func (s *Store) tell() {
	s.room.notify.Lock()
	defer s.room.notify.Unlock()
	s.room.mu.Lock()
	fns, full := s.room.onChange, s.room.usage.Full
	s.room.mu.Unlock()
	for _, fn := range fns {
		fn(full)
	}
}

// startKeeper starts the keeper, which Close stops.
func (s *Store) startKeeper() {
	s.room.kick = make(chan struct{}, 1)
	s.room.js = s.js
	s.room.done.Add(1)
	go s.keep()
}

func (s *Store) keep() {
	defer s.room.done.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.closed
		cancel()
	}()
	t := time.NewTicker(keepEvery)
	defer t.Stop()
	for {
		s.keepOnce(ctx)
		// Refused writes wake it at most every kickGap: while the log is
		// full of running runs, their waiting events would keep it busy.
		gap := time.NewTimer(kickGap)
		select {
		case <-s.closed:
			gap.Stop()
			return
		case <-gap.C:
		}
		select {
		case <-s.closed:
			return
		case <-t.C:
		case <-s.room.kick:
		}
	}
}

// noteWrite is told the outcome of each publish to the log: a write
// refused for room starts a pass of the keeper, which makes room for it,
// and refuses new turns when it cannot.
func (s *Store) noteWrite(msg *nats.Msg, err error) {
	if err == nil || s.room.kick == nil {
		return
	}
	full := roomError(err)
	if full == nil && !(s.srv != nil && errors.Is(err, context.DeadlineExceeded)) {
		return
	}
	s.room.mu.Lock()
	if full != nil {
		// What JetStream counts: subject, headers, data, and its own
		// bytes per record.
		need := uint64(len(msg.Subject) + len(msg.Data) + 64)
		for k, vs := range msg.Header {
			for _, v := range vs {
				need += uint64(len(k) + len(v) + 4)
			}
		}
		s.room.need = max(s.room.need, need)
	}
	// The embedded server answers no write after a failed one (a full
	// disk): the keeper finds out.
	s.room.suspect = s.room.suspect || s.srv != nil
	s.room.broken = s.room.broken || s.srv != nil
	s.room.mu.Unlock()
	select {
	case s.room.kick <- struct{}{}:
	default:
	}
}

// waitRoom reports whether a publish to subj that failed with err is made
// again once the keeper (woken by noteWrite) made room: a record refused
// because the log is full. A running run's event frame is, for as long as
// its publish may take (backpressure on the turn); a new run's record is
// while the keeper has not found the log full of running runs, which
// refuses the turn.
func (s *Store) waitRoom(subj string, err error) bool {
	if roomError(err) == nil {
		return false
	}
	return strings.HasSuffix(subj, ".ev") || s.Room() == nil
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
func (s *Store) keepOnce(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	full := s.checkDisk(ctx)
	info, err := s.stream.Info(ctx)
	if err != nil {
		if ctx.Err() == nil && !isClosed(s.closed) {
			s.logger.Warn("turn store: cannot read the log's size", "error", err)
		}
		return
	}
	limit := s.limit(ctx, info.State.Bytes)
	bytes := info.State.Bytes
	s.room.mu.Lock()
	need := s.room.need
	s.room.need = 0
	s.room.mu.Unlock()
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
	maxTurns := uint64(max(s.cfg.MaxTurns, 0))
	if maxTurns > 0 && float64(turns) > highWater*float64(maxTurns) {
		goal.turns = uint64(lowWater * float64(maxTurns))
	}
	var (
		evicted   int
		exhausted bool
	)
	if goal.unmet(bytes, turns) {
		evicted, exhausted = s.evict(ctx, info.State.FirstSeq, goal, bytes, turns)
		if evicted > 0 {
			if info, err = s.stream.Info(ctx); err != nil {
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
	s.room.mu.Lock()
	s.room.usage.Evicted += uint64(evicted)
	was := s.room.usage.Full
	s.room.usage = Usage{Bytes: bytes, Limit: limit, Oldest: oldest, Turns: turns, Evicted: s.room.usage.Evicted, Full: full}
	warn := evicted > 0 && !oldest.IsZero() && time.Since(oldest) < s.cfg.Retention && time.Since(s.room.warned) >= warnEvery
	if warn {
		s.room.warned = time.Now()
	}
	s.room.mu.Unlock()
	if evicted > 0 {
		s.logger.Info("turn store: removed the oldest finished runs to make room", "runs", evicted, "bytes", bytes, "limit", limit, "turns", turns, "max_turns", s.cfg.MaxTurns)
	}
	if warn {
		s.logger.Warn("turn store: retention is shorter than configured: the log is full, and the oldest run kept is younger than store.retention; raise store.max_bytes or store.max_turns, or lower store.retention",
			"retention", s.cfg.Retention, "oldest_kept", time.Since(oldest).Round(time.Second), "max_bytes", s.cfg.MaxBytes, "limit", limit, "max_turns", s.cfg.MaxTurns, "turns", turns)
	}
	switch {
	case (was == nil) != (full == nil):
		if full != nil {
			s.logger.Warn("turn store: full; new turns are refused until space returns", "reason", full.Error())
		} else {
			s.logger.Info("turn store: space returned; new turns are taken again")
		}
		s.tell()
	case errors.Is(was, ErrReserveSpent) != errors.Is(full, ErrReserveSpent):
		// Still full, but the running turns must end now, or need not.
		s.tell()
	}
}

// limit returns what the log may hold: store.max_bytes, or what
// JetStream's storage limit leaves it (the log's bytes plus what may still
// be stored: the account's limit, or the embedded server's own) when that
// is less; 0 is no bound.
func (s *Store) limit(ctx context.Context, held uint64) uint64 {
	var limit uint64
	if s.cfg.MaxBytes > 0 {
		limit = uint64(s.cfg.MaxBytes)
	}
	ai, err := s.room.js.AccountInfo(ctx)
	if err != nil {
		return limit
	}
	memory := s.cfg.Mode == ModeEmbedded && s.cfg.Dir == ""
	used, most := ai.Store, ai.Limits.MaxStore
	if memory {
		used, most = ai.Memory, ai.Limits.MaxMemory
	}
	if most <= 0 && s.srv != nil {
		if cfg := s.srv.JetStreamConfig(); cfg != nil {
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
func (s *Store) checkDisk(ctx context.Context) error {
	if s.srv == nil || s.cfg.Dir == "" {
		return nil
	}
	free, ok := diskFree(s.cfg.Dir)
	if !ok {
		return nil
	}
	werr := s.writeFailure()
	failed := strings.Contains(werr, "no space left")
	if werr != "" {
		// Its publishes under way get no answer: stop them.
		s.room.writes.halt()
	}
	s.room.mu.Lock()
	if free < minFreeDisk || failed {
		s.room.suspect = true
	}
	s.room.mu.Unlock()

	r := s.room.reserve
	if r == nil {
		r = newReserve(s.cfg.Dir, 0)
		s.room.reserve = r
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
			s.logger.Error("turn store: cannot release the reserve", "error", err)
		}
		switch stage {
		case reserveInUse:
			s.logger.Warn("turn store: the disk of store.dir is full; new turns are refused, running turns go on in the reserve",
				"free", free, "released", r.size-r.held)
		case reserveSpent:
			s.logger.Error("turn store: the disk of store.dir filled past the reserve; the turns still running end, their last events in what is left",
				"free", free, "released", r.last())
		}
		free, _ = diskFree(s.cfg.Dir)
	}
	s.room.mu.Lock()
	// A server that failed a write is restarted as soon as it has room to
	// take writes; one whose write timed out is probed then, and one that
	// may have failed a write unseen (the disk filled) once the disk has
	// room again.
	probe := werr == "" && (s.room.broken && free >= restartFloor || s.room.suspect && free >= minFreeDisk)
	s.room.mu.Unlock()
	restart := werr != "" && free >= restartFloor
	if probe {
		if err := s.probe(ctx); err != nil {
			s.logger.Warn("turn store: the embedded server takes no writes", "error", err)
			restart = true
		}
	}
	if restart {
		s.logger.Warn("turn store: the embedded server takes no writes since one failed; restarting its JetStream", "error", werr)
		s.room.writes.halt()
		err := s.restartJetStream()
		if err == nil {
			err = s.probe(ctx)
		}
		if err != nil {
			// Its publishes wait (up to their own bound) for the next pass.
			s.logger.Error("turn store: cannot restart the embedded JetStream", "error", err)
			return fmt.Errorf("%w: the embedded server takes no writes: %w", ErrFull, err)
		}
		s.logger.Info("turn store: the embedded JetStream was restarted and takes writes again")
	}
	if probe || restart {
		s.room.writes.resume()
		s.room.mu.Lock()
		s.room.broken = false
		s.room.suspect = free < minFreeDisk
		s.room.mu.Unlock()
	}
	// Space returned: the reserve is written whole again (the file holds
	// r.held of it now), or, on a disk without room for all of it, the
	// store takes turns again with what it holds.
	if werr == "" && r.held < r.size && free+uint64(r.held) >= uint64(r.size)+minFreeDisk {
		if err := r.take(); err != nil {
			s.logger.Warn("turn store: cannot write the reserve again", "error", err)
		} else {
			s.logger.Info("turn store: the disk of store.dir has room again; the reserve is held whole", "reserve", r.size)
			free, _ = diskFree(s.cfg.Dir)
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
func (s *Store) probe(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := s.room.js.PublishMsg(pctx, &nats.Msg{Subject: probeSubject, Data: []byte("probe")}); err != nil {
		return err
	}
	return s.stream.Purge(pctx, jetstream.WithPurgeSubject(probeSubject))
}

// restartJetStream restarts the embedded server's JetStream, which opens
// the stream's files anew: a file store that failed a write (its disk was
// full) refuses every later one until then.
func (s *Store) restartJetStream() error {
	// No publish of an append or a record is under way meanwhile: one
	// would get no answer (see capacity.gate).
	s.room.gate.Lock()
	defer s.room.gate.Unlock()
	cfg := s.srv.JetStreamConfig()
	if cfg == nil {
		return errors.New("JetStream is not enabled")
	}
	if err := s.srv.ShutdownJetStream(); err != nil {
		return err
	}
	// EnableJetStream places its directory under the one it is given.
	cfg.StoreDir = s.cfg.Dir
	if err := s.srv.EnableJetStream(cfg); err != nil {
		return err
	}
	// The lease bucket was in memory (see dropFileLeases): make it again.
	// It stays empty: the embedded store's runs are held in the process,
	// not by leases (see [Store.local]).
	ctx, cancel := context.WithTimeout(context.Background(), setUpTry)
	defer cancel()
	_, err := s.js.CreateOrUpdateKeyValue(ctx, s.leaseCfg)
	return err
}

// noRoomToStart explains a stream JetStream refused for its size: the
// embedded server takes up to 75% of the disk's free space when it starts,
// and refuses a stream whose max_bytes is larger.
func (s *Store) noRoomToStart(err error) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10047 && apiErr.ErrorCode != 10023 {
		return err
	}
	if s.srv != nil {
		var most int64
		if cfg := s.srv.JetStreamConfig(); cfg != nil {
			most = cfg.MaxStore
			if s.cfg.Dir == "" {
				most = cfg.MaxMemory
			}
		}
		where := "the disk of store.dir (" + s.cfg.Dir + ")"
		if s.cfg.Dir == "" {
			where = "memory"
		}
		return fmt.Errorf("store.max_bytes (%d bytes) is more than the embedded JetStream may use on %s: %d bytes (three quarters of what was free when it started); set store.max_bytes to at most that, free space, or point store.dir at a larger disk: %w",
			s.cfg.MaxBytes, where, most, err)
	}
	return fmt.Errorf("store.max_bytes (%d bytes) is more than the NATS account or servers may store (their JetStream max_file_store or the account's limit); lower store.max_bytes or raise theirs: %w", s.cfg.MaxBytes, err)
}
