package admission

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// LimitSharer keeps counters every replica of a deployment shares
// (package store keeps them in a NATS key-value bucket): a total counted
// in a window (a UTC day "2006-01-02" or month "2006-01", or "" for all
// time), when it was last written, and a revision that grows with every
// change. The server keeps its keys' limits in them ([Keys.Share]).
type LimitSharer interface {
	// LoadCounter returns the counter name; revision 0 when none is stored.
	LoadCounter(ctx context.Context, name string) (window string, total int64, at time.Time, revision uint64, err error)
	// SwapCounter stores the counter name if its revision is still revision
	// (0: none is stored), and returns the new revision; swapped is false,
	// with no error, when another replica changed it first.
	SwapCounter(ctx context.Context, name, window string, total int64, revision uint64) (newRevision uint64, swapped bool, err error)
	// WatchCounters calls fn with every counter stored, then with each
	// change, until ctx is done.
	WatchCounters(ctx context.Context, fn func(name, window string, total int64, at time.Time, revision uint64)) error
	// PutGauge stores this replica's own counter name for ttl, after which
	// it is gone unless written again. It must not block.
	PutGauge(name string, value int64, ttl time.Duration)
}

// Sharing's timing: a replica's running turns are refreshed every
// runningBeat while it runs any, and another replica's count older than
// runningStale (the replica stopped) is not counted; it expires from the
// store then too, so the bucket holds the counts of live replicas only. At most maxLimitSwaps
// compare-and-swaps are tried per counter and share; what is left is
// shared at the next.
const (
	runningBeat   = time.Second
	runningStale  = 5 * time.Second
	maxLimitSwaps = 5
	nameSep       = "\x1f"
)

// sharedCounter is one limit of a key as the replicas share it: the use
// this replica has not shared yet (pending), and the shared total it has
// applied to its own limiter (known, at revision rev). Its fields but io
// and the constants are guarded by its keyLimiter's mutex.
type sharedCounter struct {
	name string
	// window names the window t is in; nil: one window of all time.
	window func(t time.Time) string
	// apply takes another replica's use from the key's own limiter.
	apply func(now time.Time, n int64)
	// near reports whether the key has used half its limit or more, as
	// this replica knows: then its use is shared at once, not at the next
	// tick. k.mu is held.
	near func(now time.Time) bool
	// kick asks the share loop to share now; it never blocks.
	kick chan struct{}
	// io is held while the counter is shared, and while a change of it is
	// applied, so that this replica's own write is never taken for
	// another's.
	io sync.Mutex

	pending, known int64
	pendWindow     string
	knownWindow    string
	rev            uint64
}

func (c *sharedCounter) windowAt(t time.Time) string {
	if c.window == nil {
		return ""
	}
	return c.window(t)
}

