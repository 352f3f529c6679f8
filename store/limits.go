package store

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// counter is the value of a key in the limits bucket: a total counted in
// a window (a UTC day or month, or "" for a total of all time), as of at.
type counter struct {
	Window  string    `json:"window,omitempty"`
	Total   int64     `json:"total"`
	At      time.Time `json:"at"`
	Replica string    `json:"replica"`
}

func counterKey(name string) string { return base64.RawURLEncoding.EncodeToString([]byte(name)) }

// LoadCounter returns the shared counter name: its window, total, when it
// was last written, and its key's revision; revision 0 when none is
// stored. The counters hold the client keys' limits that every replica
// shares (package server's limit sharing).
func (s *Shared) LoadCounter(ctx context.Context, name string) (window string, total int64, at time.Time, revision uint64, err error) {
	e, err := s.limits.Get(ctx, counterKey(name))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", 0, time.Time{}, 0, nil
	}
	if err != nil {
		return "", 0, time.Time{}, 0, fmt.Errorf("store: load counter: %w", err)
	}
	var c counter
	if err := json.Unmarshal(e.Value(), &c); err != nil {
		return "", 0, time.Time{}, 0, fmt.Errorf("store: counter %q: %w", name, err)
	}
	return c.Window, c.Total, c.At, e.Revision(), nil
}

// SwapCounter stores the counter name's window and total, as of now, if
// its key's revision is still revision (0: no key yet), and returns the
// new revision; swapped is false, with no error, when another replica
// changed it first.
func (s *Shared) SwapCounter(ctx context.Context, name, window string, total int64, revision uint64) (newRevision uint64, swapped bool, err error) {
	v, _ := json.Marshal(counter{Window: window, Total: total, At: time.Now().UTC(), Replica: s.id})
	key := counterKey(name)
	if revision == 0 {
		newRevision, err = s.limits.Create(ctx, key, v)
	} else {
		newRevision, err = s.limits.Update(ctx, key, v, revision)
	}
	switch {
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("store: swap counter: %w", err)
	}
	return newRevision, true, nil
}

// PutGauge stores this replica's value of the counter name, which only
// it writes, for ttl: a replica that stops refreshing it is forgotten
// once it expires. It does not wait for the store; a failure is logged.
func (s *Shared) PutGauge(name string, value int64, ttl time.Duration) {
	v, _ := json.Marshal(counter{Total: value, At: time.Now().UTC(), Replica: s.id})
	subject := "$KV." + LimitBucket + "." + counterKey(name)
	if _, err := s.js.PublishAsync(subject, v, jetstream.WithMsgTTL(max(ttl, time.Second).Round(time.Second))); err != nil {
		s.logger.Warn("turn store: running turns not shared", "error", err)
	}
}

// WatchCounters calls fn with every shared counter, then with each
// change, this replica's included, until ctx is done or the store closes.
func (s *Shared) WatchCounters(ctx context.Context, fn func(name, window string, total int64, at time.Time, revision uint64)) error {
	return s.watch.all(ctx, s.limits, func(e jetstream.KeyValueEntry) {
		if e.Operation() != jetstream.KeyValuePut {
			return
		}
		var c counter
		name, err := base64.RawURLEncoding.DecodeString(e.Key())
		if err != nil || json.Unmarshal(e.Value(), &c) != nil {
			return
		}
		fn(string(name), c.Window, c.Total, c.At, e.Revision())
	})
}
