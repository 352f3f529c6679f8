package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// signalWait bounds the wait for an owner's reply to a signal when the
// caller's context has no earlier deadline: an owner answers a cancel
// once the run's last event is stored (within 30 s), anything else at
// once, so a longer silence is a lost message (an inbox that overflowed).
const signalWait = time.Minute

// goneReply is the inbox's answer to a message for a run this replica
// gave up after the message was queued: the sender takes it as no owner.
const goneReply = "\x00gone"

// Signal sends signal to the owner of the run and returns its reply; it
// fails with [fs.ErrNotExist] when no replica owns the run.
func (s *Store) Signal(ctx context.Context, turnID string, attempt uint32, signal string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, signalWait)
	defer cancel()
	m, err := s.nc.RequestWithContext(ctx, runKey{turnID, attempt}.control(), []byte(signal))
	if err == nil && string(m.Data) == goneReply {
		err = nats.ErrNoResponders
	}
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

// inbox receives the signals and liveness questions of every run this
// replica owns. Each run keeps subscriptions of its own to its control and
// alive subjects, so a Signal to a run that no replica owns is told so by
// NATS' "no responders"; but they deliver into one channel, read by one
// goroutine ([Store.answer]). A subscription with a handler of its own
// runs a goroutine for its subject, which cost two goroutines per run for
// the run's whole life (the memory of a held turn, and their start and
// end in every turn: BENCHMARKS.md, issue #26).
type inbox struct {
	msgs chan *nats.Msg
	mu   sync.Mutex
	runs map[string]inboxEntry // by subscribed subject
}

// inboxEntry is the run a subject of the inbox belongs to, and whether it
// is the run's alive subject (else its control subject).
type inboxEntry struct {
	w     *writer
	alive bool
}

// inboxSize bounds the messages waiting for the inbox's goroutine. It
// answers a liveness question at once and hands each signal to a
// goroutine of its own, so it is behind only while the process is
// starved; NATS drops what comes beyond the bound (a slow consumer), as it
// did beyond a handler's pending limits, and the sender's request times
// out.
const inboxSize = 4096

// startInbox starts the inbox's goroutine; it ends when the store closes.
func (s *Store) startInbox() {
	s.inbox.msgs = make(chan *nats.Msg, inboxSize)
	s.inbox.runs = map[string]inboxEntry{}
	go s.answer()
}

// answer passes the inbox's messages to their runs until the store
// closes: a liveness question is answered here, a signal on a goroutine of
// its own (its handler may take its time: a cancel waits for the run's
// last event to be stored).
func (s *Store) answer() {
	for {
		var m *nats.Msg
		select {
		case m = <-s.inbox.msgs:
		case <-s.closed:
			return
		}
		s.inbox.mu.Lock()
		e, ok := s.inbox.runs[m.Subject]
		s.inbox.mu.Unlock()
		switch {
		case !ok:
			// The run was given up since: as if unsubscribed, but a
			// request queued before that is answered, or its sender
			// would wait for a reply that never comes.
			if m.Reply != "" {
				_ = m.Respond([]byte(goneReply))
			}
		case e.alive:
			reply := "stopped"
			if e.w.renewing() {
				reply = aliveReply
			}
			_ = m.Respond([]byte(reply))
		default:
			go e.w.signal(m)
		}
	}
}

// signal answers m, a signal sent to w's run, with the run's handler.
func (w *writer) signal(m *nats.Msg) {
	reply := w.onSignal(string(m.Data))
	if m.Reply != "" {
		_ = m.Respond(reply)
	}
}

// listen subscribes w's control and alive subjects to the inbox.
func (in *inbox) listen(nc *nats.Conn, w *writer) error {
	ctl := w.key.control()
	alive := w.key.alive()
	// Known before subscribed: a signal may come at once.
	in.mu.Lock()
	in.runs[ctl] = inboxEntry{w: w}
	in.runs[alive] = inboxEntry{w: w, alive: true}
	in.mu.Unlock()
	var err error
	if w.sub, err = nc.ChanSubscribe(ctl, in.msgs); err == nil {
		if w.alive, err = nc.ChanSubscribe(alive, in.msgs); err != nil {
			_ = w.sub.Unsubscribe()
		}
	}
	if err != nil {
		in.forget(w, ctl, alive)
		return fmt.Errorf("store: control subscription: %w", err)
	}
	return nil
}

// leave unsubscribes w's subjects from the inbox.
func (in *inbox) leave(w *writer) {
	_ = w.sub.Unsubscribe()
	_ = w.alive.Unsubscribe()
	in.forget(w, w.sub.Subject, w.alive.Subject)
}

// forget removes w's subjects from the inbox, unless another run's since.
func (in *inbox) forget(w *writer, subjects ...string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, subj := range subjects {
		if in.runs[subj].w == w {
			delete(in.runs, subj)
		}
	}
}
