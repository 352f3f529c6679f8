package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// ErrStopped is the error of a turn whose caller stopped ranging over
// [Turn.Events] before the turn ended; its stream was dropped, which a
// server with a turn store takes for a detach: [Turn.Close] cancels the
// run.
var ErrStopped = errors.New("client: iteration stopped before the turn ended")

// Event is one step of a turn as the client sees it: either an event the
// server sent (Agent) or a signal of the client's own (StepRetry). Exactly
// one of the two is set.
type Event struct {
	// Attempt numbers the client's attempt at the turn that the event
	// belongs to, from 1. The server numbers the events of each attempt
	// (AgentEvent.seq) from 1 again.
	Attempt int
	// Agent is an event sent by the server. An error event ends an
	// attempt, not necessarily the turn: a StepRetry event or the turn's
	// error follows it.
	Agent *turnstilev1.AgentEvent
	// StepRetry says the attempt failed and the client runs the failed
	// step again once Delay has passed.
	StepRetry *StepRetry
}

// StepRetry is the client's signal that it resumes a failed turn with a
// new attempt.
type StepRetry struct {
	// Attempt is the number of the attempt about to start, from 2.
	Attempt int
	// MaxAttempts is the most attempts the client makes at the turn.
	MaxAttempts int
	// Delay is how long the client waits before the attempt.
	Delay time.Duration
	// Err is the failure of the attempt that ended.
	Err *TurnError
	// DiscardPartial reports that output was streamed since the last
	// message that stands (the last of Messages, or the turn's start):
	// text, thinking and tool call deltas, and any message committed after
	// it, were never committed and every consumer must drop them. The new
	// attempt streams that step afresh.
	DiscardPartial bool
	// Messages are the messages the turn committed so far that stand; the
	// new attempt re-sends them after the request's own, so the work they
	// hold (tool results above all) is not done again.
	Messages []*turnstilev1.Message
	// Conversation is what the new attempt sends: the request's messages
	// and Messages, with the compactions the server made applied (see
	// [Result.Conversation]).
	Conversation []*turnstilev1.Message
}

// Result is the outcome of a turn that completed.
type Result struct {
	// TurnID is the turn's id.
	TurnID string
	// EndReason says why the turn ended.
	EndReason turnstilev1.EndReason
	// Messages are the messages the turn added, across every attempt, in
	// order: append them to the conversation. With
	// END_REASON_TOOL_CALLS_REQUIRED the last one holds the tool calls the
	// caller must run.
	Messages []*turnstilev1.Message
	// Conversation is the conversation to send in the next turn (followed
	// by its new messages): the request's messages and Messages, with each
	// compaction the server made applied (compaction events: what replaces
	// what). When the server compacted the conversation, Messages appended
	// to the caller's history would send the whole history again, to be
	// compacted again; Conversation is compacted once.
	Conversation []*turnstilev1.Message
	// Usage is the tokens used by every attempt, failed ones included.
	Usage *turnstilev1.Usage
	// Counters count what happened in every attempt.
	Counters *turnstilev1.TurnCounters
	// Attempts is the number of attempts the client made.
	Attempts int
	// Reattaches is the number of times the client re-attached to a run
	// whose stream broke (WatchTurn calls), across every attempt.
	Reattaches int
}

// Turn is a turn started by [Client.RunTurn]. Range over [Turn.Events] once
// to run it, then read [Turn.Result] and [Turn.Err]. A Turn is not safe for
// concurrent use.
type Turn struct {
	c       *Client
	ctx     context.Context // the caller's, for the whole turn and its retries
	req     *turnstilev1.RunTurnRequest
	opts    turnOptions
	started bool
	// answered holds the approval requests the hook was called for, and
	// those seen decided.
	answered map[approvalKey]bool
	res      *Result
	err      error

	mu     sync.Mutex
	closed bool
	// stop cancels the context the turn runs under, while it runs.
	stop context.CancelCauseFunc
	// left is the attempt whose stream the caller left by stopping the
	// iteration, while the run may go on; 0 otherwise.
	left int
	// wire is the number on the wire of the attempt whose events the turn
	// yields, from its first event; 0 before.
	wire int
}

