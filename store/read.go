package store

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoOwner is the failure of a watch whose run stopped receiving events
// and has no live owner: the replica that ran it went away. It has the
// method Orphaned, true, by which a caller that does not import the store
// tells it from a failure of the store.
var ErrNoOwner error = noOwnerError{}

type noOwnerError struct{}

func (noOwnerError) Error() string {
	return "store: the run has no live owner and no terminal event"
}

// Orphaned reports that the run has no live owner.
func (noOwnerError) Orphaned() bool { return true }

// readFrames calls fn with each frame of run k stored after the stream
// sequence after, in order, with the index of its first event, until fn
// returns false or no frame is left; it returns the stream sequence of the
// last frame read (after, when none). The frames come in batches, each
// one direct get request (served by any replica of the stream: no
// consumer is made), so that a run's whole log is a few round trips, not
// one a frame: a replica taking over many runs at once reads them all.
func (s *Store) readFrames(ctx context.Context, k runKey, after uint64, fn func(first uint64, events [][]byte) bool) (uint64, error) {
	for {
		b, err := held(s.keeper, ctx, func(ctx context.Context) (directRead, error) {
			return directBatch(ctx, s.closed, s.nc, s.stream, k.events(), after+1)
		})
		if err != nil {
			return after, fmt.Errorf("store: read run: %w", err)
		}
		for _, m := range b.msgs {
			seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
			if err != nil {
				return after, errors.New("store: read run: a frame without its stream sequence")
			}
			after = seq
			first, events, err := decodeFrame(m.Header, m.Data)
			if err != nil {
				return after, err
			}
			if !fn(first, events) {
				return after, nil
			}
		}
		if !b.more {
			return after, nil
		}
	}
}

// directRead is one batch of a direct get: its messages, whether more
// may follow them, and the stream sequence of its last message (read
// from the batch's end, which says it whether or not the messages carry
// their headers).
type directRead struct {
	msgs []*nats.Msg
	more bool
	last uint64
}

// Bounds of one batched direct get.
const (
	// directBatchFrames is how many frames one request asks for.
	directBatchFrames = 256
	// directBatchBytes bounds the bytes one request's answer brings, a
	// frame beyond it coming alone.
	directBatchBytes = 64 << 10
	// directGetTimeout bounds each request, whatever its caller's
	// deadline: the jetstream package's default for its API requests.
	directGetTimeout = 5 * time.Second
)

// directBatch reads the messages of subject from the stream sequence
// from on, in a batch of one direct get request. A subject without any
// from there is an empty batch, not an error. A request waits
// directGetTimeout at most, as the jetstream package's single gets do,
// whatever deadline ctx has: an answer lost with the connection (closing
// one drops the replies on their way, and leaves the inbox's channel open)
// must not hold a watch for its client's whole deadline. It fails with
// [ErrClosed] once closed (the store's) is.
func directBatch(ctx context.Context, closed <-chan struct{}, nc *nats.Conn, stream jetstream.Stream, subject string, from uint64) (directRead, error) {
	return directBatchOf(ctx, closed, nc, stream, subject, from, false)
}

