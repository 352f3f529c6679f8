package durable

import (
	"errors"
	"fmt"

	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/wire"
)

// The failures of durable runs. The gRPC face answers each with the status
// that says it (server/durable_status.go): the code, the message (the
// error's text), the ErrorInfo reason and the RetryInfo.
var (
	// ErrNotFound: the log holds no such run (never run, older than its
	// retention, or another client key's).
	ErrNotFound = errors.New("no such turn in the log: never run, or older than its retention")
	// ErrStoreUnreachable: the turn log could not serve the call (the
	// store did not answer, or failed); watching the turn again from the
	// last seq received goes on.
	ErrStoreUnreachable = errors.New("the turn log is unreachable; watch the turn again from the last seq received")
	// ErrTakenOver: another replica took the run over (this one missed
	// renewing its lease and was fenced out of the log); the turn goes on
	// there, so watching it again, on any replica, goes on.
	ErrTakenOver = errors.New("another server took the turn over (this one lost its lease); watch the turn again from the last seq received")
	// ErrNotStored: this replica could not store the run's last events
	// (an append failed or was not acknowledged in time: the log did not
	// answer, or had no room for them); the log holds what was stored.
	ErrNotStored = errors.New("this server could not store the turn's last events (the turn log failed them or had no room for them); " +
		"watch the turn again from the last seq received")
	// ErrHandedOff: this replica, shutting down, handed the run to
	// another; watching it again goes on there.
	ErrHandedOff = errors.New("the server is shutting down and another server takes the turn over; watch the turn again from the last seq received")
	// ErrStoreFull: the store takes no new run now (full of running runs,
	// or its disk is).
	ErrStoreFull = errors.New("the turn store is full: it takes no new turn until running turns end or space returns; retry later, running turns go on")
	// ErrDraining: the server is shutting down and starts no run.
	ErrDraining = errors.New("the server is shutting down; retry the turn")
	// ErrCorrupt: the log holds what this version cannot read (an event
	// that does not decode, or out of order); the server's log line says
	// which.
	ErrCorrupt = errors.New("internal error")
)

// BusyError is the refusal of a run while this replica runs as many as
// it may (server.max_running_turns): a run outlives its stream, so
// streams alone do not bound them. Another replica may take it.
type BusyError struct{ Max int }

// Error implements error.
func (e *BusyError) Error() string {
	return fmt.Sprintf("this server runs as many turns as it may (%d, server.max_running_turns); retry, another replica may take it", e.Max)
}

// PastEndError is the failure of a watch whose after_seq is beyond the
// last event of a finished run: nothing more will come.
type PastEndError struct {
	AfterSeq, Last uint64
}

// Error implements error.
func (e *PastEndError) Error() string {
	return fmt.Sprintf("after_seq %d is past the end of the turn: its last event has seq %d", e.AfterSeq, e.Last)
}

// ReusedError is the refusal of a run whose turn id and attempt already
// ran with a different request.
type ReusedError struct {
	TurnID  string
	Attempt uint32
}

// Error implements error.
func (e *ReusedError) Error() string {
	return fmt.Sprintf("turn %q attempt %d already ran with a different request; use a new turn id, or the next attempt to resume it", e.TurnID, e.Attempt)
}

// ControlCode says why a signal to a running turn (an approval, a
// steering message) was refused. Its values are the gRPC codes the version
// before wrote in the replies replicas exchange, which a cluster of both
// versions still exchanges; they are the codes the call answers with.
type ControlCode uint32

// The refusals of a signal.
const (
	// ControlNotFound: the turn asked for no approval of the call.
	ControlNotFound ControlCode = 5
	// ControlFull: the turn's queue of steering messages is full.
	ControlFull ControlCode = 8
	// ControlEnded: the turn has ended.
	ControlEnded ControlCode = 9
	// ControlInternal: the reply could not be read.
	ControlInternal ControlCode = 13
	// ControlRetry: the turn is starting, or moving to another replica;
	// retrying goes on.
	ControlRetry ControlCode = 14
)

// ControlError is a signal's refusal: its code and the message to answer
// with.
type ControlError struct {
	Code    ControlCode
	Message string
}

// Error implements error.
func (e *ControlError) Error() string { return e.Message }

// attemptError is the failure of a run whose attempt n cannot run: its
// attempt n-1 was never run (or is older than the log's retention).
func attemptError(k Key) error {
	return &runtime.FieldError{Field: "attempt", Description: fmt.Sprintf(
		"attempt %d of turn %q cannot run: its attempt %d was never run (or is older than the log's retention); attempts are numbered from 1, each after the one before",
		k.Attempt, wire.Clip(k.TurnID, wire.MaxEchoBytes), k.Attempt-1)}
}

// takenOver reports that err is the store's failure of a run another
// replica claimed from this one; the store's error says so by a method, as
// the server does not import the store.
func takenOver(err error) bool {
	var lost interface{ TakenOver() bool }
	return errors.As(err, &lost) && lost.TakenOver()
}

// orphaned reports that err is the store's failure of a watch whose run
// has no live owner and no terminal event.
func orphaned(err error) bool {
	var o interface{ Orphaned() bool }
	return errors.As(err, &o) && o.Orphaned()
}
