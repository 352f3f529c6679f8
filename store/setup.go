package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// startEmbedded starts an in-process nats-server without a listener and
// connects to it in-process. release removes the memory mode's scratch
// directory or unlocks store.dir, once the server is shut down; a start
// that fails leaves nothing behind. kp takes the reserve before the
// server counts the disk's free space.
func startEmbedded(cfg Config, id string, kp *keeper) (srv *natsserver.Server, nc *nats.Conn, release func(), err error) {
	always, every, _ := cfg.syncInterval()
	dir := cfg.Dir
	if dir == "" {
		// JetStream wants a directory even when every stream is in memory.
		d, err := os.MkdirTemp("", "turnstile-js-")
		if err != nil {
			return nil, nil, nil, fmt.Errorf("store: %w", err)
		}
		dir, release = d, func() { _ = os.RemoveAll(d) }
	} else {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, nil, nil, fmt.Errorf("store: %w", err)
		}
		unlock, err := lockDir(dir)
		if err != nil {
			return nil, nil, nil, err
		}
		release = unlock
		// Before the server counts the disk's free space.
		kp.takeReserve()
	}
	opts := &natsserver.Options{
		ServerName:   "turnstile-" + id,
		DontListen:   true,
		JetStream:    true,
		StoreDir:     dir,
		SyncAlways:   always,
		SyncInterval: every,
		MaxPayload:   maxPayload,
		NoSigs:       true,
		NoLog:        true,
	}
	srv, err = natsserver.NewServer(opts)
	if err != nil {
		release()
		return nil, nil, nil, fmt.Errorf("store: embedded server: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		release()
		return nil, nil, nil, errors.New("store: the embedded server did not start within 10s")
	}
	nc, err = nats.Connect("", nats.InProcessServer(srv), nats.Name("turnstile"), nats.MaxReconnects(-1))
	if err != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
		release()
		return nil, nil, nil, fmt.Errorf("store: connect to the embedded server: %w", err)
	}
	return srv, nc, release, nil
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

// setUpTries bounds the tries of a store's set-up: until when, and what
// each wait is logged with.
type setUpTries struct {
	until  time.Time
	logger *slog.Logger
	url    string // store.nats.url, whose credentials no log line shows
}

// retrySetUp calls op, with a context bounded by setUpTry, until it
// succeeds, fails in a way waiting does not mend, ctx is done, or
// t.until passes; each wait is logged with what it waits for. It returns
// op's last failure.
func retrySetUp(ctx context.Context, t setUpTries, what string, op func(context.Context) error) error {
	pause := setUpPauseMin
	for {
		tctx, cancel := context.WithTimeout(ctx, setUpTry)
		err := op(tctx)
		cancel()
		if err == nil || ctx.Err() != nil || !clusterForming(err) {
			return err
		}
		left := time.Until(t.until)
		if left <= 0 {
			return fmt.Errorf("%w (waited %s for %s)", err, setUpBound, what)
		}
		wait := min(pause, left)
		t.logger.Info("turn store: waiting for the NATS cluster", "for", what, "error", redact(err.Error(), t.url), "retry_in", wait)
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

// opened is what setUp made: the JetStream context of the store's
// connection, the log's stream, and the buckets.
type opened struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	leases jetstream.KeyValue
	// leaseCfg is the lease bucket's, for a restart of the embedded
	// JetStream ([Store.remakeLeases]).
	leaseCfg                   jetstream.KeyValueConfig
	cooldowns, budgets, limits jetstream.KeyValue
}

// setUp creates or updates the stream and the buckets of a store of cfg,
// on nc (and srv, the embedded server, nil with a NATS cluster), waiting
// for a cluster that is still forming until t's bound.
func setUp(ctx context.Context, cfg Config, logger *slog.Logger, id string, nc *nats.Conn, srv *natsserver.Server, t setUpTries) (*opened, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(16*maxInFlight), jetstream.WithPublishAsyncTimeout(publishTimeout))
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	o := &opened{js: js}
	storage := jetstream.FileStorage
	if cfg.Mode == ModeEmbedded && cfg.Dir == "" {
		storage = jetstream.MemoryStorage
	}
	replicas := cfg.Replicas
	auto := replicas == 0
	if auto {
		replicas = 3
		err := retrySetUp(ctx, t, "JetStream to answer (stream "+StreamName+")", func(ctx context.Context) error {
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
			return nil, fmt.Errorf("store: stream %s: %w", StreamName, err)
		}
	}
	placeBy := time.Now().Add(placeR3Within)
	for {
		var stream jetstream.Stream
		err := retrySetUp(ctx, t, fmt.Sprintf("stream %s (%d replicas)", StreamName, replicas), func(ctx context.Context) (err error) {
			stream, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
				Name:        StreamName,
				Description: "turnstile: the log of every turn",
				Subjects:    []string{subjectRoot + ".>"},
				Storage:     storage,
				Replicas:    replicas,
				MaxAge:      cfg.Retention,
				MaxBytes:    cfg.MaxBytes,
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
			return nil, fmt.Errorf("store: stream %s: %w", StreamName, noRoomToStart(err, cfg, srv))
		}
		o.stream = stream
		break
	}
	o.leaseCfg = jetstream.KeyValueConfig{
		Bucket:      LeaseBucket,
		Description: "turnstile: which replica runs each turn",
		TTL:         cfg.LeaseTTL,
		// An expired lease leaves a marker that every replica's watcher
		// sees, and that one starting later still finds for a while.
		LimitMarkerTTL: markerTTL,
		History:        1,
		Storage:        storage,
		Replicas:       replicas,
	}
	if cfg.Mode == ModeEmbedded {
		// Leases in memory: see dropFileLeases.
		o.leaseCfg.Storage = jetstream.MemoryStorage
		err := retrySetUp(ctx, t, "bucket "+LeaseBucket, func(ctx context.Context) error {
			return dropFileLeases(ctx, js, logger)
		})
		if err != nil {
			return nil, fmt.Errorf("store: bucket %s: %w", LeaseBucket, err)
		}
	}
	for _, b := range []struct {
		kv  *jetstream.KeyValue
		cfg jetstream.KeyValueConfig
	}{
		{&o.leases, o.leaseCfg},
		{&o.cooldowns, jetstream.KeyValueConfig{
			Bucket:      CooldownBucket,
			Description: "turnstile: the models every replica skips for now",
			// Per-key TTLs need markers on: a cooldown's key expires with it.
			LimitMarkerTTL: time.Second,
		}},
		{&o.budgets, jetstream.KeyValueConfig{
			Bucket:      BudgetBucket,
			Description: "turnstile: the models' retry budgets, shared by every replica",
		}},
		{&o.limits, jetstream.KeyValueConfig{
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
		err := retrySetUp(ctx, t, "bucket "+b.cfg.Bucket, func(ctx context.Context) (err error) {
			*b.kv, err = js.CreateOrUpdateKeyValue(ctx, b.cfg)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("store: bucket %s: %w", b.cfg.Bucket, err)
		}
	}
	where := []any{"replica", id, "mode", cfg.Mode, "replicas", replicas, "retention", cfg.Retention, "lease_ttl", cfg.LeaseTTL}
	if cfg.Mode == ModeEmbedded {
		where = append(where, "dir", cfg.Dir, "sync", cfg.Sync)
	}
	logger.Info("turn store ready", where...)
	return o, nil
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
