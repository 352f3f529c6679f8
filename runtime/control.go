package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// ToolRules says which server-side tools, by the names models call them,
// wait for approval before they run, and which end the turn once they
// succeed. Set them with [WithToolRules].
type ToolRules struct {
	// RequireApproval lists the tools whose calls wait for a decision
	// ([Controls.Decide]) before they run; a call nobody decides within
	// [Limits.ApprovalTimeout] is denied.
	RequireApproval []string
	// EndsTurn lists the tools that end the turn when they succeed: their
	// result is committed and the turn completes with [EndToolEndedTurn],
	// without another model call.
	EndsTurn []string
}

// WithToolRules sets which tools wait for approval and which end the turn
// (default: none). [New] fails on a name that is no server-side tool.
func WithToolRules(r ToolRules) Option { return func(o *options) { o.rules = r } }

// Previewer is a tool that can say in words what a call would do: a call
// waiting for approval shows it ([ToolApprovalRequested.Preview]).
type Previewer interface {
	// Preview describes the call with these JSON arguments, or returns ""
	// when it cannot.
	Preview(arguments string) string
}

// The tool results of calls that did not run because a person said so.
const (
	// SkippedToolResult answers each tool call of a reply that had not
	// started when a steering message arrived.
	SkippedToolResult = "skipped: the user redirected the turn"
)

// Errors of [Controls.Decide] and [Controls.Steer].
var (
	// ErrTurnEnded means the turn has ended (or is ending): it takes no
	// decision and no message.
	ErrTurnEnded = errors.New("runtime: the turn has ended")
	// ErrTurnNotStarted means the turn has not started running yet.
	ErrTurnNotStarted = errors.New("runtime: the turn has not started")
	// ErrNotAwaiting means the turn never asked for approval of the call.
	ErrNotAwaiting = errors.New("runtime: the turn asked for no approval of this call")
	// ErrSteerQueueFull means the turn holds [Limits.MaxSteerMessages]
	// steering messages not yet committed.
	ErrSteerQueueFull = errors.New("runtime: the turn holds the most queued steering messages")
	// ErrSteerBudget means the message would take the text of the turn's
	// steering messages past [Limits.MaxSteerBytes].
	ErrSteerBudget = errors.New("runtime: the turn's steering messages would hold more text than turn.max_steer_bytes")
)

// Decision is a person's decision on a tool call that waits for approval.
type Decision struct {
	// Approved runs the tool; false denies it.
	Approved bool
	// Reason says why; a denial's reason is in the error result the model
	// sees.
	Reason string
	// DecidedBy names who decided (the client key), for the log.
	DecidedBy string
}

// Decided is a decision that stands.
type Decided struct {
	Decision
	// TimedOut reports that nobody decided before the approval timeout,
	// which denied the call.
	TimedOut bool
	// Seq is the seq of the ToolApprovalDecided event that holds it.
	Seq uint64
	// At is when it was taken.
	At time.Time
}

// Controls reaches a running turn from outside it: its owner (the server)
// decides the tool calls that wait for approval and gives the turn
// steering messages. Set it as [TurnRequest.Controls] before running the
// turn; one Controls serves one turn. Its methods are safe for concurrent
// use and return once the event that records what they did (a
// ToolApprovalDecided or a Steered) has been handed to the turn's sink.
type Controls struct {
	mu  sync.Mutex
	out *emitter
	ctx context.Context // the turn's: a stopped turn emits nothing more
	max int
	// maxBytes bounds the text of the turn's steering messages; steered
	// is what they hold so far.
	maxBytes, steered int
	// started and ended bound the turn's life: before and after it, the
	// controls refuse.
	started, ended bool
	// waiting holds the calls waiting for a decision: id → tool name.
	waiting map[string]string
	decided map[string]Decided
	// queue holds the steering messages received and not yet committed.
	queue []llm.Message
	// steerIDs holds the request ids of the turn's last max steered
	// events, oldest first; steerSeq maps each to its event's seq.
	steerIDs []string
	steerSeq map[string]uint64
	// wake is closed and replaced when a decision or a message comes.
	wake chan struct{}
	// waitEnded is when the last wait for decisions ended.
	waitEnded time.Time
}