// directBatchOf is [directBatch], whose messages come without their
// headers when noHeaders is set (JetStream's no_hdr): the stored ones,
// and the six the server adds to each message of a batch (the stream,
// the subject, the sequence, the time, the pending and last sequences),
// each written by the server and parsed by the client. A server that
// does not know the field sends them as before.
func directBatchOf(ctx context.Context, closed <-chan struct{}, nc *nats.Conn, stream jetstream.Stream, subject string, from uint64, noHeaders bool) (directRead, error) {
	ctx, cancel := context.WithTimeout(ctx, directGetTimeout)
	defer cancel()
	req, err := json.Marshal(struct {
		Seq       uint64 `json:"seq"`
		NextFor   string `json:"next_by_subj"`
		Batch     int    `json:"batch"`
		MaxBytes  int    `json:"max_bytes"`
		NoHeaders bool   `json:"no_hdr,omitempty"`
	}{from, subject, directBatchFrames, directBatchBytes, noHeaders})
	if err != nil {
		return directRead{}, err
	}
	// The answer's messages come into a channel that holds them all: a
	// batch's frames and its end. A synchronous subscription's channel
	// holds 64K messages, 512 KiB allocated and cleared for each read,
	// which made the reads of many runs at once (a replica taking over
	// many) wait for the collector (BENCHMARKS.md, issue 37, row 4).
	inbox := nc.NewRespInbox()
	answer := make(chan *nats.Msg, directBatchFrames+1)
	sub, err := nc.ChanSubscribe(inbox, answer)
	if err != nil {
		return directRead{}, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(directGetPrefix+stream.CachedInfo().Config.Name, inbox, req); err != nil {
		return directRead{}, err
	}
	var r directRead
	for {
		var m *nats.Msg
		select {
		case m = <-answer:
		case <-ctx.Done():
			return directRead{}, ctx.Err()
		case <-closed:
			return directRead{}, ErrClosed
		}
		switch status := m.Header.Get(statusHeader); status {
		case "":
			r.msgs = append(r.msgs, m)
		case "204": // the batch's end: more when some are pending
			pending, _ := strconv.ParseUint(m.Header.Get(numPendingHeader), 10, 64)
			r.last, _ = strconv.ParseUint(m.Header.Get(lastSeqHeader), 10, 64)
			r.more = pending > 0 && len(r.msgs) > 0
			return r, nil
		case "404": // none from there on
			return r, nil
		case "503":
			return directRead{}, nats.ErrNoResponders
		default:
			return directRead{}, fmt.Errorf("direct get answered %s %s", status, m.Header.Get(descriptionHeader))
		}
	}
}

// The direct get API's subject prefix (the stream's name follows), and
// the headers of its status answers.
const (
	directGetPrefix   = "$JS.API.DIRECT.GET."
	statusHeader      = "Status"
	descriptionHeader = "Description"
	numPendingHeader  = "Nats-Num-Pending"
	lastSeqHeader     = "Nats-Last-Sequence"
)

// decodeFrame returns the index of a frame's first event and its events.
func decodeFrame(h nats.Header, data []byte) (uint64, [][]byte, error) {
	first, err := strconv.ParseUint(h.Get(firstHeader), 10, 64)
	if err != nil || first == 0 {
		return 0, nil, errors.New("store: a frame of the log has no first event index")
	}
	events, err := splitFrame(data)
	return first, events, err
}

// Record returns the first record of the run (turnID, attempt): the one
// Create stored. It fails with [fs.ErrNotExist] when the store holds no
// such run.
func (s *Store) Record(ctx context.Context, turnID string, attempt uint32) ([]byte, error) {
	k := runKey{turnID, attempt}
	m, err := s.stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(k.own()))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("store: run %q attempt %d: %w", turnID, attempt, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("store: read run: %w", err)
	}
	return m.Data, nil
}

// LatestAttempt returns the highest attempt of turnID the store holds, or
// [fs.ErrNotExist].
func (s *Store) LatestAttempt(ctx context.Context, turnID string) (uint32, error) {
	k := runKey{turnID: turnID}
	filter := subjectRoot + "." + k.token() + ".*.own"
	info, err := s.stream.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return 0, fmt.Errorf("store: list attempts: %w", err)
	}
	var latest uint64
	for subj := range info.State.Subjects {
		parts := strings.Split(subj, ".")
		if len(parts) < 2 {
			continue
		}
		if n, err := strconv.ParseUint(parts[len(parts)-2], 10, 32); err == nil && n > latest {
			latest = n
		}
	}
	if latest == 0 {
		return 0, fmt.Errorf("store: turn %q: %w", turnID, fs.ErrNotExist)
	}
	return uint32(latest), nil
}

