package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// Decision answers a tool call that waits for approval.
type Decision struct {
	// Approved runs the tool; false denies it.
	Approved bool
	// Reason says why, at most 4 KiB; a denial's reason is shown to the
	// model in the call's error result.
	Reason string
}

// ApprovalFunc decides a tool call that waits for approval: req is the
// tool_approval_requested event's payload (the call's id, tool name, JSON
// arguments and preview). It runs on the goroutine that ranges over
// [Turn.Events], after the event was yielded, with the turn's context.
type ApprovalFunc func(ctx context.Context, req *turnstilev1.ToolApprovalRequested) (Decision, error)

// TurnOption configures one turn started by [Client.RunTurn].
type TurnOption func(*turnOptions)

type turnOptions struct {
	onApproval ApprovalFunc
}

// OnApproval makes the client answer every tool_approval_requested event
// of the turn: it calls fn and sends its decision with ApproveToolCall
// (default: none; the caller answers with [Turn.Approve] or
// [Client.ApproveToolCall], or the server's approval timeout denies the
// call). fn is called once per call id and attempt: not for a request the
// server emits again (after a replica took the turn over, or in the
// events a re-attach brings) nor for one whose tool_approval_decided
// event was already received. The turn waits while fn runs; it goes on
// yielding events once the decision is sent.
//
// When fn returns an error, or the decision cannot be delivered (any
// error but FAILED_PRECONDITION, which says the run has ended), the client
// cancels the turn as if its context had ended, with that error as the
// context's cause: the turn fails CANCELLED and errors.Is finds the error
// in [Turn.Err].
func OnApproval(fn ApprovalFunc) TurnOption {
	return func(o *turnOptions) { o.onApproval = fn }
}

// approvalKey names one call of one run.
type approvalKey struct {
	wire   int
	callID string
}

// answerApproval calls the turn's approval hook for a request of attempt
// wire the client has not answered or seen decided, and sends its
// decision. When the hook or the call fails, it stops the turn with the
// failure as its cause.
func (t *Turn) answerApproval(ctx context.Context, wire int, req *turnstilev1.ToolApprovalRequested) {
	k := approvalKey{wire: wire, callID: req.GetCallId()}
	if t.opts.onApproval == nil || t.answered[k] {
		return
	}
	t.answered[k] = true
	d, err := t.opts.onApproval(ctx, req)
	if err == nil {
		_, err = t.c.approve(ctx, &turnstilev1.ApproveToolCallRequest{
			TurnId: t.ID(), Attempt: uint32(wire), CallId: req.GetCallId(), Approved: d.Approved, Reason: d.Reason,
		})
		if status.Code(err) == codes.FailedPrecondition {
			// The run ended before the decision: its stream says how.
			err = nil
		}
		if err != nil {
			err = fmt.Errorf("client: approve tool call %s: %w", req.GetCallId(), err)
		}
	} else {
		err = fmt.Errorf("client: approval of tool call %s: %w", req.GetCallId(), err)
	}
	if err == nil || ctx.Err() != nil {
		return
	}
	t.c.logger.LogAttrs(ctx, slog.LevelWarn, "turnstile: cancelling the turn: its approval failed",
		slog.String("turn_id", t.ID()), slog.Int("attempt", wire), slog.String("call_id", req.GetCallId()),
		slog.String("cause", err.Error()))
	t.mu.Lock()
	stop := t.stop
	t.mu.Unlock()
	if stop != nil {
		stop(err)
	}
}

// ApproveToolCall decides a tool call that waits for approval (a
// tool_approval_requested event of the turn named by req.turn_id and
// req.attempt, 0 meaning the latest attempt). It may be called from any
// goroutine, on any replica: the decision is stored in the turn's log
// before the call returns. Deciding a call already decided changes
// nothing: the response's applied is false and approved gives the
// decision that stands.
//
// A call the transport failed (UNAVAILABLE: a connection reset, a replica
// that went away) is made again, as a decision may be sent twice, with the
// client's re-attach backoff for up to its re-attach timeout. Other
// errors are returned at once, wrapped; read their code with
// status.Code: INVALID_ARGUMENT, NOT_FOUND (no such run, or the run never
// asked about the call), FAILED_PRECONDITION (the run ended first, or the
// server keeps no turn log and the turn runs on another replica),
// PERMISSION_DENIED (another client key's turn).
func (c *Client) ApproveToolCall(ctx context.Context, req *turnstilev1.ApproveToolCallRequest) (*turnstilev1.ApproveToolCallResponse, error) {
	resp, err := c.approve(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("client: approve tool call %s of turn %s: %w", req.GetCallId(), req.GetTurnId(), err)
	}
	return resp, nil
}