// NewControls returns the controls of one turn.
func NewControls() *Controls {
	return &Controls{waiting: map[string]string{}, decided: map[string]Decided{}, steerSeq: map[string]uint64{}, wake: make(chan struct{})}
}

// attach binds c to the turn whose events out emits, under ctx and
// limits, and restores what a resumed turn's log holds.
func (c *Controls) attach(ctx context.Context, out *emitter, limits Limits, rs *Resume) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.out, c.ctx, c.max, c.maxBytes, c.started = out, ctx, limits.MaxSteerMessages, limits.MaxSteerBytes, true
	if rs != nil {
		c.steered = rs.SteerBytes
		for id, d := range rs.Decided {
			c.decided[id] = d
		}
		c.queue = append(c.queue, rs.Steering...)
		for _, id := range rs.SteerIDs {
			c.remember(id.ID, id.Seq)
		}
	}
}

// remember records that the steered event seq holds the message of
// request id, forgetting the oldest id beyond the last c.max; c.mu is
// held.
func (c *Controls) remember(id string, seq uint64) {
	if id == "" {
		return
	}
	if _, ok := c.steerSeq[id]; !ok {
		c.steerIDs = append(c.steerIDs, id)
	}
	c.steerSeq[id] = seq
	for len(c.steerIDs) > max(c.max, 1) {
		delete(c.steerSeq, c.steerIDs[0])
		c.steerIDs = c.steerIDs[1:]
	}
}

// Decide decides call callID, which waits for approval. It returns the
// decision that stands and whether it is this one: a call decided already
// keeps its decision (applied false). It fails with [ErrNotAwaiting] when
// the turn never asked for approval of the call, [ErrTurnEnded] when the
// turn ended before the call was decided, and [ErrTurnNotStarted].
func (c *Controls) Decide(callID string, d Decision) (standing Decided, applied bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if got, ok := c.decided[callID]; ok {
		return got, false, nil
	}
	switch {
	case !c.started:
		return Decided{}, false, ErrTurnNotStarted
	case c.ended:
		return Decided{}, false, ErrTurnEnded
	}
	name, ok := c.waiting[callID]
	if !ok {
		return Decided{}, false, ErrNotAwaiting
	}
	got, err := c.decide(callID, name, Decided{Decision: d})
	return got, err == nil, err
}

// decide records d for call callID of tool name and emits it; c.mu is
// held.
func (c *Controls) decide(callID, name string, d Decided) (Decided, error) {
	d.At = time.Now()
	d.Seq = c.out.emit(c.ctx, &ToolApprovalDecided{
		CallID: callID, Name: name, Approved: d.Approved, Reason: d.Reason, TimedOut: d.TimedOut, DecidedBy: d.DecidedBy,
	})
	if d.Seq == 0 {
		return Decided{}, ErrTurnEnded
	}
	c.decided[callID] = d
	delete(c.waiting, callID)
	c.signal()
	return d, nil
}

// Steer queues m, a user message, for the turn's next step boundary and
// returns the seq of the Steered event that holds it. It fails with
// [ErrTurnEnded], [ErrSteerQueueFull] or [ErrTurnNotStarted].
func (c *Controls) Steer(m llm.Message) (uint64, error) {
	seq, _, err := c.SteerOnce("", m)
	return seq, err
}