// add counts n more used by this replica in window, to be shared: at
// the next tick, or at once when the key nears its limit. k.mu is held.
func (c *sharedCounter) add(now time.Time, n int64, window string) {
	if c.pendWindow != window {
		c.pending, c.pendWindow = 0, window // the previous window is over
	}
	c.pending += n
	if c.near != nil && c.near(now) {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
}

// observe applies a shared total seen at revision rev: the part of it
// this replica has not applied yet is other replicas' use; in a new day
// or month, all of it. k.mu is held.
func (c *sharedCounter) observe(now time.Time, window string, total int64, rev uint64) {
	if rev <= c.rev {
		return
	}
	c.rev = rev
	cur := c.windowAt(now)
	if window != cur {
		return // another window: its total does not count now
	}
	if c.knownWindow != cur {
		c.known, c.knownWindow = 0, cur
	}
	if total > c.known {
		c.apply(now, total-c.known)
		c.known = total
	}
}

// baseline starts c from the shared counter as it is when this replica
// starts sharing: the day's or month's use so far is applied to the
// key's limiter; an all-time total (tokens, turns) is not, since when it
// was used is not known, and only what is added to it from now on is.
func (k *keyLimiter) baseline(ctx context.Context, sh LimitSharer, c *sharedCounter) error {
	window, total, _, rev, err := sh.LoadCounter(ctx, c.name)
	if err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if c.window == nil {
		c.known, c.rev = total, rev
		return nil
	}
	c.observe(k.now(), window, total, rev)
	return nil
}

// keyShare is what a key's limiter shares with the other replicas.
type keyShare struct {
	replica  string
	counters []*sharedCounter
	running  *sharedCounter // this replica's running turns, a gauge
	// others are the other replicas' running turns, by replica, and when
	// each said so. Guarded by the keyLimiter's mutex.
	others   map[string]replicaRunning
	lastPut  int64
	lastBeat time.Time
	// heldTokens and heldCost name this replica's gauges of what the
	// key's running turns here hold for their model calls (reserve.go);
	// "" for a limit the key does not have. othersHeld are the other
	// replicas', by replica; lastHeld what this one last put, and when.
	// kick is the share loop's. Guarded by the keyLimiter's mutex.
	heldTokens, heldCost string
	othersHeldBy         map[string]replicaHeld
	lastHeld             hold
	lastHeldBeat         time.Time
	// sh is where this replica puts its gauges.
	sh LimitSharer
}

// replicaHeld is what another replica's running turns of a key hold, as
// it last said, and when.
type replicaHeld struct {
	hold
	tokensAt, costAt time.Time
}

type replicaRunning struct {
	n  int64
	at time.Time
}

// othersRunning returns the turns the other replicas say the key runs.
// k.mu is held.
func (s *keyShare) othersRunning(now time.Time) int {
	if s == nil {
		return 0
	}
	var n int64
	for replica, r := range s.others {
		if now.Sub(r.at) >= runningStale {
			delete(s.others, replica) // stopped: its count expired
			continue
		}
		n += r.n
	}
	return int(n)
}

// othersHeld returns what the other replicas' running turns of the key
// hold for their model calls. k.mu is held.
func (s *keyShare) othersHeld(now time.Time) hold {
	if s == nil {
		return hold{}
	}
	var h hold
	for replica, r := range s.othersHeldBy {
		fresh := false
		if now.Sub(r.tokensAt) < runningStale {
			h.tokens += r.tokens
			fresh = true
		}
		if now.Sub(r.costAt) < runningStale {
			h.nanos += r.nanos
			fresh = true
		}
		if !fresh {
			delete(s.othersHeldBy, replica) // stopped: its gauges expired
		}
	}
	return h
}

// heldChanged says what the key's running turns here hold changed: once
// the key has used and holds half a limit or more, as this replica knows,
// it is shared at once (a publish that does not wait), not at the next
// tick. k.mu is held.
func (s *keyShare) heldChanged(now time.Time, k *keyLimiter) {
	if s == nil || s.heldTokens == "" && s.heldCost == "" {
		return
	}
	held := k.held
	o := s.othersHeld(now)
	held.tokens, held.nanos = held.tokens+o.tokens, held.nanos+o.nanos
	near := false
	for _, w := range k.budgets {
		near = near || w.spent+held.nanos >= w.max/2
	}
	for _, lim := range []*rate.Limiter{k.tokMin, k.tokDay} {
		near = near || lim != nil && lim.TokensAt(now)-float64(held.tokens) <= float64(lim.Burst())/2
	}
	if near {
		k.putHeld(now)
	}
}

func dayWindow(t time.Time) string   { return t.UTC().Format("2006-01-02") }
func monthWindow(t time.Time) string { return t.UTC().Format("2006-01") }

// takeAt takes n from a token bucket at now, into debt if need be, a
// burst at a time.
func takeAt(lim *rate.Limiter, now time.Time, n int64) {
	if lim == nil || lim.Burst() == 0 {
		return
	}
	for left := n; left > 0; {
		take := min(left, int64(lim.Burst()))
		lim.ReserveN(now, int(take))
		left -= take
	}
}

// halfSpent reports whether a token bucket holds half its size or less.
func halfSpent(lim *rate.Limiter, now time.Time) bool {
	return lim != nil && lim.TokensAt(now) <= float64(lim.Burst())/2
}

// newKeyShare returns what the key k shares, nil when it has no limit to
// share (stored_bytes is each replica's own: it bounds its store's use).
// kick is the share loop's.
func newKeyShare(k *keyLimiter, replica string, kick chan struct{}) *keyShare {
	s := &keyShare{replica: replica, others: map[string]replicaRunning{}}
	base := k.name + nameSep
	if k.turns != nil {
		s.counters = append(s.counters, &sharedCounter{name: base + "turns", kick: kick,
			apply: func(now time.Time, n int64) { takeAt(k.turns, now, n) },
			near:  func(now time.Time) bool { return halfSpent(k.turns, now) }})
	}
	if k.tokMin != nil || k.tokDay != nil {
		s.counters = append(s.counters, &sharedCounter{name: base + "tokens", kick: kick,
			apply: func(now time.Time, n int64) {
				takeAt(k.tokMin, now, n)
				takeAt(k.tokDay, now, n)
			},
			near: func(now time.Time) bool { return halfSpent(k.tokMin, now) || halfSpent(k.tokDay, now) }})
	}
	for _, w := range k.budgets {
		window := dayWindow
		if w.period == "month" {
			window = monthWindow
		}
		s.counters = append(s.counters, &sharedCounter{name: base + w.limit, window: window, kick: kick,
			apply: func(now time.Time, n int64) {
				w.roll(now)
				w.spent += n
			},
			near: func(time.Time) bool { return w.spent >= w.max/2 }})
	}
	if k.limits.ConcurrentTurns != nil {
		s.running = &sharedCounter{name: base + "running" + nameSep + replica}
	}
	if k.tokMin != nil || k.tokDay != nil {
		s.heldTokens = base + heldPrefix + "tokens" + nameSep + replica
	}
	if len(k.budgets) > 0 {
		s.heldCost = base + heldPrefix + "cost" + nameSep + replica
	}
	if len(s.counters) == 0 && s.running == nil {
		return nil
	}
	s.othersHeldBy = map[string]replicaHeld{}
	return s
}

// heldPrefix starts the part of a gauge's name, after the key's, that says
// it is what a replica's turns of the key hold.
const heldPrefix = "held" + nameSep

// counter returns the key's shared counter of limit, nil when not shared.
func (s *keyShare) counter(limit string) *sharedCounter {
	if s == nil {
		return nil
	}
	for _, c := range s.counters {
		if strings.HasSuffix(c.name, nameSep+limit) {
			return c
		}
	}
	return nil
}

// Share shares the client keys' limits with the other replicas
// through sh until ctx is done: turns_per_minute, tokens_per_minute and
// tokens_per_day, cost_per_day and cost_per_month, and concurrent_turns.
// Each replica admits and counts turns at once from what it knows, as
// without sharing, and every interval adds what its keys used to the
// shared counters with compare-and-swap; every change of a counter, its
// own or another replica's, reaches each replica's limiters through the
// watch. Once a key has used half a limit, as a replica knows, that
// replica shares its use of it at once instead of at the next tick. No
// turn waits for the store: a replica's view lags the others' use by a
// share's round trips and the watch's delay (up to an interval far from
// the limits), which is how far the replicas together can go over a
// limit (docs/security.md). replica names this replica among them.
func (a *Keys) Share(ctx context.Context, sh LimitSharer, replica string, interval time.Duration) error {
	if a == nil {
		return nil
	}
	byName := map[string]struct {
		k *keyLimiter
		c *sharedCounter
	}{}
	var keys []*keyLimiter
	kick := make(chan struct{}, 1)
	for _, key := range a.keys {
		k := key.limiter
		ks := newKeyShare(k, replica, kick)
		if ks == nil {
			continue
		}
		ks.sh = sh
		for _, c := range ks.counters {
			if err := k.baseline(ctx, sh, c); err != nil {
				return fmt.Errorf("server: load shared limits: %w", err)
			}
		}
		k.mu.Lock()
		k.share = ks
		k.mu.Unlock()
		keys = append(keys, k)
		for _, c := range ks.counters {
			byName[c.name] = struct {
				k *keyLimiter
				c *sharedCounter
			}{k, c}
		}
	}
	if len(keys) == 0 {
		return nil
	}
	wctx, stop := context.WithCancel(ctx)
	watched := make(chan error, 1)
	go func() {
		watched <- sh.WatchCounters(wctx, func(name, window string, total int64, at time.Time, rev uint64) {
			if e, ok := byName[name]; ok {
				e.c.io.Lock()
				e.k.mu.Lock()
				e.c.observe(e.k.now(), window, total, rev)
				e.k.mu.Unlock()
				e.c.io.Unlock()
				return
			}
			if key, rest, ok := strings.Cut(name, nameSep+heldPrefix); ok {
				kind, from, _ := strings.Cut(rest, nameSep)
				if from == replica {
					return
				}
				for _, k := range keys {
					if k.name == key {
						k.mu.Lock()
						r := k.share.othersHeldBy[from]
						if kind == "tokens" {
							r.tokens, r.tokensAt = total, at
						} else {
							r.nanos, r.costAt = total, at
						}
						k.share.othersHeldBy[from] = r
						k.mu.Unlock()
					}
				}
				return
			}
			key, rest, ok := strings.Cut(name, nameSep+"running"+nameSep)
			if !ok || rest == replica {
				return
			}
			for _, k := range keys {
				if k.name == key && k.share.running != nil {
					k.mu.Lock()
					k.share.others[rest] = replicaRunning{n: total, at: at}
					k.mu.Unlock()
				}
			}
		})
	}()
	shareAll := func(ctx context.Context) {
		for _, k := range keys {
			for _, c := range k.share.counters {
				k.shareCounter(ctx, sh, c)
			}
			k.shareRunning(sh)
			k.shareHeld()
		}
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			shareAll(ctx)
		case <-kick:
			shareAll(ctx)
		case err := <-watched:
			stop()
			if err != nil {
				return fmt.Errorf("server: watch shared limits: %w", err)
			}
			return nil
		case <-ctx.Done():
			stop()
			<-watched
			// What is left unshared is shared once more, for at most a
			// second; this replica's running turns have ended or been
			// handed off.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			shareAll(fctx)
			return nil
		}
	}
}