// RunTurn prepares one turn of req; it runs as the caller ranges over
// [Turn.Events] (or calls [Turn.Wait]). ctx bounds the whole turn, retries
// and their delays included.
//
// Cancelling and leaving differ. When ctx ends (cancelled, or its deadline
// passed) or [Turn.Close] is called while the turn runs, the client
// cancels the turn on the server: it calls CancelTurn for the running
// attempt and keeps reading its stream until the server's CANCELLED error
// event, for at most the client's cancel timeout (2s by default, see
// [WithCancelTimeout]); the server stops the model call and tools and
// sends, before that event, message_completed events for what the turn
// had (the partial reply, a "cancelled by the user" result for every tool
// call that did not run, an interruption note). The iteration yields them
// and the turn fails with a [*TurnError] of code CANCELLED (or
// DEADLINE_EXCEEDED) whose Messages hold every message the turn
// committed: append them to the conversation and the next turn continues
// from it. A server without a turn store answers CancelTurn
// FAILED_PRECONDITION; there the dropped stream is what cancels the turn.
// Stopping the iteration early (break) only drops the stream: a server
// with a turn store keeps running the turn for turn.detach_grace (30s),
// as it does when the program dies, and [Turn.Close] cancels it.
//
// When req has no turn_id the client makes one, so every attempt shares
// it. Each attempt is a run of its own on the server, named by the turn id
// and its number (RunTurnRequest.attempt, and the turnstile-attempt
// metadata for older servers).
//
// A stream that breaks before the attempt's last event (a connection
// reset, a replica that went away) is first resumed, not retried: the
// client re-attaches to the same run with WatchTurn from the seq of the
// last event it received, on any replica, for up to the re-attach
// timeout (30s by default, see [WithReattachTimeout]) from the break, and
// the iteration goes on with the next event; nothing is run again and no
// event is repeated: a server restarting, or a replica taking the turn
// over, is outlasted. This needs a server with a turn store; a
// server without one, or one that never stored the run, makes the break
// stand.
//
// An attempt that ends with an error event whose retryable is true, or
// whose break stands with a status the transport gave (UNAVAILABLE), is
// followed by a [StepRetry] event and a new attempt, up to the client's
// MaxStepRetries, after the server's retry delay or else the client's
// jittered backoff. The new attempt resumes the turn: its request carries
// req's messages plus the messages the failed attempts committed
// (message_completed events). An error whose retryable is false or unset
// is returned at once; so is a break that stands while server-side tools
// were running, as they may have had effects.
//
// A turn whose server-side tools need approval waits, quiet, for each
// decision: [OnApproval] answers them in the event loop, [Turn.Approve]
// from anywhere. [Turn.Steer] gives the running turn a user message.
//
// req is not modified.
func (c *Client) RunTurn(ctx context.Context, req *turnstilev1.RunTurnRequest, opts ...TurnOption) *Turn {
	r := &turnstilev1.RunTurnRequest{}
	if req != nil {
		r = proto.CloneOf(req)
	}
	if r.GetTurnId() == "" {
		r.TurnId = randomHex(16)
	}
	t := &Turn{c: c, ctx: ctx, req: r, answered: map[approvalKey]bool{}}
	for _, o := range opts {
		o(&t.opts)
	}
	return t
}

// ID returns the turn's id, the caller's or the one the client made.
func (t *Turn) ID() string { return t.req.GetTurnId() }

// Events returns the turn's events as they happen. The turn runs as the
// iteration proceeds, on the caller's goroutine; breaking out of the loop
// drops its stream at once, which leaves the run rather than cancelling it
// (see [Turn.Close]). The sequence yields a non-nil error at most
// once, last: a [*TurnError] when the turn failed. It may be ranged over
// only once.
func (t *Turn) Events() iter.Seq2[*Event, error] {
	return func(yield func(*Event, error) bool) {
		if t.started {
			yield(nil, errors.New("client: the events of a turn can be ranged over only once"))
			return
		}
		t.started = true
		ctx, stop := context.WithCancelCause(t.ctx)
		t.mu.Lock()
		closed := t.closed
		t.stop = stop
		t.mu.Unlock()
		if closed {
			stop(ErrClosed)
		}
		t.res, t.err = t.run(ctx, yield)
		t.mu.Lock()
		t.stop = nil
		t.mu.Unlock()
		stop(nil)
		if t.err != nil && !errors.Is(t.err, ErrStopped) {
			yield(nil, t.err)
		}
	}
}