// SteerOnce is [Controls.Steer] for a message its sender names with
// requestID, so that sending it again is safe: when the turn took a
// message with requestID already (one of the ids of its last
// [Limits.MaxSteerMessages] Steered events, also those a resumed turn's
// log holds), it queues nothing and returns that message's seq with
// duplicate true, even after the turn ended. An empty requestID names
// nothing: the message is always queued. A message that would take the
// text of the turn's steering messages past [Limits.MaxSteerBytes] fails
// with [ErrSteerBudget].
func (c *Controls) SteerOnce(requestID string, m llm.Message) (seq uint64, duplicate bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if seq, ok := c.steerSeq[requestID]; ok && requestID != "" {
		return seq, true, nil
	}
	switch {
	case !c.started:
		return 0, false, ErrTurnNotStarted
	case c.ended:
		return 0, false, ErrTurnEnded
	case len(c.queue) >= c.max:
		return 0, false, fmt.Errorf("%w (%d, turn.max_steer_messages)", ErrSteerQueueFull, c.max)
	}
	size := len(m.Text())
	if left := c.maxBytes - c.steered; size > left {
		return 0, false, fmt.Errorf("%w (%d bytes): the message holds %d bytes of text, and %d are left", ErrSteerBudget, c.maxBytes, size, max(left, 0))
	}
	seq = c.out.emit(c.ctx, &Steered{Message: m, RequestID: requestID})
	if seq == 0 {
		return 0, false, ErrTurnEnded
	}
	c.steered += size
	c.queue = append(c.queue, m)
	c.remember(requestID, seq)
	c.signal()
	return seq, false, nil
}

// signal wakes the turn's waits; c.mu is held.
func (c *Controls) signal() {
	close(c.wake)
	c.wake = make(chan struct{})
}

// steering reports whether steering messages wait to be committed.
func (c *Controls) steering() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue) > 0
}

// take returns the steering messages queued, and empties the queue.
func (c *Controls) take() []llm.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.queue
	c.queue = nil
	return q
}

// finish ends the controls when no steering message waits, and reports
// whether it did; a turn about to complete goes on when it did not.
func (c *Controls) finish() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) > 0 {
		return false
	}
	c.ended = true
	return true
}

// end ends the controls: the turn takes nothing more.
func (c *Controls) end() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ended = true
	clear(c.waiting)
}

// isDecided reports whether call id has a decision.
func (c *Controls) isDecided(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.decided[id]
	return ok
}

// request emits the request of call with emit and marks the call as
// waiting for a decision, as one step: a decision comes after its
// request, never before, and none is refused for coming early.
func (c *Controls) request(call llm.ToolCall, emit func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	emit()
	c.waiting[call.ID] = call.Name
}

// AwaitingApproval reports whether the turn waits for a decision on a
// tool call, or stopped waiting less than within ago: such a wait is
// bounded by [Limits.ApprovalTimeout], not by whether anyone watches the
// turn, and its owner gives the turn time to be watched again after it.
func (c *Controls) AwaitingApproval(within time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiting) > 0 || !c.waitEnded.IsZero() && time.Since(c.waitEnded) < within
}

// drain ends the controls and returns the steering messages still
// queued.
func (c *Controls) drain() []llm.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ended = true
	q := c.queue
	c.queue = nil
	return q
}

// await waits until each of calls is decided, a steering message comes,
// or ctx ends; at deadline it denies the calls still undecided with
// reason. It returns the decisions that stand, by call id.
func (c *Controls) await(ctx context.Context, calls []llm.ToolCall, deadline time.Time, reason string) (map[string]Decided, error) {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		c.mu.Lock()
		all := true
		for _, call := range calls {
			if _, ok := c.decided[call.ID]; !ok {
				all = false
			}
		}
		if all || len(c.queue) > 0 {
			out := make(map[string]Decided, len(calls))
			for _, call := range calls {
				if d, ok := c.decided[call.ID]; ok {
					out[call.ID] = d
				}
				delete(c.waiting, call.ID)
			}
			c.waitEnded = time.Now()
			c.mu.Unlock()
			return out, nil
		}
		wake := c.wake
		c.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer.C:
			c.mu.Lock()
			for _, call := range calls {
				if _, ok := c.decided[call.ID]; !ok {
					if _, err := c.decide(call.ID, call.Name, Decided{Decision: Decision{Reason: reason}, TimedOut: true}); err != nil {
						c.mu.Unlock()
						return nil, err
					}
				}
			}
			c.mu.Unlock()
		}
	}
}

