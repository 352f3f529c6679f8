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
	// Streams is what every stream of a run shares: the send timeout and
	// the workers of the Sends.
	Streams delivery.Config
	// DetachGrace is how long a run goes on after its last watcher left.
	DetachGrace time.Duration
	// MaxRunning bounds the runs this replica owns
	// (server.max_running_turns).
	MaxRunning int
	// MaxEventBytes bounds each event stored and sent
	// (server.max_event_bytes).
	MaxEventBytes int
	// Checks are the bounds a run's request is read back with when it is
	// taken over (its media's).
	Checks wire.Checks
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
	streams       delivery.Config
	grace         time.Duration
	maxRuns       int
	maxEventBytes int
	checks        wire.Checks
	// owners run the turns owned here (see [Runs.own]).
	owners *delivery.Workers
	// stopTakeovers ends the watch for runs to take over.
	stopTakeovers context.CancelFunc

	mu       sync.Mutex
	draining bool
	runs     map[Key]*run      // the runs this replica owns, by key
	owning   map[*run]struct{} // the runs whose turn runs here, until it ends
	owned    int               // runs admitted and not ended
	turns    sync.WaitGroup    // the runs this replica owns, until they end
}

// New returns the runs of cfg, and starts taking over the runs of
// replicas that die. Stop it with [Runs.Drain] and [Runs.Close].
func New(cfg Config) *Runs {
	rs := &Runs{
		store: cfg.Store, runner: cfg.Runner, logger: cfg.Logger, keys: cfg.Keys, gate: cfg.Gate, streams: cfg.Streams,
		grace: cfg.DetachGrace, maxRuns: cfg.MaxRunning, maxEventBytes: cfg.MaxEventBytes, checks: cfg.Checks,
		owners: delivery.NewWorkers(ownerWorkers),
		runs:   map[Key]*run{}, owning: map[*run]struct{}{},
	}
	ctx, cancel := context.WithCancel(context.Background())
	rs.stopTakeovers = cancel
	rs.turns.Add(1)
	go func() {
		defer rs.turns.Done()
		rs.takeOvers(ctx)
	}()
	return rs
}

// ownerWorkers is how many goroutines wait to run the turn of a run
// owned here (see [delivery.Workers]).
const ownerWorkers = 64

// admit counts a run this replica is about to own. It refuses with
// ErrDraining while the server drains, and a *BusyError while it owns as
// many runs as it may: a run outlives its stream, so streams alone do not
// bound them.
func (rs *Runs) admit() error {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	switch {
	case rs.draining:
		return ErrDraining
	case rs.owned >= rs.maxRuns:
		return &BusyError{Max: rs.maxRuns}
	}
	rs.owned++
	rs.turns.Add(1)
	return nil
}

// unadmit counts out a run admit counted, once it ended or was not
// created.
func (rs *Runs) unadmit() {
	rs.mu.Lock()
	rs.owned--
	rs.mu.Unlock()
	rs.turns.Done()
}

// Wait waits until every run this replica owns has ended, or ctx is done.
func (rs *Runs) Wait(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		rs.turns.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// Drain makes new runs fail with ErrDraining, and stops taking over the
// runs of replicas that died.
func (rs *Runs) Drain() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.draining = true
	rs.stopTakeovers()
}

// CancelAll ends the turn of every run owned here with cause, and returns
// how many there were.
func (rs *Runs) CancelAll(cause error) int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for r := range rs.owning {
		r.cancel(cause)
	}
	return len(rs.owning)
}

// Close ends the waiting workers of the runs' turns.
func (rs *Runs) Close() { rs.owners.Close() }