// Wait runs the turn to its end, dropping its events, and returns its
// result.
func (t *Turn) Wait() (*Result, error) {
	for _, err := range t.Events() {
		if err != nil {
			return nil, err
		}
	}
	return t.res, t.err
}

// Result returns the turn's outcome once the iteration ended; nil while the
// turn runs or when it failed.
func (t *Turn) Result() *Result { return t.res }

// Err returns the turn's failure once the iteration ended: a [*TurnError],
// or [ErrStopped] when the caller stopped early; nil on success.
func (t *Turn) Err() error { return t.err }

// attemptOutcome is what one attempt left behind.
type attemptOutcome struct {
	completed *turnstilev1.TurnCompleted
	fail      failure
	stopped   bool
	// ended reports that the attempt's terminal event arrived.
	ended bool
	// committed are the messages the attempt committed, in order.
	committed []*turnstilev1.Message
	// conv is the conversation the attempt sent, followed by the messages
	// it committed, with its compactions applied.
	conv []*turnstilev1.Message
	// frozen reports a compaction the attempt could not apply (its
	// replacement was omitted): the later ones are not applied either.
	frozen bool
	// partial reports output streamed since the last commit.
	partial bool
	// toolsRunning names server-side tools started since the last commit.
	toolsRunning []string
	usage        *turnstilev1.Usage
	counters     *turnstilev1.TurnCounters
	// reattached counts the attempt's WatchTurn calls.
	reattached int
	// started reports that the attempt received an event: the server
	// stored its run.
	started bool
}