// approve asks for decisions on the calls of one reply that need approval
// (tools of [ToolRules.RequireApproval] that will be called: known,
// allowed for m, with a JSON object for arguments, and without a known
// result), emitting a ToolApprovalRequested for each undecided one, and
// waits for them together. It returns the decisions by call id; a call
// left without one (a steering message ended the wait) is skipped.
func (tc *toolCalls) approve(ctx context.Context, m *Model, calls []llm.ToolCall, known []*llm.ToolResult) (map[string]Decided, error) {
	var need []llm.ToolCall
	for i, c := range calls {
		if i < len(known) && known[i] != nil || !tc.t.r.approval[c.Name] || !allowed(m, c.Name) || !jsonObject(c.Arguments) {
			continue
		}
		if _, ok := tc.t.r.tools[c.Name]; ok {
			need = append(need, c)
		}
	}
	if len(need) == 0 {
		return nil, nil
	}
	timeout := tc.t.r.opts.limits.ApprovalTimeout
	asked := time.Now()
	deadline := asked.Add(timeout)
	for _, c := range need {
		if tc.t.ctl.isDecided(c.ID) {
			continue // decided under the previous runner
		}
		ev := &ToolApprovalRequested{CallID: c.ID, Name: c.Name, Arguments: c.Arguments, Deadline: tc.t.r.opts.now().Add(timeout)}
		if p, ok := tc.t.r.tools[c.Name].(Previewer); ok {
			ev.Preview = p.Preview(c.Arguments)
		}
		if !tc.t.requested[c.ID] {
			tc.t.counters.ApprovalsRequested++
		}
		tc.t.ctl.request(c, func() { tc.t.out.emit(ctx, ev) })
	}
	if err := tc.t.stopped(ctx); err != nil {
		return nil, err
	}
	reason := fmt.Sprintf("nobody decided within the approval timeout (%s, turn.approval_timeout)", timeout)
	decided, err := tc.t.ctl.await(ctx, need, deadline, reason)
	if err != nil {
		if err := tc.t.stopped(ctx); err != nil {
			return nil, err
		}
		return nil, &llm.Error{Kind: llm.KindCancelled, Message: "the turn stopped while waiting for approval"}
	}
	for _, c := range need {
		d, ok := decided[c.ID]
		if !ok || d.Seq < tc.t.firstSeq {
			continue // skipped, or decided under the previous runner
		}
		if !d.Approved {
			tc.t.counters.ApprovalsDenied++
		}
		tc.t.obs.Approval(ctx, ApprovalInfo{
			TurnID: tc.t.info.TurnID, CallID: c.ID, Name: c.Name, Approved: d.Approved, TimedOut: d.TimedOut,
			DecidedBy: d.DecidedBy, Waited: max(d.At.Sub(asked), 0),
		})
	}
	return decided, nil
}

// deniedResult is the error result the model sees for a denied call.
func deniedResult(d Decided) string {
	switch {
	case d.TimedOut:
		return "denied: " + d.Reason
	case d.Reason == "":
		return "denied by the user"
	}
	return "denied by the user: " + d.Reason
}

// injectSteering commits the steering messages queued, each a
// MessageCompleted, before the turn's next model call.
func (t *turn) injectSteering(ctx context.Context) { t.commitSteering(ctx, t.ctl.take()) }

// commitSteering commits steering messages, each a MessageCompleted.
func (t *turn) commitSteering(ctx context.Context, msgs []llm.Message) {
	for _, m := range msgs {
		t.counters.Steered++
		t.commit(ctx, m)
		t.obs.Steer(ctx, SteerInfo{TurnID: t.info.TurnID, Bytes: len(m.Text())})
	}
}

// endedByTool reports whether results hold the success of a tool that
// ends the turn.
func (tc *toolCalls) endedByTool(results []llm.ToolResult) bool {
	return slices.ContainsFunc(results, func(r llm.ToolResult) bool { return !r.IsError && tc.t.r.endsTurn[r.Name] })
}

// isCancelNote reports whether m is the user message a cancel commits
// last (see [turn.closeCancelled]), as opposed to a steering message.
func isCancelNote(m llm.Message) bool {
	if m.Role != llm.RoleUser || len(m.Parts) != 1 || m.Parts[0].Kind != llm.PartText {
		return false
	}
	return m.Parts[0].Text == InterruptedNote || m.Parts[0].Text == InterruptedToolUseNote
}
