package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
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
	cfg      Config
	logger   *slog.Logger
	id       string // this replica's id, the value of its leases
	srv      *natsserver.Server
	tmpDir   string // the embedded memory mode's scratch directory
	unlock   func() // releases the file store's directory
	nc       *nats.Conn
	js       jetstream.JetStream
	stream   jetstream.Stream
	leases   jetstream.KeyValue
	leaseCfg jetstream.KeyValueConfig // the lease bucket's, for restartJetStream
	// shared holds the other buckets, what the replicas share beside the
	// log: see shared.go.
	shared Shared
	watch  bucketWatch // of the lease bucket, and of shared's

	closed chan struct{} // closed by Close: writers stop
	// closing is done once closed is: the context of the writers'
	// publishes, which the store's end cuts short.
	closing       context.Context
	cancelClosing context.CancelFunc
	closeOnce     sync.Once

	mu   sync.Mutex
	runs map[runKey]*writer
	// claiming holds the runs this process is claiming, until they are
	// owned (in runs) or the claim fails: with the embedded store, what
	// the lease bucket held (see [Store.local]).
	claiming map[runKey]struct{}

	// local says that the runs' ownership is held in this process, not by
	// leases in the lease bucket: the embedded store (see lease.go).
	local bool
	// expiries hands the runs this process released to WatchExpired's
	// callbacks, when local.
	expiries expiries

	// ownAcks says that the store reads its publishes' acknowledgements
	// itself, acks the inbox of those it does not wait on: see puback.go.
	ownAcks bool
	acks    ackInbox

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
	s := &Store{cfg: cfg, logger: logger, id: newID(), runs: map[runKey]*writer{}, claiming: map[runKey]struct{}{}, closed: make(chan struct{})}
	s.keeper = newKeeper(cfg, logger, s.closed)
	s.watch = bucketWatch{logger: logger, closed: s.closed}
	s.shared = Shared{id: s.id, logger: logger, watch: s.watch}
	s.local = cfg.Mode == ModeEmbedded
	s.closing, s.cancelClosing = context.WithCancel(context.Background())
	s.senders.work = make(chan func())
	var err error
	until := time.Now().Add(setUpBound)
	if cfg.Mode == ModeEmbedded {
		err = s.startEmbedded()
	} else {
		err = s.connect(ctx, until)
	}
	if err == nil {
		err = s.setUp(ctx, until)
	}
	if err != nil {
		s.Close()
		return nil, err
	}
	if err := s.inbox.start(s.nc, s.id, s.closed); err != nil {
		s.Close()
		return nil, err
	}
	s.keeper.start(s.srv, s.js, s.stream, s)
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

// startEmbedded starts an in-process nats-server without a listener and
// connects to it in-process.
func (s *Store) startEmbedded() error {
	always, every, _ := s.cfg.syncInterval()
	dir := s.cfg.Dir
	if dir == "" {
		// JetStream wants a directory even when every stream is in memory.
		d, err := os.MkdirTemp("", "turnstile-js-")
		if err != nil {
			return fmt.Errorf("store: %w", err)
		}
		s.tmpDir, dir = d, d
	} else {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("store: %w", err)
		}
		unlock, err := lockDir(dir)
		if err != nil {
			return err
		}
		s.unlock = unlock
		// Before the server counts the disk's free space.
		s.keeper.takeReserve()
	}
	opts := &natsserver.Options{
		ServerName:   "turnstile-" + s.id,
		DontListen:   true,
		JetStream:    true,
		StoreDir:     dir,
		SyncAlways:   always,
		SyncInterval: every,
		MaxPayload:   maxPayload,
		NoSigs:       true,
		NoLog:        true,
	}
	srv, err := natsserver.NewServer(opts)
	if err != nil {
		return fmt.Errorf("store: embedded server: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return errors.New("store: the embedded server did not start within 10s")
	}
	s.srv = srv
	nc, err := nats.Connect("", nats.InProcessServer(srv), nats.Name("turnstile"), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("store: connect to the embedded server: %w", err)
	}
	s.nc = nc
	return nil
}

