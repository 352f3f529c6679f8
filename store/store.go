package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnstile-dev/turnstile/llm"
)

// Names of what the store creates in JetStream.
const (
	// StreamName is the stream that holds every run's log.
	StreamName = "TURNSTILE_RUNS"
	// LeaseBucket is the key-value bucket of the runs' leases.
	LeaseBucket = "TURNSTILE_LEASES"
	// CooldownBucket is the key-value bucket of the models' cooldowns,
	// shared by every replica; each key expires with its cooldown.
	CooldownBucket = "TURNSTILE_COOLDOWNS"
	// BudgetBucket is the key-value bucket of the models' retry budgets,
	// shared by every replica: one key per model, changed by
	// compare-and-swap.
	BudgetBucket = "TURNSTILE_BUDGETS"
	// LimitBucket is the key-value bucket of the client keys' limits,
	// shared by every replica: one counter per key and limit, changed by
	// compare-and-swap (limits.go).
	LimitBucket = "TURNSTILE_LIMITS"
	// subjectRoot prefixes the log's subjects: subjectRoot.<turn>.<attempt>.own|ev.
	subjectRoot = "turnstile.run"
	// controlRoot prefixes the runs' own control subjects,
	// controlRoot.<turn>.<attempt>, on which the version before sent
	// signals (see [inbox]).
	controlRoot = "turnstile.ctl"
)

// maxPayload is the largest record the embedded server takes: a request
// may be as large as gRPC's default limit of 4 MiB, with room to spare.
const maxPayload = 8 << 20

// markerTTL is how long the marker of an expired lease is kept: a replica
// that starts within it still takes the run over.
const markerTTL = 10 * time.Minute

// maxInFlight bounds the events of one run queued for the store; Append
// waits beyond it.
const maxInFlight = 256

// Store is an open turn store. It is safe for concurrent use.
type Store struct {
	cfg    Config
	logger *slog.Logger
	id     string             // this replica's id, the value of its leases
	srv    *natsserver.Server // the embedded server; nil with a NATS cluster
	// release removes the embedded memory mode's scratch directory, or
	// unlocks store.dir; nil with a NATS cluster.
	release func()
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  jetstream.Stream
	// shared holds the other buckets, what the replicas share beside the
	// log: see shared.go.
	shared Shared

	closed chan struct{} // closed by Close: writers stop
	// closing is done once closed is: the context of the writers'
	// publishes, which the store's end cuts short.
	closing       context.Context
	cancelClosing context.CancelFunc
	closeOnce     sync.Once

	// leases says which replica owns each run, this process's runs
	// among them: see lease.go. nil until Open has set up the lease
	// bucket.
	leases *leases

	// pub publishes the log's records and the leases: see publish.go.
	pub *publisher

	senders senders // the goroutines of the writers' senders: see writer.go
	inbox   inbox   // the runs' signals: see control.go

	// keeper keeps the log within its bounds: see capacity.go.
	keeper *keeper
}

// Open starts or connects to the engine cfg describes and makes sure the
// stream and the lease bucket exist. ctx bounds the set-up.
func Open(ctx context.Context, cfg Config, logger *slog.Logger) (*Store, error) {
	if ps := cfg.Problems(); len(ps) > 0 {
		return nil, fmt.Errorf("store: %w", errors.Join(problemErrors(ps)...))
	}
	if cfg.Mode == ModeOff {
		return nil, errors.New("store: mode is off")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Store{cfg: cfg, logger: logger, id: newID(), closed: make(chan struct{})}
	s.keeper = newKeeper(cfg, logger, s.closed)
	s.shared = Shared{id: s.id, logger: logger, watch: bucketWatch{logger: logger, closed: s.closed}}
	s.closing, s.cancelClosing = context.WithCancel(context.Background())
	s.senders.work = make(chan func())
	var err error
	tries := setUpTries{until: time.Now().Add(setUpBound), logger: logger, url: cfg.NATS.URL}
	if cfg.Mode == ModeEmbedded {
		s.srv, s.nc, s.release, err = startEmbedded(cfg, s.id, s.keeper)
	} else {
		s.nc, err = connect(ctx, cfg.NATS, tries)
	}
	var o *opened
	if err == nil {
		o, err = setUp(ctx, cfg, logger, s.id, s.nc, s.srv, tries)
	}
	if err == nil {
		s.js, s.stream = o.js, o.stream
		s.shared.js, s.shared.cooldowns, s.shared.budgets, s.shared.limits = o.js, o.cooldowns, o.budgets, o.limits
		// The embedded store reads its publishes' acknowledgements itself.
		s.pub, err = newPublisher(logger, s.closed, s.nc, o.js, o.stream, s.keeper, cfg.Mode == ModeEmbedded)
	}
	if err == nil {
		s.leases = newLeases(cfg, logger, s.id, s.closed, s.nc, o.js, o.stream, s.pub, o.leases, o.leaseCfg)
	}
	if err != nil {
		s.Close()
		return nil, err
	}
	if err := s.inbox.start(s.nc, s.id, s.closed); err != nil {
		s.Close()
		return nil, err
	}
	s.keeper.start(s.srv, s.js, s.stream, s.leases)
	return s, nil
}

func problemErrors(ps []llm.Problem) []error {
	out := make([]error, len(ps))
	for i, p := range ps {
		out[i] = errors.New(p.Error())
	}
	return out
}

func newID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Close stops every run's lease renewal, closes the connection and stops
// the embedded server. Runs still owned are left to expire.
func (s *Store) Close() { s.closeOnce.Do(s.close) }

func (s *Store) close() {
	close(s.closed)
	s.cancelClosing()
	s.keeper.wait()
	var runs map[runKey]*writer
	if s.leases != nil {
		runs = s.leases.takeAll()
	}
	for _, w := range runs {
		w.haltRenewal()
		w.renew.Wait()
	}
	if s.nc != nil {
		s.nc.Close()
	}
	if s.srv != nil {
		s.srv.Shutdown()
		s.srv.WaitForShutdown()
	}
	if s.release != nil {
		s.release()
	}
}

// Size returns the bytes and messages the log holds now, every run's.
func (s *Store) Size(ctx context.Context) (bytes, msgs uint64, err error) {
	info, err := s.stream.Info(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("store: %w", err)
	}
	return info.State.Bytes, info.State.Msgs, nil
}

// isClosed reports whether closed (a store's: closed by Close) is.
func isClosed(closed <-chan struct{}) bool {
	select {
	case <-closed:
		return true
	default:
		return false
	}
}

// ReplicaID returns the id this replica's leases carry.
func (s *Store) ReplicaID() string { return s.id }
