package durable

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/admission"
	"github.com/turnstile-dev/turnstile/server/delivery"
	"github.com/turnstile-dev/turnstile/server/wire"
)

// Runner runs a turn: what Runs needs of the runtime.
type Runner interface {
	Run(ctx context.Context, req *runtime.TurnRequest, sink runtime.Sink) (*runtime.TurnCompleted, error)
	// ContinuesCut reports whether the turn req resumes continues the
	// reply its previous owner was streaming (runtime.Runner's).
	ContinuesCut(req *runtime.TurnRequest) bool
}

// Config is what [Runs] is made of. Every field is required but Keys.
type Config struct {
	// Store is the turn log.
	Store TurnStore
	// Runner runs the turns.
	Runner Runner
	// Logger receives what happens to runs outside any call.
	Logger *slog.Logger
	// Keys are the client keys, nil without: a run taken over holds its
	// key's slot and charges its key.
	Keys *admission.Keys
	// Gate bounds the turns running at once (server.max_concurrent_turns):
	// a run taken over holds a slot of it.
	Gate *admission.Gate
	// Memory bounds the turns started by the server's memory
	// (server.memory_limit): a replica near its limit takes no run over.
	Memory *admission.Memory
	// Streams is what every stream of a run shares: the send timeout and
	// the workers of the Sends.
	Streams delivery.Config
	// DetachGrace is how long a run goes on after its last watcher left.
	DetachGrace time.Duration
	// Pace is the least time between two deltas of one text, reasoning
	// block or tool call's arguments that a run stores
	// (store.frame_interval; see [runtime.PacedSink]); 0 stores each as
	// soon as the previous write is acknowledged.
	Pace time.Duration
	// MaxRunning bounds the runs this replica owns
	// (server.max_running_turns).
	MaxRunning int
	// MaxEventBytes bounds each event stored and sent
	// (server.max_event_bytes).
	MaxEventBytes int
	// Checks are the bounds a run's request is read back with when it is
	// taken over (its media's).
	Checks wire.Checks
	// Now is the clock the deadline and the age of an orphaned run are
	// read on when it is adopted; nil is time.Now.
	Now func() time.Time
}

// Runs are the durable runs of this replica: those it owns (created,
// taken over), each streamed from its window of acknowledged events to
// the clients that watch it here, and the log of every run, which any
// replica reads and signals. It creates and attaches (Run), streams
// (Watch), cancels, approves and steers from any replica, takes over the
// runs of replicas that died, and hands its own to the others when it
// shuts down.
type Runs struct {
	store         TurnStore
	runner        Runner
	logger        *slog.Logger
	keys          *admission.Keys
	gate          *admission.Gate
	memory        *admission.Memory
	streams       delivery.Config
	grace         time.Duration
	pace          time.Duration
	maxEventBytes int
	checks        wire.Checks
	now           func() time.Time
	// owners run the turns owned here (see [Runs.own]).
	owners *delivery.Workers
	// stopTakeovers ends the watch for runs to take over.
	stopTakeovers context.CancelFunc

	// owned are the runs owned here; takeovers take runs over, signals
	// carry and answer the control signals.
	owned     *owned
	takeovers takeovers
	signals   signals
	// owed are the runs whose terminal error did not fit in the store
	// (full.go).
	owed owed
}

// New returns the runs of cfg, and starts taking over the runs of
// replicas that die. Stop it with [Runs.Drain] and [Runs.Close].
func New(cfg Config) *Runs {
	rs := &Runs{
		store: cfg.Store, runner: cfg.Runner, logger: cfg.Logger, keys: cfg.Keys, gate: cfg.Gate, memory: cfg.Memory, streams: cfg.Streams,
		grace: cfg.DetachGrace, pace: cfg.Pace, maxEventBytes: cfg.MaxEventBytes, checks: cfg.Checks, now: cfg.Now,
		owners: delivery.NewWorkers(ownerWorkers),
		owned:  newOwned(cfg.MaxRunning),
	}
	if rs.now == nil {
		rs.now = time.Now
	}
	rs.takeovers = takeovers{rs}
	rs.signals = signals{rs}
	ctx, cancel := context.WithCancel(context.Background())
	rs.stopTakeovers = cancel
	rs.owned.turns.Add(1)
	go func() {
		defer rs.owned.turns.Done()
		rs.takeovers.watch(ctx)
	}()
	return rs
}

