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

// budget is the value of a model's key in the budget bucket.
type budget struct {
	Earned  float64   `json:"earned"`
	At      time.Time `json:"at"`
	Replica string    `json:"replica"`
}

func budgetKey(alias string) string { return base64.RawURLEncoding.EncodeToString([]byte(alias)) }

// LoadBudget returns the retry budget of alias that the replicas share:
// what retry outcomes added to it as of at, and the key's revision; 0
// when none is stored.
func (s *Shared) LoadBudget(ctx context.Context, alias string) (earned float64, at time.Time, revision uint64, err error) {
	e, err := s.budgets.Get(ctx, budgetKey(alias))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, time.Time{}, 0, nil
	}
	if err != nil {
		return 0, time.Time{}, 0, fmt.Errorf("store: load budget: %w", err)
	}
	var b budget
	if err := json.Unmarshal(e.Value(), &b); err != nil {
		return 0, time.Time{}, 0, fmt.Errorf("store: budget of %q: %w", alias, err)
	}
	return b.Earned, b.At, e.Revision(), nil
}

// SwapBudget stores the shared retry budget of alias if its key's revision
// is still revision (0: no key yet), and returns the new revision; swapped
// is false when another replica changed it first.
func (s *Shared) SwapBudget(ctx context.Context, alias string, earned float64, at time.Time, revision uint64) (newRevision uint64, swapped bool, err error) {
	v, _ := json.Marshal(budget{Earned: earned, At: at.UTC(), Replica: s.id})
	key := budgetKey(alias)
	if revision == 0 {
		newRevision, err = s.budgets.Create(ctx, key, v)
	} else {
		newRevision, err = s.budgets.Update(ctx, key, v, revision)
	}
	switch {
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("store: swap budget: %w", err)
	}
	return newRevision, true, nil
}

// WatchBudgets calls fn with every shared retry budget, then with each
// change, this replica's included, until ctx is done or the store closes.
func (s *Shared) WatchBudgets(ctx context.Context, fn func(alias string, earned float64, at time.Time, revision uint64)) error {
	return s.watch.all(ctx, s.budgets, func(e jetstream.KeyValueEntry) {
		if e.Operation() != jetstream.KeyValuePut {
			return
		}
		var b budget
		alias, err := base64.RawURLEncoding.DecodeString(e.Key())
		if err != nil || json.Unmarshal(e.Value(), &b) != nil {
			return
		}
		fn(string(alias), b.Earned, b.At, e.Revision())
	})
}
