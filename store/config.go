package store

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// The modes of a [Config].
const (
	// ModeEmbedded runs an in-process nats-server with no listener.
	ModeEmbedded = "embedded"
	// ModeNATS connects to an existing NATS server or cluster.
	ModeNATS = "nats"
	// ModeOff keeps no log: turns live in the memory of the replica that
	// runs them, as they did before the store existed.
	ModeOff = "off"
)

// SyncAlways is the [Config.Sync] value that fsyncs every write.
const SyncAlways = "always"

// Config is the store's configuration: the store block of the file. The
// yaml names are its keys.
type Config struct {
	// Mode is embedded, nats or off (default embedded).
	Mode string `yaml:"mode"`
	// Dir is the embedded server's file store directory; empty keeps
	// everything in memory (default: $XDG_STATE_HOME/turnstile/jetstream,
	// or ~/.local/state/turnstile/jetstream when XDG_STATE_HOME is unset).
	Dir string `yaml:"dir"`
	// Sync is how often the embedded server fsyncs its files: "always"
	// (every write, before the acknowledgement) or an interval (default
	// 2m, JetStream's own default).
	Sync string `yaml:"sync"`
	// Retention is how long a run's log is kept after it was written
	// (default 24h; positive).
	Retention time.Duration `yaml:"retention"`
	// MaxBytes bounds the log's size; the oldest runs are dropped first
	// (default 1 GiB; -1 is no bound).
	MaxBytes int64 `yaml:"max_bytes"`
	// MaxTurns bounds the turns the log keeps (each attempt one), finished
	// or running: above 90% of it the oldest finished ones are removed,
	// down to 80%, and while running turns hold it new turns are refused.
	// Each turn kept costs the NATS server's index of the log's subjects
	// about 0.3 KiB of memory (the embedded server's is this process's),
	// whatever its size (default 100000; -1 is no bound).
	MaxTurns int64 `yaml:"max_turns"`
	// Reserve is the room, in bytes, the embedded file store holds back on
	// the disk of dir for the turns running when that disk fills: a file
	// it releases then, so that they go on while new turns are refused; its
	// last quarter is kept for their last events (default 64 MiB; 0 holds
	// none back: a full disk ends the running turns at once, their last
	// events stored once space returns).
	Reserve int64 `yaml:"reserve"`
	// Replicas is the replication factor of the log and the leases; 0
	// picks 3 when the cluster has three servers or more, else 1.
	Replicas int `yaml:"replicas"`
	// LeaseTTL is how long a run stays owned by a replica that stopped
	// renewing its lease (mode nats; the embedded store holds its runs in
	// the process and writes no lease), and how long a run left without an
	// owner waits before a watcher adopts it (default 2s; at least 500ms).
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// FrameInterval is how often a reply's streamed text is written to
	// the log (the deltas of one text, reasoning block or tool call's
	// arguments): what the model streams meanwhile is stored, and sent, as
	// one event, at the ticks of a clock every turn of the process shares
	// (whole multiples of the interval from a whole second), so the log
	// takes the writes of many turns together, which costs it less per
	// write; two writes of one text are at least half an interval apart, a
	// steady stream's one interval. The first delta of each, and every
	// other event, is stored at once. A client sees only what is stored, so
	// the text it watches may lag the model by up to one and a half
	// intervals. 0 stores each delta as soon as the previous write is
	// acknowledged: a write per chunk of a model that streams slower than
	// the store answers (default 100ms; at most 10s).
	FrameInterval time.Duration `yaml:"frame_interval"`
	// NATS says how to reach the cluster in mode nats.
	NATS NATS `yaml:"nats"`
}