// Bounds of opening the store on a NATS cluster that is still forming, as
// a new install's is when its replicas start with it.
//
// A new cluster takes a few seconds to elect its JetStream meta leader
// once a quorum of its servers has met (a raft election: 4–9 s in
// nats-server), then each stream and bucket elects its own; until then
// every request of the set-up fails ("temporarily unavailable", no
// answer, too few servers known). setUpBound gives the servers time to
// start too (a pod scheduled beside this replica's) with room to spare,
// while a URL that is wrong, or a cluster that never forms, still ends the
// start within a minute with the last failure, rather than hanging.
const (
	setUpBound = time.Minute
	// setUpTry bounds one request of the set-up; one that got no answer
	// (a request to a cluster with no meta leader yet) is made again.
	setUpTry = 2 * time.Second
	// The pauses between the set-up's tries grow from setUpPauseMin to
	// setUpPauseMax.
	setUpPauseMin = 100 * time.Millisecond
	setUpPauseMax = 2 * time.Second
	// placeR3Within is how long a cluster that cannot place three
	// replicas yet (its servers still meeting) is waited for before the
	// automatic replication factor settles for one.
	placeR3Within = 15 * time.Second
)

// retrySetUp calls op, with a context bounded by setUpTry, until it
// succeeds, fails in a way waiting does not mend, ctx is done, or until
// passes; each wait is logged with what it waits for. It returns op's
// last failure.
func (s *Store) retrySetUp(ctx context.Context, until time.Time, what string, op func(context.Context) error) error {
	pause := setUpPauseMin
	for {
		tctx, cancel := context.WithTimeout(ctx, setUpTry)
		err := op(tctx)
		cancel()
		if err == nil || ctx.Err() != nil || !clusterForming(err) {
			return err
		}
		left := time.Until(until)
		if left <= 0 {
			return fmt.Errorf("%w (waited %s for %s)", err, setUpBound, what)
		}
		wait := min(pause, left)
		s.logger.Info("turn store: waiting for the NATS cluster", "for", what, "error", redact(err.Error(), s.cfg.NATS.URL), "retry_in", wait)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		pause = min(2*pause, setUpPauseMax)
	}
}

// clusterForming reports whether err is one a NATS cluster that is still
// starting gives: nothing answers yet, no meta or stream leader yet, too
// few servers known to place the replicas.
func clusterForming(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		// JetStream temporarily unavailable; no suitable peers; not the
		// leader; insufficient resources.
		case 10008, 10005, 10009, 10023:
			return true
		}
		return false
	}
	return errors.Is(err, nats.ErrNoServers) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrDisconnected)
}

