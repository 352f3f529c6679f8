package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/nats-io/nats.go"
)

// Signal sends signal to the owner of the run and returns its reply; it
// fails with [fs.ErrNotExist] when no replica owns the run.
func (s *Store) Signal(ctx context.Context, turnID string, attempt uint32, signal string) ([]byte, error) {
	m, err := s.nc.RequestWithContext(ctx, runKey{turnID, attempt}.control(), []byte(signal))
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, fmt.Errorf("store: run %q attempt %d has no owner: %w", turnID, attempt, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("store: signal: %w", err)
	}
	return m.Data, nil
}

// Notify sends signal to the owner of the run without waiting for a reply;
// nobody may be listening.
func (s *Store) Notify(turnID string, attempt uint32, signal string) {
	_ = s.nc.Publish(runKey{turnID, attempt}.control(), []byte(signal))
}