// NATS says how to reach an existing NATS cluster.
type NATS struct {
	// URL lists the servers, comma separated (nats://host:4222,...).
	URL string `yaml:"url"`
	// Credentials is a NATS credentials file (JWT and seed), if the
	// cluster needs one.
	Credentials string `yaml:"credentials"`
	// CAFile, CertFile and KeyFile configure TLS: the CA that signs the
	// servers' certificates, and a client certificate and key when the
	// servers ask for one.
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// DefaultConfig returns the built-in store configuration: embedded, with
// its files under [DefaultDir].
func DefaultConfig() Config {
	return Config{
		Mode: ModeEmbedded, Dir: DefaultDir(), Sync: "2m", Retention: 24 * time.Hour,
		MaxBytes: 1 << 30, MaxTurns: 100_000, Reserve: DefaultReserve, LeaseTTL: 2 * time.Second,
		FrameInterval: DefaultFrameInterval,
	}
}

// DefaultFrameInterval is the default [Config.FrameInterval].
const DefaultFrameInterval = 100 * time.Millisecond

// maxFrameInterval bounds [Config.FrameInterval].
const maxFrameInterval = 10 * time.Second

// DefaultReserve is the room the embedded file store holds back for running
// turns unless store.reserve says otherwise: see [Config].Reserve.
const DefaultReserve = 64 << 20

// DefaultDirText is [DefaultDir] as the documentation writes it: the
// directory it returns depends on the user and the environment.
const DefaultDirText = "$XDG_STATE_HOME/turnstile/jetstream"

// DefaultDir returns $XDG_STATE_HOME/turnstile/jetstream, or
// ~/.local/state/turnstile/jetstream; empty (memory only) when neither
// can be found.
func DefaultDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "turnstile", "jetstream")
	}
	if h, err := os.UserHomeDir(); err == nil && h != "" {
		return filepath.Join(h, ".local", "state", "turnstile", "jetstream")
	}
	return ""
}

// syncInterval parses Sync: always, or a positive interval.
func (c Config) syncInterval() (always bool, every time.Duration, err error) {
	if strings.EqualFold(c.Sync, SyncAlways) {
		return true, 0, nil
	}
	d, err := time.ParseDuration(c.Sync)
	if err != nil || d <= 0 {
		return false, 0, fmt.Errorf("must be %q or a positive duration such as 2m", SyncAlways)
	}
	return false, d, nil
}

// Problems lists every value out of range, in field order; none when c is
// valid.
func (c Config) Problems() []llm.Problem {
	var out []llm.Problem
	bad := func(field, format string, args ...any) {
		out = append(out, llm.Problem{Field: field, Message: fmt.Sprintf(format, args...)})
	}
	switch c.Mode {
	case ModeEmbedded, ModeOff:
		if c.NATS.URL != "" {
			bad("nats.url", "is set but mode is %s; set mode: nats to use a NATS cluster", c.Mode)
		}
	case ModeNATS:
		if c.NATS.URL == "" {
			bad("nats.url", "required with mode: nats")
		}
		for i, u := range strings.Split(c.NATS.URL, ",") {
			if _, err := parseNATSURL(u); err != nil {
				// Not the URL: it may hold credentials.
				var urlErr *url.Error
				if errors.As(err, &urlErr) {
					err = urlErr.Err
				}
				bad("nats.url", "server %d of the list is not a URL: %s", i+1, redact(err.Error(), c.NATS.URL))
			}
		}
	default:
		bad("mode", "must be embedded, nats or off")
	}
	if _, _, err := c.syncInterval(); err != nil {
		bad("sync", "%v", err)
	}
	if c.Retention <= 0 {
		bad("retention", "must be positive")
	}
	if c.MaxBytes == 0 || c.MaxBytes < -1 {
		bad("max_bytes", "must be positive, or -1 for no bound")
	}
	if c.MaxTurns == 0 || c.MaxTurns < -1 {
		bad("max_turns", "must be positive, or -1 for no bound")
	}
	if c.Reserve < 0 {
		bad("reserve", "must be 0 (none) or a positive number of bytes")
	}
	if c.Replicas < 0 || c.Replicas > 5 {
		bad("replicas", "must be between 0 (automatic) and 5")
	}
	if c.LeaseTTL < 500*time.Millisecond {
		bad("lease_ttl", "must be at least 500ms")
	}
	if c.FrameInterval < 0 || c.FrameInterval > maxFrameInterval {
		bad("frame_interval", "must be between 0 (no floor) and %s", maxFrameInterval)
	}
	if (c.NATS.CertFile == "") != (c.NATS.KeyFile == "") {
		bad("nats.cert_file", "cert_file and key_file go together")
	}
	return out
}