// shareCounter adds what this replica used of c since it last shared it
// to the shared total, applying on the way what the other replicas used.
// It costs no round trip while nothing was used.
func (k *keyLimiter) shareCounter(ctx context.Context, sh LimitSharer, c *sharedCounter) {
	k.mu.Lock()
	idle := c.pending == 0
	k.mu.Unlock()
	if idle {
		return
	}
	c.io.Lock()
	defer c.io.Unlock()
	for range maxLimitSwaps {
		window, total, _, rev, err := sh.LoadCounter(ctx, c.name)
		if err != nil {
			return
		}
		k.mu.Lock()
		now := k.now()
		c.observe(now, window, total, rev)
		cur := c.windowAt(now)
		p := c.pending
		if c.pendWindow != cur {
			c.pending, p = 0, 0 // used in a window that is over
		}
		k.mu.Unlock()
		if p == 0 {
			return
		}
		base := total
		switch {
		case window > cur:
			return // this replica's clock is behind: share once it is not
		case window != cur:
			base = 0 // the first use of a new day or month
		}
		newRev, swapped, err := sh.SwapCounter(ctx, c.name, cur, base+p, rev)
		if err != nil {
			return
		}
		if swapped {
			k.mu.Lock()
			c.pending -= p
			c.known, c.knownWindow, c.rev = base+p, cur, newRev
			k.mu.Unlock()
			return
		}
	}
}

