package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
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
	// subjectRoot prefixes the log's subjects: subjectRoot.<turn>.<attempt>.own|ev.
	subjectRoot = "turnstile.run"
	// controlRoot prefixes the control subjects: controlRoot.<turn>.<attempt>.
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
	cfg       Config
	logger    *slog.Logger
	id        string // this replica's id, the value of its leases
	srv       *natsserver.Server
	tmpDir    string // the embedded memory mode's scratch directory
	unlock    func() // releases the file store's directory
	nc        *nats.Conn
	js        jetstream.JetStream
	stream    jetstream.Stream
	leases    jetstream.KeyValue
	leaseLog  jetstream.Stream // the stream behind leases: see dropLease
	cooldowns jetstream.KeyValue
	budgets   jetstream.KeyValue

	closed    chan struct{} // closed by Close: writers stop
	closeOnce sync.Once

	mu   sync.Mutex
	runs map[runKey]*writer

	room capacity // the keeper's: see capacity.go
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
	s := &Store{cfg: cfg, logger: logger, id: newID(), runs: map[runKey]*writer{}, closed: make(chan struct{})}
	var err error
	if cfg.Mode == ModeEmbedded {
		err = s.startEmbedded()
	} else {
		err = s.connect()
	}
	if err == nil {
		err = s.setUp(ctx)
	}
	if err != nil {
		s.Close()
		return nil, err
	}
	s.startKeeper()
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

// connect connects to the cluster of mode nats.
func (s *Store) connect() error {
	n := s.cfg.NATS
	opts := []nats.Option{nats.Name("turnstile"), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond)}
	if n.Credentials != "" {
		opts = append(opts, nats.UserCredentials(n.Credentials))
	}
	if n.CAFile != "" {
		opts = append(opts, nats.RootCAs(n.CAFile))
	}
	if n.CertFile != "" {
		opts = append(opts, nats.ClientCert(n.CertFile, n.KeyFile))
	}
	nc, err := nats.Connect(n.URL, opts...)
	if err != nil {
		return connectError(err, n)
	}
	s.nc = nc
	return nil
}

// connectError explains why connecting to NATS failed, naming the keys to
// check. The URL may hold credentials (a user and password, a token): it
// is never printed, and any of them the error repeats is redacted.
func connectError(err error, n NATS) error {
	var what string
	msg := strings.ToLower(err.Error())
	switch {
	case errors.Is(err, nats.ErrAuthorization) || strings.Contains(msg, "authorization violation"):
		what = "NATS refused this replica's credentials (the user and password or token of store.nats.url, or store.nats.credentials)"
	case strings.Contains(msg, "error loading"), errors.Is(err, os.ErrNotExist), errors.Is(err, os.ErrPermission):
		what = "a file of store.nats (ca_file, cert_file, key_file, credentials) cannot be read"
	case strings.Contains(msg, "tls"), strings.Contains(msg, "x509"), strings.Contains(msg, "certificate"):
		what = "TLS with NATS failed (store.nats.ca_file must hold the CA of the servers' certificates"
		if n.CertFile == "" {
			what += "; a server that asks for a client certificate needs store.nats.cert_file and key_file)"
		} else {
			what += ", and store.nats.cert_file and key_file a certificate the servers accept)"
		}
	case strings.Contains(msg, "credentials") || strings.Contains(msg, "nkey") || strings.Contains(msg, "jwt"):
		what = "the credentials file (store.nats.credentials) cannot be used"
	default:
		what = "cannot connect to NATS (store.nats.url)"
	}
	return &redactedError{msg: "store: " + what + ": " + redact(err.Error(), n.URL), err: err}
}

// redact returns msg with every credential the URLs of list hold replaced.
func redact(msg, list string) string {
	for _, u := range strings.Split(list, ",") {
		p, err := parseNATSURL(u)
		if err != nil || p.User == nil {
			continue
		}
		secrets := []string{p.User.Username()}
		if pw, ok := p.User.Password(); ok {
			secrets = append(secrets, pw)
		}
		for _, sec := range secrets {
			if sec != "" {
				msg = strings.ReplaceAll(msg, sec, "[redacted]")
			}
		}
	}
	return msg
}