// approve calls ApproveToolCall, again while the transport fails, for at
// most the re-attach timeout.
func (c *Client) approve(ctx context.Context, req *turnstilev1.ApproveToolCallRequest) (*turnstilev1.ApproveToolCallResponse, error) {
	start := time.Now()
	for n := 1; ; n++ {
		resp, err := c.rpc.ApproveToolCall(ctx, req)
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return resp, err
		}
		delay := c.opts.reattach.delay(n, c.opts.jitter())
		if time.Since(start)+delay > c.opts.reattachFor {
			return nil, err
		}
		if sleep(ctx, delay) != nil {
			return nil, err
		}
	}
}

// SteerTurn gives a running turn a user message (req.message: role user or
// unset, text parts only), which the turn takes at its next step boundary:
// see turnstile.v1.AgentService.SteerTurn. It may be called from any
// goroutine, on any replica. The request goes as it is, once: after an
// UNAVAILABLE or DEADLINE_EXCEEDED error the message may or may not have
// been queued. Send it again with the same req.request_id to have it
// taken once (the response's duplicate says it was taken already), or use
// [Turn.Steer], which does so. Errors are returned wrapped; read their
// code with status.Code: INVALID_ARGUMENT, NOT_FOUND (no such run),
// FAILED_PRECONDITION (the run has ended), RESOURCE_EXHAUSTED (too many
// messages queued).
func (c *Client) SteerTurn(ctx context.Context, req *turnstilev1.SteerTurnRequest) (*turnstilev1.SteerTurnResponse, error) {
	resp, err := c.rpc.SteerTurn(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("client: steer turn %s: %w", req.GetTurnId(), err)
	}
	return resp, nil
}

// ErrNotStarted is the error of [Turn.Steer] and [Turn.Approve] before the
// turn's first event: its run may not be stored yet.
var ErrNotStarted = errors.New("client: the turn has not started")

// Steer sends text to the running turn as a user message, with
// [Client.SteerTurn], for the attempt whose events the turn yields, and
// has the turn take it once: the request carries a fresh random
// request_id, and a call that fails with UNAVAILABLE (a connection cut,
// the turn's replica gone and another taking it over) or
// DEADLINE_EXCEEDED while ctx is not done is made again with the same id,
// with the client's re-attach backoff for up to its re-attach timeout. It
// is safe to call from any goroutine while another ranges over
// [Turn.Events]; before the turn's first event it returns [ErrNotStarted].
func (t *Turn) Steer(ctx context.Context, text string) error {
	wire := t.running()
	if wire == 0 {
		return ErrNotStarted
	}
	req := &turnstilev1.SteerTurnRequest{
		TurnId:  t.ID(),
		Attempt: uint32(wire),
		Message: &turnstilev1.Message{
			Role:  turnstilev1.Role_ROLE_USER,
			Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: text}}},
		},
		RequestId: randomHex(16),
	}
	start := time.Now()
	for n := 1; ; n++ {
		_, err := t.c.SteerTurn(ctx, req)
		if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded || ctx.Err() != nil {
			return err
		}
		delay := t.c.opts.reattach.delay(n, t.c.opts.jitter())
		if time.Since(start)+delay > t.c.opts.reattachFor {
			return err
		}
		if sleep(ctx, delay) != nil {
			return err
		}
	}
}

// Approve decides the tool call callID of the attempt whose events the
// turn yields, with [Client.ApproveToolCall], and reports whether this
// decision was taken (false: the call had been decided already). It is
// safe to call from any goroutine, and from the loop over [Turn.Events]
// for a turn without [OnApproval].
func (t *Turn) Approve(ctx context.Context, callID string, d Decision) (bool, error) {
	wire := t.running()
	if wire == 0 {
		return false, ErrNotStarted
	}
	resp, err := t.c.ApproveToolCall(ctx, &turnstilev1.ApproveToolCallRequest{
		TurnId: t.ID(), Attempt: uint32(wire), CallId: callID, Approved: d.Approved, Reason: d.Reason,
	})
	return resp.GetApplied(), err
}

// running returns the number on the wire of the attempt whose events the
// turn yields, 0 before its first event.
func (t *Turn) running() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.wire
}