// ownerWorkers is how many goroutines wait to run the turn of a run
// owned here (see [delivery.Workers]).
const ownerWorkers = 64

// Wait waits until every run this replica owns has ended, or ctx is done.
func (rs *Runs) Wait(ctx context.Context) { rs.owned.wait(ctx) }

// Drain makes new runs fail with ErrDraining, and stops taking over the
// runs of replicas that died.
func (rs *Runs) Drain() {
	rs.owned.drain()
	rs.stopTakeovers()
}

// CancelAll ends the turn of every run owned here with cause, and returns
// how many there were.
func (rs *Runs) CancelAll(cause error) int { return rs.owned.cancelAll(cause) }

// Close ends the waiting workers of the runs' turns.
func (rs *Runs) Close() { rs.owners.Close() }

// owned are the runs this replica owns: by key, those whose turn runs
// here, and their count within server.max_running_turns.
type owned struct {
	mu       sync.Mutex
	draining bool
	byKey    map[Key]*run      // the runs this replica owns, by key
	running  map[*run]struct{} // the runs whose turn runs here, until it ends
	count    int               // runs admitted and not ended
	max      int
	turns    sync.WaitGroup // the runs this replica owns, until they end
}

func newOwned(max int) *owned {
	return &owned{byKey: map[Key]*run{}, running: map[*run]struct{}{}, max: max}
}

// admit counts a run this replica is about to own. It refuses with
// ErrDraining while the server drains, and a *BusyError while it owns as
// many runs as it may: a run outlives its stream, so streams alone do not
// bound them.
func (o *owned) admit() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case o.draining:
		return ErrDraining
	case o.count >= o.max:
		return &BusyError{Max: o.max}
	}
	o.count++
	o.turns.Add(1)
	return nil
}

// unadmit counts out a run admit counted, once it ended or was not
// created.
func (o *owned) unadmit() {
	o.mu.Lock()
	o.count--
	o.mu.Unlock()
	o.turns.Done()
}

// get returns the run k this replica owns; nil when it owns none.
func (o *owned) get(k Key) *run {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.byKey[k]
}

// put records r as the run k this replica owns.
func (o *owned) put(k Key, r *run) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.byKey[k] = r
}

// drop forgets r, the run k, unless the key names another run since (one
// this replica took over).
func (o *owned) drop(k Key, r *run) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.byKey[k] == r {
		delete(o.byKey, k)
	}
}

// runs counts r's turn as running here until the returned function is
// called.
func (o *owned) runs(r *run) (ended func()) {
	o.mu.Lock()
	o.running[r] = struct{}{}
	o.mu.Unlock()
	return func() {
		o.mu.Lock()
		delete(o.running, r)
		o.mu.Unlock()
	}
}

// wait waits until every run this replica owns has ended, or ctx is done.
func (o *owned) wait(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		o.turns.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// drain makes admit refuse new runs.
func (o *owned) drain() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.draining = true
}

// cancelAll ends the turn of every run running here with cause, and
// returns how many there were.
func (o *owned) cancelAll(cause error) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	for r := range o.running {
		r.cancel(cause)
	}
	return len(o.running)
}

// handOffAll marks every run owned here handed off and stops it, and
// returns how many there were.
func (o *owned) handOffAll() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, r := range o.byKey {
		r.handedOff.Store(true)
		r.cancel(errHandedOff)
	}
	return len(o.byKey)
}