// parseNATSURL parses one server of store.nats.url as the NATS client
// does: a URL, nats:// when it has no scheme.
func parseNATSURL(u string) (*url.URL, error) {
	u = strings.TrimSpace(u)
	if !strings.Contains(u, "://") {
		u = "nats://" + u
	}
	return url.Parse(u)
}

// redactedError is an error whose message had its secrets removed.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// setUp creates or updates the stream and the lease bucket.
func (s *Store) setUp(ctx context.Context) error {
	js, err := jetstream.New(s.nc, jetstream.WithPublishAsyncMaxPending(16*maxInFlight), jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	s.js = js
	storage := jetstream.FileStorage
	if s.cfg.Mode == ModeEmbedded && s.cfg.Dir == "" {
		storage = jetstream.MemoryStorage
	}
	replicas := s.cfg.Replicas
	auto := replicas == 0
	if auto {
		replicas = 3
		if st, err := js.Stream(ctx, StreamName); err == nil {
			// Keep what an earlier start chose.
			replicas = st.CachedInfo().Config.Replicas
		}
	}
	for {
		stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
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
		if err != nil && auto && replicas > 1 && tooFewServers(err) {
			replicas = 1
			continue
		}
		if err != nil {
			return fmt.Errorf("store: stream %s: %w", StreamName, s.noRoomToStart(err))
		}
		s.stream = stream
		break
	}
	for _, b := range []struct {
		kv  *jetstream.KeyValue
		cfg jetstream.KeyValueConfig
	}{
		{&s.leases, jetstream.KeyValueConfig{
			Bucket:      LeaseBucket,
			Description: "turnstile: which replica runs each turn",
			TTL:         s.cfg.LeaseTTL,
			// An expired lease leaves a marker that every replica's watcher
			// sees, and that one starting later still finds for a while.
			LimitMarkerTTL: markerTTL,
		}},
		{&s.cooldowns, jetstream.KeyValueConfig{
			Bucket:      CooldownBucket,
			Description: "turnstile: the models every replica skips for now",
			// Per-key TTLs need markers on: a cooldown's key expires with it.
			LimitMarkerTTL: time.Second,
		}},
		{&s.budgets, jetstream.KeyValueConfig{
			Bucket:      BudgetBucket,
			Description: "turnstile: the models' retry budgets, shared by every replica",
		}},
	} {
		b.cfg.History, b.cfg.Storage, b.cfg.Replicas = 1, storage, replicas
		kv, err := js.CreateOrUpdateKeyValue(ctx, b.cfg)
		if err != nil {
			return fmt.Errorf("store: bucket %s: %w", b.cfg.Bucket, err)
		}
		*b.kv = kv
	}
	if s.leaseLog, err = js.Stream(ctx, "KV_"+LeaseBucket); err != nil {
		return fmt.Errorf("store: bucket %s: %w", LeaseBucket, err)
	}
	where := []any{"replica", s.id, "mode", s.cfg.Mode, "replicas", replicas, "retention", s.cfg.Retention, "lease_ttl", s.cfg.LeaseTTL}
	if s.cfg.Mode == ModeEmbedded {
		where = append(where, "dir", s.cfg.Dir, "sync", s.cfg.Sync)
	}
	s.logger.Info("turn store ready", where...)
	return nil
}

// tooFewServers reports whether err says the cluster cannot place the
// replicas asked for.
func tooFewServers(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case 10074, 10023: // replicas > 1 in a server that is not clustered; insufficient resources
		return true
	}
	return false
}

// Close stops every run's lease renewal, closes the connection and stops
// the embedded server. Runs still owned are left to expire.
func (s *Store) Close() { s.closeOnce.Do(s.close) }

func (s *Store) close() {
	close(s.closed)
	s.room.done.Wait()
	s.mu.Lock()
	runs := s.runs
	s.runs = map[runKey]*writer{}
	s.mu.Unlock()
	for _, w := range runs {
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

func (s *Store) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

// ReplicaID returns the id this replica's leases carry.
func (s *Store) ReplicaID() string { return s.id }