func (t *Turn) run(ctx context.Context, yield func(*Event, error) bool) (*Result, error) {
	o := t.c.opts
	var carried []*turnstilev1.Message
	// conv is what the next attempt sends: the request's messages and
	// carried, compacted as the server said.
	conv := slices.Clone(t.req.GetMessages())
	usage, counters := &turnstilev1.Usage{}, &turnstilev1.TurnCounters{}
	reattaches := 0
	// ended fills in what a failure says of the whole turn.
	ended := func(te *TurnError, n int) *TurnError {
		te.TurnID, te.Attempts, te.Messages, te.Reattaches = t.ID(), n, slices.Clone(carried), reattaches
		te.Conversation = slices.Clone(conv)
		return te
	}
	// wire numbers the attempts on the wire: a server with a turn store
	// runs attempt n only after attempt n-1, so an attempt refused before
	// any event (a limit, a server draining) is sent again under its
	// number, the same request, which the server runs or attaches to.
	wire := 1
	for n := 1; ; n++ {
		out := t.attempt(ctx, n, wire, conv, yield)
		sent := wire
		if out.started {
			wire++
		}
		if out.stopped {
			t.mu.Lock()
			if !out.ended {
				t.left = sent // the run may go on: Close cancels it
			}
			t.mu.Unlock()
			return nil, ErrStopped
		}
		reattaches += out.reattached
		addUsage(usage, out.usage)
		addCounters(counters, out.counters)
		if tc := out.completed; tc != nil {
			addCounters(counters, tc.GetCounters())
			addUsage(usage, tc.GetUsage())
			added := tc.GetMessages()
			if tc.GetMessagesOmitted() {
				// Too large for one event: they are those committed.
				added = out.committed
			}
			return &Result{
				TurnID:       t.ID(),
				EndReason:    tc.GetEndReason(),
				Messages:     append(carried, added...),
				Conversation: out.conv,
				Usage:        usage,
				Counters:     counters,
				Attempts:     n,
				Reattaches:   reattaches,
			}, nil
		}
		fail := out.fail
		carried = append(carried, out.committed...)
		kept := standing(carried)
		discard := out.partial || len(kept) < len(carried)
		conv = out.conv
		if len(kept) < len(carried) {
			// The same trailing message, which compactions keep.
			conv = conv[:len(conv)-1]
		}
		carried = kept
		ended(fail.err, n)
		if ctx.Err() != nil {
			// The caller cancelled the turn: the messages the server
			// committed as it stopped it stand, for the next turn.
			te := ended(contextError(ctx), n)
			te.Status = fail.err.Status
			return nil, te
		}
		if fail.transport && len(out.toolsRunning) > 0 {
			// The server may have run them: resuming could run them again.
			fail.err.Code = turnstilev1.ErrorCode_ERROR_CODE_TOOLS_UNSAFE
			fail.err.Message = fmt.Sprintf("%s; the connection broke while the tools %s were running, check their effects before running the turn again",
				fail.err.Message, strings.Join(out.toolsRunning, ", "))
			fail.err.Retryable, fail.retry = false, false
		}
		if !fail.retry || n > o.maxRetries {
			return nil, fail.err
		}
		delay := fail.err.RetryAfter
		if delay <= 0 {
			delay = o.backoff.delay(n, o.jitter())
		}
		if delay > o.maxDelay {
			return nil, fail.err
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= delay {
			return nil, fail.err
		}
		t.c.logger.LogAttrs(ctx, slog.LevelWarn, "turnstile: retrying turn step",
			slog.String("turn_id", t.ID()),
			slog.Int("attempt", n+1),
			slog.String("code", CodeName(fail.err.Code)),
			slog.Duration("delay", delay),
			slog.Bool("transport", fail.transport),
			slog.Int("messages_carried", len(carried)),
			slog.String("message", fail.err.Message),
		)
		ev := &Event{Attempt: n, StepRetry: &StepRetry{
			Attempt: n + 1, MaxAttempts: o.maxRetries + 1, Delay: delay, Err: fail.err,
			DiscardPartial: discard, Messages: slices.Clone(carried), Conversation: slices.Clone(conv),
		}}
		if !yield(ev, nil) {
			return nil, ErrStopped
		}
		if err := sleep(ctx, delay); err != nil {
			return nil, ended(contextError(ctx), n)
		}
	}
}

// attempt makes attempt number n at the turn, sending conv (the request's
// messages and those earlier attempts committed, compacted), and yields
// its events. When the stream breaks before
// the attempt's last event, it re-attaches to the same run with WatchTurn
// from the last seq received, on any replica, so the run goes on without
// loss or duplicates; only when that is impossible (the server keeps no
// turn log, or never stored the run) or keeps failing does the attempt
// end with the break. wire is the attempt's number on the wire.
func (t *Turn) attempt(ctx context.Context, n, wire int, conv []*turnstilev1.Message, yield func(*Event, error) bool) (out attemptOutcome) {
	o := t.c.opts
	out.conv = slices.Clone(conv)
	if err := ctx.Err(); err != nil {
		// Cancelled before it began: no run to start, none to cancel.
		out.fail = fromStatus(status.FromContextError(err).Err())
		return out
	}
	// The stream outlives ctx by up to the cancel timeout: once the caller
	// cancels, the client asks the server to stop the run and reads the
	// events it sends as it does (the messages it commits, the CANCELLED
	// error), then drops the stream.
	sctx, drop := context.WithCancel(context.WithoutCancel(ctx))
	defer drop()
	open := make(chan struct{})
	cancelled := make(chan struct{})
	var timer *time.Timer // drops the stream once the cancel timeout is over
	stopCancel := context.AfterFunc(ctx, func() {
		defer close(cancelled)
		if o.cancelWait <= 0 {
			drop()
			return
		}
		timer = time.AfterFunc(o.cancelWait, drop)
		cctx, cancel := context.WithTimeout(sctx, o.cancelWait)
		defer cancel()
		held, err := t.cancelOnServer(cctx, wire, open)
		if err != nil {
			t.c.logger.LogAttrs(ctx, slog.LevelInfo, "turnstile: could not cancel the turn on the server",
				slog.String("turn_id", t.ID()), slog.Int("attempt", wire), slog.String("cause", status.Convert(err).Message()))
		}
		if !held {
			// No log: leaving the stream is what cancels the turn.
			drop()
		}
		// Else the server stored the run's last event; the stream brings
		// it.
	})
	defer func() {
		close(open)
		if !stopCancel() {
			<-cancelled
			if timer != nil {
				timer.Stop()
			}
		}
	}()
	// The header is for servers that predate the attempt field.
	rctx := metadata.AppendToOutgoingContext(sctx, AttemptHeader, strconv.Itoa(wire))
	req := proto.CloneOf(t.req)
	req.Attempt = uint32(wire)
	req.Messages = slices.Clone(conv)
	out.counters = &turnstilev1.TurnCounters{}

	stream, err := t.c.rpc.RunTurn(rctx, req)
	if err != nil {
		out.fail = fromStatus(err)
		return out
	}
	recv := func() (*turnstilev1.AgentEvent, error) {
		r, err := stream.Recv()
		return r.GetEvent(), err
	}
	var (
		errEvent   *turnstilev1.Error
		lastSeq    uint64
		broken     error     // the break that the current re-attach follows
		brokeAt    time.Time // when it happened
		watchedAt  time.Time // when the current re-attach's WatchTurn began
		reattaches int       // re-attaches since the last event received
		watchable  = true
		seen       bool                // an event of the attempt arrived
		asked      = map[string]bool{} // the call ids whose approval was requested
	)
	for {
		ev, err := recv()
		if err != nil {
			if broken != nil && noRun(err) {
				// The server keeps no log, or never stored the run: the
				// break stands.
				watchable, err = false, broken
			}
			if out.completed == nil && errEvent == nil && watchable && ctx.Err() == nil && breakWorthWatching(err) {
				if broken != nil && time.Since(watchedAt) >= o.reattachFor {
					// The re-attached stream stayed open longer than any
					// failing call lasts: it was attached to a quiet run
					// (a turn waiting for approval, a long tool), and this
					// is a break of its own.
					broken, reattaches = nil, 0
				}
				if broken == nil {
					broken, brokeAt = err, time.Now()
				}
				delay := o.reattach.delay(reattaches+1, o.jitter())
				if o.reattachFor > 0 && time.Since(brokeAt)+delay <= o.reattachFor &&
					(!o.capReattaches || reattaches < o.maxReattaches) {
					reattaches++
					out.reattached++
					t.c.logger.LogAttrs(ctx, slog.LevelInfo, "turnstile: re-attaching to the turn",
						slog.String("turn_id", t.ID()), slog.Int("attempt", wire), slog.Uint64("after_seq", lastSeq),
						slog.Int("reattach", reattaches), slog.Duration("delay", delay), slog.String("cause", status.Convert(err).Message()))
					if sleep(ctx, delay) == nil {
						watchedAt = time.Now()
						w, werr := t.c.rpc.WatchTurn(rctx, &turnstilev1.WatchTurnRequest{TurnId: t.ID(), Attempt: uint32(wire), AfterSeq: lastSeq})
						if werr == nil {
							recv = func() (*turnstilev1.AgentEvent, error) {
								r, err := w.Recv()
								return r.GetEvent(), err
							}
						} else {
							recv = func() (*turnstilev1.AgentEvent, error) { return nil, werr }
						}
						continue
					}
				}
				err = broken
			}
			if broken != nil && !errors.Is(err, io.EOF) && status.Code(err) == codes.Unavailable && out.completed == nil && errEvent == nil {
				// Re-attaching kept failing: report the first break.
				err = broken
			}
			switch {
			case out.completed != nil:
			case errEvent != nil:
				out.fail = fromErrorEvent(errEvent)
				if err != io.EOF {
					out.fail.err.Err = err
					out.fail.err.Status = fromStatus(err).err.Status
				}
			case err == io.EOF:
				out.fail = failure{retry: true, transport: true, err: &TurnError{
					Code:      turnstilev1.ErrorCode_ERROR_CODE_UNAVAILABLE,
					Message:   "the stream ended without a terminal event",
					Retryable: true,
					Err:       io.ErrUnexpectedEOF,
				}}
			default:
				out.fail = fromStatus(err)
				if broken != nil {
					// The run was not finished when its stream broke.
					out.fail.transport = true
				}
			}
			return out
		}
		if ev == nil || (lastSeq > 0 && ev.GetSeq() <= lastSeq) {
			continue
		}
		lastSeq, broken, reattaches, out.started = ev.GetSeq(), nil, 0, true
		if !seen {
			seen = true
			t.mu.Lock()
			t.wire = wire
			t.mu.Unlock()
		}
		var ask *turnstilev1.ToolApprovalRequested
		switch p := ev.GetPayload().(type) {
		case *turnstilev1.AgentEvent_TextDelta, *turnstilev1.AgentEvent_ThinkingDelta, *turnstilev1.AgentEvent_ToolCallDelta:
			out.partial = true
		case *turnstilev1.AgentEvent_MessageCompleted:
			out.committed = append(out.committed, p.MessageCompleted.GetMessage())
			out.conv = append(out.conv, p.MessageCompleted.GetMessage())
			out.partial, out.toolsRunning = false, nil
		case *turnstilev1.AgentEvent_ToolStarted:
			out.toolsRunning = append(out.toolsRunning, p.ToolStarted.GetName())
		case *turnstilev1.AgentEvent_ToolFinished:
			out.counters.ToolCalls++
			if p.ToolFinished.GetIsError() {
				out.counters.ToolErrors++
			}
		case *turnstilev1.AgentEvent_LlmCallStarted:
			out.counters.ModelCalls++
		case *turnstilev1.AgentEvent_Retry:
			out.counters.Retries++
			if p.Retry.GetDiscardPartial() {
				out.partial = false // the server told consumers to drop it
			}
		case *turnstilev1.AgentEvent_Fallback:
			out.counters.Fallbacks++
			if p.Fallback.GetDiscardPartial() {
				out.partial = false
			}
		case *turnstilev1.AgentEvent_Compaction:
			out.counters.Compactions++
			if !out.frozen {
				var ok bool
				if out.conv, ok = ApplyCompaction(out.conv, p.Compaction); !ok {
					out.frozen = true
					t.c.logger.LogAttrs(ctx, slog.LevelWarn, "turnstile: a compaction of the conversation could not be applied; the turn's later ones are not either",
						slog.String("turn_id", t.ID()), slog.Bool("replacement_omitted", p.Compaction.GetReplacementOmitted()))
				}
			}
		case *turnstilev1.AgentEvent_Hedge:
			out.counters.Hedges++
		case *turnstilev1.AgentEvent_ToolApprovalRequested:
			if !asked[p.ToolApprovalRequested.GetCallId()] {
				// A request a takeover emitted again counts once.
				asked[p.ToolApprovalRequested.GetCallId()] = true
				out.counters.ApprovalsRequested++
			}
			ask = p.ToolApprovalRequested
		case *turnstilev1.AgentEvent_ToolApprovalDecided:
			if !p.ToolApprovalDecided.GetApproved() {
				out.counters.ApprovalsDenied++
			}
			t.answered[approvalKey{wire: wire, callID: p.ToolApprovalDecided.GetCallId()}] = true
		case *turnstilev1.AgentEvent_Steered:
			out.counters.Steered++
		case *turnstilev1.AgentEvent_Usage:
			out.usage = p.Usage
		case *turnstilev1.AgentEvent_Error:
			errEvent, out.ended = p.Error, true
		case *turnstilev1.AgentEvent_TurnCompleted:
			out.completed, out.ended = p.TurnCompleted, true
			// The final attempt's own counters are in TurnCompleted.
			out.usage, out.counters = nil, nil
		}
		if !yield(&Event{Attempt: n, Agent: ev}, nil) {
			out.stopped = true
			return out
		}
		if ask != nil {
			t.answerApproval(ctx, wire, ask)
		}
	}
}

// standing returns the prefix of the committed messages that a new
// attempt can resume from: a trailing assistant message whose tool calls
// have no results is dropped, since the step that runs them has to be
// made again.
func standing(msgs []*turnstilev1.Message) []*turnstilev1.Message {
	if len(msgs) == 0 {
		return msgs
	}
	last := msgs[len(msgs)-1]
	if last.GetRole() != turnstilev1.Role_ROLE_ASSISTANT {
		return msgs
	}
	for _, p := range last.GetParts() {
		if p.GetToolCall() != nil {
			return msgs[:len(msgs)-1]
		}
	}
	return msgs
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}