// Events returns the events of the run (turnID, attempt) after the first
// afterSeq ones, in order: the stored ones, then each one as it is
// stored. The sequence never ends by itself while the run has an owner:
// the caller stops when it has seen the run's last event. When no event
// arrives for a lease TTL and the run has no live owner, it yields
// [ErrNoOwner]; a failure of the store or ctx's end is yielded too, last.
//
// It holds no JetStream consumer: stored frames are read by direct gets,
// and live ones arrive on a core NATS subscription to the run's subject,
// made first; a frame missed there (a slow reader) is read from the store,
// as is, after a lease TTL without a frame, any frame stored since, and,
// until the first frame comes live, what was stored since the last read,
// 25 ms after the first read and then twice as long each time.
func (s *Store) Events(ctx context.Context, turnID string, attempt uint32, afterSeq uint64) iter.Seq2[[]byte, error] {
	return func(yield func([]byte, error) bool) {
		k := runKey{turnID, attempt}
		live := make(chan *nats.Msg, 256)
		sub, err := s.nc.ChanSubscribe(k.events(), live)
		if err != nil {
			yield(nil, fmt.Errorf("store: watch run: %w", err))
			return
		}
		defer func() { _ = sub.Unsubscribe() }()
		next := afterSeq + 1 // the index of the next event to yield
		stopped := false
		// deliver yields the events of a frame that are due; it reports
		// whether the frame left a gap before them.
		deliver := func(first uint64, events [][]byte) (gap bool) {
			if first > next {
				return true
			}
			for i, ev := range events {
				if first+uint64(i) < next {
					continue
				}
				if !yield(ev, nil) {
					stopped = true
					return false
				}
				next++
			}
			return false
		}
		var read uint64 // the stream sequence of the last frame read
		catchUp := func() error {
			var err error
			read, err = s.readFrames(ctx, k, read, func(first uint64, events [][]byte) bool {
				deliver(first, events)
				return !stopped
			})
			return err
		}
		start := catchUp
		if afterSeq > 0 {
			// A watch from an event on (a client that re-attaches) needs the
			// log only from the frame that holds it, most often the last.
			start = func() error {
				seq, ok, err := s.readFromLast(ctx, k, next, deliver)
				if err != nil || ok {
					read = seq
					return err
				}
				return catchUp()
			}
		}
		if err := start(); err != nil {
			yield(nil, err)
			return
		}
		quiet := time.NewTimer(s.cfg.LeaseTTL)
		defer quiet.Stop()
		// Until a frame comes live, the log is read again after settleFirst,
		// then after twice as long each time, up to a lease TTL: a frame
		// published before the live subscription was in place, and stored
		// only after the first read (the stream may answer a read before
		// it stores a frame sent to it earlier), reaches the watch
		// neither way, and with nothing after it (a run's last frames: the
		// rest of a turn taken over after a hand-off) the watch waited for
		// its first quiet check, a lease TTL later (TestShutdownHandsOff,
		// a few runs in a hundred, on main too). The first frame that
		// comes live ends it: a frame missed before it leaves a gap, which
		// is read then.
		settleWait := settleFirst
		settle := time.NewTimer(min(settleWait, s.cfg.LeaseTTL))
		defer settle.Stop()
		settled := settle.C
		for !stopped {
			select {
			case <-settled:
				if err := catchUp(); err != nil {
					if !stopped {
						yield(nil, err)
					}
					return
				}
				if settleWait *= 2; settleWait < s.cfg.LeaseTTL {
					settle.Reset(settleWait)
				} else {
					settled = nil
				}
			case m := <-live:
				if settled != nil {
					settle.Stop()
					settled = nil
				}
				first, events, err := decodeFrame(m.Header, m.Data)
				if err != nil {
					yield(nil, err)
					return
				}
				if deliver(first, events) {
					// Missed frames: the store has them. This one it may
					// not have yet: a frame reaches its subscribers as it
					// is published, before the stream stores it. What the
					// read leaves of it comes from the frame itself; a
					// watch whose read filled the gap but not this frame's
					// events waited for a frame after it or, for a run's
					// last frame, for its first quiet check, a lease TTL
					// later.
					if err := catchUp(); err != nil {
						yield(nil, err)
						return
					}
					if !stopped {
						deliver(first, events)
					}
				}
				quiet.Reset(s.cfg.LeaseTTL)
			case <-quiet.C:
				// A quiet run may have stored a frame this watch missed: one
				// published before the subscription was in place, and not yet
				// stored when the first catch-up read.
				before := next
				err := catchUp()
				if err == nil && next == before && !stopped {
					var gone bool
					gone, err = s.ownerGone(ctx, k, next-1)
					if err == nil && gone {
						// One more look: events stored since the last one seen.
						if err = catchUp(); err == nil && next == before {
							err = ErrNoOwner
						}
					}
				}
				if err != nil {
					if !stopped {
						yield(nil, err)
					}
					return
				}
				quiet.Reset(s.cfg.LeaseTTL)
			case <-ctx.Done():
				yield(nil, ctx.Err())
				return
			case <-s.closed:
				// The live subscription is gone with the connection.
				yield(nil, ErrClosed)
				return
			}
		}
	}
}

