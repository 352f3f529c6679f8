package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// signalWait bounds the wait for an owner's reply to a signal when the
// caller's context has no earlier deadline: an owner answers a cancel
// once the run's last event is stored (within 30 s), anything else at
// once, so a longer silence is a lost message (an inbox that overflowed).
const signalWait = time.Minute

// goneReply is the inbox's answer to a message for a run this replica does
// not own (it gave the run up, or another replica claimed it since its
// last owner record was read): the sender takes it as no owner, as it
// takes NATS' "no responders" from a replica that is gone.
const goneReply = "\x00gone"

// Signal sends signal to the owner of the run and returns its reply; it
// fails with [fs.ErrNotExist] when no replica owns the run.
//
// The owner is the replica its last owner record names ([ownerHeader]):
// the signal goes to that replica's inbox, which answers "no owner"
// ([goneReply]) for a run it does not own (any more), while a replica
// that is gone leaves NATS to answer "no responders". A record with no
// owner named is a replica's of the version before, which listens on the
// run's own subject ([runKey.control]): the signal goes there, when the
// run holds a lease (a run without one has no owner).
func (s *Store) Signal(ctx context.Context, turnID string, attempt uint32, signal string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, signalWait)
	defer cancel()
	k := runKey{turnID, attempt}
	owner, err := owner(ctx, s.stream, k)
	if err == nil && owner == "" {
		// An owner of the version before. Replicas of this version hear
		// its run's subject too and answer only for their own runs, so a
		// question nobody owns would wait for signalWait: the lease tells.
		var leased bool
		if leased, err = s.leases.leased(ctx, k); err == nil && !leased {
			err = fs.ErrNotExist
		}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("store: run %q attempt %d has no owner: %w", turnID, attempt, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("store: signal: %w", err)
	}
	m, err := s.nc.RequestWithContext(ctx, k.controlAt(owner), []byte(signal))
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

// notifyWait bounds the read of the owner record that tells Notify where
// to send.
const notifyWait = time.Second

// Notify sends signal to the owner of the run without waiting for a reply;
// nobody may be listening.
func (s *Store) Notify(turnID string, attempt uint32, signal string) {
	ctx, cancel := context.WithTimeout(s.closing, notifyWait)
	defer cancel()
	k := runKey{turnID, attempt}
	if owner, err := owner(ctx, s.stream, k); err == nil {
		_ = s.nc.Publish(k.controlAt(owner), []byte(signal))
	}
}

// ownerHeader names, in each owner record of a run (the first, Create's,
// and each claim's), the replica that wrote it: the run's owner while the
// record is the last, to which signals and liveness questions go.
const ownerHeader = "Turnstile-Owner"

// ownerRecord returns the header of an owner record written by this
// replica.
func (s *Store) ownerRecord() nats.Header { return nats.Header{ownerHeader: []string{s.id}} }

// owner returns the replica named by the last owner record of run k in
// stream, the log: "", when the record names none (a replica of the
// version before wrote it); [fs.ErrNotExist] when the run has no record.
func owner(ctx context.Context, stream jetstream.Stream, k runKey) (string, error) {
	m, err := stream.GetLastMsgForSubject(ctx, k.own())
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return "", fs.ErrNotExist
	}
	if err != nil {
		return "", fmt.Errorf("read run: %w", err)
	}
	return m.Header.Get(ownerHeader), nil
}

// replicaRoot prefixes the core NATS subjects of each replica's inbox:
// replicaRoot.<replica>.<turn>.<attempt>, and .alive after it for the
// liveness question. One subscription per replica takes them all.
const replicaRoot = "turnstile.replica"

// controlAt is the subject of run k's signals at its owner, the replica
// owner; the run's own subject when owner is "" (an owner of the version
// before).
func (k runKey) controlAt(owner string) string {
	if owner == "" {
		return k.control()
	}
	return replicaRoot + "." + owner + "." + k.lease()
}