// setUp creates or updates the stream and the buckets, waiting for a
// cluster that is still forming until the set-up's bound.
func (s *Store) setUp(ctx context.Context, until time.Time) error {
	js, err := jetstream.New(s.nc, jetstream.WithPublishAsyncMaxPending(16*maxInFlight), jetstream.WithPublishAsyncTimeout(publishTimeout))
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	s.js, s.shared.js = js, js
	if s.cfg.Mode == ModeEmbedded {
		s.ownAcks = true
		if err := s.acks.listen(s.nc); err != nil {
			return err
		}
	}
	storage := jetstream.FileStorage
	if s.cfg.Mode == ModeEmbedded && s.cfg.Dir == "" {
		storage = jetstream.MemoryStorage
	}
	replicas := s.cfg.Replicas
	auto := replicas == 0
	if auto {
		replicas = 3
		err := s.retrySetUp(ctx, until, "JetStream to answer (stream "+StreamName+")", func(ctx context.Context) error {
			st, err := js.Stream(ctx, StreamName)
			if err == nil {
				// Keep what an earlier start chose.
				replicas = st.CachedInfo().Config.Replicas
			}
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return nil
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("store: stream %s: %w", StreamName, err)
		}
	}
	placeBy := time.Now().Add(placeR3Within)
	for {
		var stream jetstream.Stream
		err := s.retrySetUp(ctx, until, fmt.Sprintf("stream %s (%d replicas)", StreamName, replicas), func(ctx context.Context) (err error) {
			stream, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
				Name:        StreamName,
				Description: "turnstile: the log of every turn",
				Subjects:    []string{subjectRoot + ".>"},
				Storage:     storage,
				Replicas:    replicas,
				MaxAge:      s.cfg.Retention,
				MaxBytes:    s.cfg.MaxBytes,
				// Full, the log refuses a record rather than drop the oldest,
				// which may be a running run's: the keeper (capacity.go)
				// removes finished runs to make room. A stream made before
				// with DiscardOld is updated in place.
				Discard: jetstream.DiscardNew,
				// Runs are read from their start: direct gets serve them from
				// any replica.
				AllowDirect: true,
				Duplicates:  duplicateWindow,
			})
			if err != nil && auto && replicas > 1 && tooFewServers(err) && time.Now().Before(placeBy) {
				// Maybe a cluster whose servers have not all met yet:
				// wait for them a while before settling for one replica.
				var apiErr *jetstream.APIError
				if errors.As(err, &apiErr) && apiErr.ErrorCode != 10074 {
					return err
				}
			}
			if err != nil && auto && replicas > 1 && tooFewServers(err) {
				return errSettleForOne
			}
			return err
		})
		if errors.Is(err, errSettleForOne) {
			replicas = 1
			continue
		}
		if err != nil {
			return fmt.Errorf("store: stream %s: %w", StreamName, noRoomToStart(err, s.cfg, s.srv))
		}
		s.stream = stream
		break
	}
	s.leaseCfg = jetstream.KeyValueConfig{
		Bucket:      LeaseBucket,
		Description: "turnstile: which replica runs each turn",
		TTL:         s.cfg.LeaseTTL,
		// An expired lease leaves a marker that every replica's watcher
		// sees, and that one starting later still finds for a while.
		LimitMarkerTTL: markerTTL,
		History:        1,
		Storage:        storage,
		Replicas:       replicas,
	}
	if s.cfg.Mode == ModeEmbedded {
		// Leases in memory: see dropFileLeases.
		s.leaseCfg.Storage = jetstream.MemoryStorage
		err := s.retrySetUp(ctx, until, "bucket "+LeaseBucket, s.dropFileLeases)
		if err != nil {
			return fmt.Errorf("store: bucket %s: %w", LeaseBucket, err)
		}
	}
	for _, b := range []struct {
		kv  *jetstream.KeyValue
		cfg jetstream.KeyValueConfig
	}{
		{&s.leases, s.leaseCfg},
		{&s.shared.cooldowns, jetstream.KeyValueConfig{
			Bucket:      CooldownBucket,
			Description: "turnstile: the models every replica skips for now",
			// Per-key TTLs need markers on: a cooldown's key expires with it.
			LimitMarkerTTL: time.Second,
		}},
		{&s.shared.budgets, jetstream.KeyValueConfig{
			Bucket:      BudgetBucket,
			Description: "turnstile: the models' retry budgets, shared by every replica",
		}},
		{&s.shared.limits, jetstream.KeyValueConfig{
			Bucket:      LimitBucket,
			Description: "turnstile: the client keys' limits (turns, tokens, cost, turns running), shared by every replica",
			// Per-key TTLs need markers on: a replica's count of running
			// turns expires unless it is refreshed.
			LimitMarkerTTL: time.Second,
		}},
	} {
		if b.cfg.Bucket != LeaseBucket {
			b.cfg.History, b.cfg.Storage, b.cfg.Replicas = 1, storage, replicas
		}
		err := s.retrySetUp(ctx, until, "bucket "+b.cfg.Bucket, func(ctx context.Context) (err error) {
			*b.kv, err = js.CreateOrUpdateKeyValue(ctx, b.cfg)
			return err
		})
		if err != nil {
			return fmt.Errorf("store: bucket %s: %w", b.cfg.Bucket, err)
		}
	}
	where := []any{"replica", s.id, "mode", s.cfg.Mode, "replicas", replicas, "retention", s.cfg.Retention, "lease_ttl", s.cfg.LeaseTTL}
	if s.cfg.Mode == ModeEmbedded {
		where = append(where, "dir", s.cfg.Dir, "sync", s.cfg.Sync)
	}
	s.logger.Info("turn store ready", where...)
	return nil
}

// remakeLeases makes the lease bucket again: see [owners].
func (s *Store) remakeLeases(ctx context.Context) error {
	_, err := s.js.CreateOrUpdateKeyValue(ctx, s.leaseCfg)
	return err
}

// errSettleForOne ends the set-up's tries of a stream of several replicas
// that the cluster cannot place: the automatic factor settles for one.
var errSettleForOne = errors.New("store: too few servers for three replicas")

// tooFewServers reports whether err says the cluster cannot place the
// replicas asked for.
func tooFewServers(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case 10074, 10023, 10005: // replicas > 1 in a server that is not clustered; insufficient resources; no suitable peers
		return true
	}
	return false
}

// Close stops every run's lease renewal, closes the connection and stops
// the embedded server. Runs still owned are left to expire.
func (s *Store) Close() { s.closeOnce.Do(s.close) }

func (s *Store) close() {
	close(s.closed)
	s.cancelClosing()
	s.keeper.wait()
	s.mu.Lock()
	runs := s.runs
	s.runs = map[runKey]*writer{}
	s.mu.Unlock()
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
	if s.tmpDir != "" {
		_ = os.RemoveAll(s.tmpDir)
	}
	if s.unlock != nil {
		s.unlock()
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