// settleFirst is how long after its first read a watch that has had no
// frame live reads the log again (see [Store.Events]).
const settleFirst = 25 * time.Millisecond

// readFromLast is the first read of a watch of run k that yields its
// events from index next on: the log's last frame, by one direct get,
// handed to deliver when it holds event next or any before it (frames are
// stored in the order of their events, so no earlier frame holds an event
// the watch needs). It returns the stream sequence of the last frame read,
// from which the reads that follow go on, and false when the events the
// watch needs begin before the last frame: the log is read from its start
// then. A log without a frame is read whole (true, at 0): its frames come
// on the watch's live subscription, made before.
//
// A client that re-attaches after a hand-off, which holds every event the
// log has, read the whole log before: each frame of the run one reply,
// which the new owner's claim reads too, and which, with many runs handed
// off at once, were most of what NATS answered (BENCHMARKS.md, issue 37,
// row 4).
func (s *Store) readFromLast(ctx context.Context, k runKey, next uint64, deliver func(first uint64, events [][]byte) bool) (uint64, bool, error) {
	m, err := held(s.keeper, ctx, func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
		return s.stream.GetLastMsgForSubject(ctx, k.events())
	})
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, true, nil
	case err != nil:
		return 0, false, fmt.Errorf("store: read run: %w", err)
	}
	first, events, err := decodeFrame(m.Header, m.Data)
	if err != nil {
		return 0, false, err
	}
	if first > next {
		return 0, false, nil
	}
	deliver(first, events)
	return m.Sequence, true, nil
}

// ownerGone reports whether run k has no lease and no event stored after
// the one at index last.
func (s *Store) ownerGone(ctx context.Context, k runKey, last uint64) (bool, error) {
	leased, err := s.leases.leased(ctx, k)
	switch {
	case err != nil:
		return false, fmt.Errorf("store: read lease: %w", err)
	case leased:
		return false, nil
	}
	// An owner that took the run less than a lease TTL ago may not have
	// written its lease yet (the first write is not waited for).
	own, err := held(s.keeper, ctx, func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
		return s.stream.GetLastMsgForSubject(ctx, k.own())
	})
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("store: read run: %w", err)
	case time.Since(own.Time) < s.cfg.LeaseTTL:
		return false, nil
	}
	m, err := held(s.keeper, ctx, func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
		return s.stream.GetLastMsgForSubject(ctx, k.events())
	})
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("store: read run: %w", err)
	}
	first, events, err := decodeFrame(m.Header, m.Data)
	if err != nil {
		return false, err
	}
	return first+uint64(len(events))-1 <= last, nil
}

// LastEvent returns the last event stored for the run, or
// [fs.ErrNotExist] when it has none.
func (s *Store) LastEvent(ctx context.Context, turnID string, attempt uint32) ([]byte, error) {
	m, err := s.stream.GetLastMsgForSubject(ctx, runKey{turnID, attempt}.events())
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("store: run %q attempt %d has no event: %w", turnID, attempt, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("store: read run: %w", err)
	}
	_, events, err := decodeFrame(m.Header, m.Data)
	if err != nil || len(events) == 0 {
		return nil, fmt.Errorf("store: read run: %w", cmp.Or(err, errors.New("an empty frame")))
	}
	return events[len(events)-1], nil
}