// shareRunning tells the other replicas how many turns of the key this
// replica runs: when the count changed, and every runningBeat while it is
// not 0, each time for runningStale, so that a replica that stops is
// forgotten.
func (k *keyLimiter) shareRunning(sh LimitSharer) {
	s := k.share
	if s.running == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	n, now := int64(k.running), k.now()
	if n == s.lastPut && (n == 0 || now.Sub(s.lastBeat) < runningBeat) {
		return
	}
	sh.PutGauge(s.running.name, n, runningStale)
	s.lastPut, s.lastBeat = n, now
}

// shareHeld tells the other replicas what the key's running turns here
// hold for their model calls: when it changed, and every runningBeat while
// it is not nothing, each time for runningStale, so that a replica that
// stops is forgotten.
func (k *keyLimiter) shareHeld() {
	s := k.share
	if s.heldTokens == "" && s.heldCost == "" {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	h, now := k.held, k.now()
	if h == s.lastHeld && (h == (hold{}) || now.Sub(s.lastHeldBeat) < runningBeat) {
		return
	}
	k.putHeld(now)
}

// putHeld puts this replica's gauges of what the key's running turns here
// hold. k.mu is held.
func (k *keyLimiter) putHeld(now time.Time) {
	s := k.share
	if s.sh == nil {
		return
	}
	if s.heldTokens != "" {
		s.sh.PutGauge(s.heldTokens, k.held.tokens, runningStale)
	}
	if s.heldCost != "" {
		s.sh.PutGauge(s.heldCost, k.held.nanos, runningStale)
	}
	s.lastHeld, s.lastHeldBeat = k.held, now
}
