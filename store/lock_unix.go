//go:build unix

package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockDir takes an exclusive lock on dir for this process, so two
// embedded servers never write one file store: the second one fails.
func lockDir(dir string) (release func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, "turnstile.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("store: store.dir %s is in use by another turnstile process: give each process its own store.dir, or share a NATS cluster with store.mode: nats", dir)
		}
		return nil, fmt.Errorf("store: lock %s: %w", dir, err)
	}
	return func() { f.Close() }, nil
}