// aliveAt is the subject of run k's liveness question at its owner, as
// controlAt.
func (k runKey) aliveAt(owner string) string { return k.controlAt(owner) + ".alive" }

// inbox receives the signals and liveness questions of every run this
// replica owns, on two subscriptions made at [Open], none per run: one to
// this replica's subjects (replicaRoot.<id>.>), where a message for a run
// this replica does not own is answered "no owner" ([goneReply]), and one
// to every run's own subject (controlRoot.>), where a replica of the
// version before sends them during a rolling upgrade and only the run's
// owner answers (see README, "Durable turns"). Both deliver into one
// channel, read by one goroutine ([inbox.answer]).
//
// A subscription per run made NATS answer "no responders" for a run no
// replica owns, but cost a SUB and an UNSUB on each of the run's two
// subjects per turn, and their state on both sides of the connection for
// the run's whole life (BENCHMARKS.md, issue #26).
type inbox struct {
	msgs   chan *nats.Msg
	prefix string // of this replica's subjects: replicaRoot.<id>.
	mu     sync.Mutex
	runs   map[string]*writer // by the run's lease key: <turn>.<attempt>
}

// inboxSize bounds the messages waiting for the inbox's goroutine. It
// answers a liveness question at once and hands each signal to a
// goroutine of its own, so it is behind only while the process is
// starved; NATS drops what comes beyond the bound (a slow consumer), as it
// did beyond a handler's pending limits, and the sender's request times
// out.
const inboxSize = 4096

// start subscribes the inbox of the replica on nc and starts its
// goroutine; it ends when closed is.
func (in *inbox) start(nc *nats.Conn, replica string, closed <-chan struct{}) error {
	in.msgs = make(chan *nats.Msg, inboxSize)
	in.prefix = replicaRoot + "." + replica + "."
	in.runs = map[string]*writer{}
	for _, subj := range []string{in.prefix + ">", controlRoot + ".>"} {
		if _, err := nc.ChanSubscribe(subj, in.msgs); err != nil {
			return fmt.Errorf("store: control subscription: %w", err)
		}
	}
	// Subscribed before the first run: a Create's signal may come at once.
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("store: control subscription: %w", err)
	}
	go in.answer(closed)
	return nil
}

// answer passes the inbox's messages to their runs until closed is
// closed: a liveness question is answered here, a signal on a goroutine of
// its own (its handler may take its time: a cancel waits for the run's
// last event to be stored).
func (in *inbox) answer(closed <-chan struct{}) {
	for {
		var m *nats.Msg
		select {
		case m = <-in.msgs:
		case <-closed:
			return
		}
		run, mine := strings.CutPrefix(m.Subject, in.prefix)
		if !mine {
			run = strings.TrimPrefix(m.Subject, controlRoot+".")
		}
		run, alive := strings.CutSuffix(run, ".alive")
		in.mu.Lock()
		w := in.runs[run]
		in.mu.Unlock()
		switch {
		case w == nil && mine:
			// Not (or no longer) this replica's run: as NATS' "no
			// responders" from a replica that is gone. A request is
			// answered, or its sender would wait for a reply that never
			// comes.
			if m.Reply != "" {
				_ = m.Respond([]byte(goneReply))
			}
		case w == nil:
			// A run's own subject, of a run this replica does not own:
			// its owner, if any, answers.
		case alive:
			reply := "stopped"
			if w.renewing() {
				reply = aliveReply
			}
			_ = m.Respond([]byte(reply))
		default:
			go w.signal(m)
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

// listen makes the inbox pass w's signals and liveness questions to w.
func (in *inbox) listen(w *writer) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.runs[w.key.lease()] = w
}

// leave ends what listen started: w's run is not this replica's any more.
func (in *inbox) leave(w *writer) { in.forget(w) }

// forget removes w's run from the inbox, unless another writer's since.
func (in *inbox) forget(w *writer) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if key := w.key.lease(); in.runs[key] == w {
		delete(in.runs, key)
	}
}
