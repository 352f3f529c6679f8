package client_test

import (
	"context"
	"sync"
	"testing"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// hitlScenario is what a conformance scenario asks of approval and
// steering: approve answers each tool_approval_requested event through the
// client's approval hook; steer sends a message to the running turn on the
// first event of kind steer.on (only "text_delta").
type hitlScenario struct {
	Approve *struct {
		Decision string `json:"decision"` // "approve" or "deny"
		Reason   string `json:"reason"`
	} `json:"approve"`
	Steer *struct {
		On   string `json:"on"`
		Text string `json:"text"`
	} `json:"steer"`
}

// hitlRun observes one scenario's approvals and steering: approvals (the
// tool_approval_decided events: name, approved, reason), approvals_asked
// (the hook's calls), steered (the steered events), and counters (the
// result's approvals_requested, approvals_denied and steered).
type hitlRun struct {
	sc      hitlScenario
	asked   int
	steered bool
	wg      sync.WaitGroup
}

// turnOptions returns the options of the scenario's turn.
func (h *hitlRun) turnOptions() []client.TurnOption {
	if h.sc.Approve == nil {
		return nil
	}
	return []client.TurnOption{client.OnApproval(func(context.Context, *turnstilev1.ToolApprovalRequested) (client.Decision, error) {
		h.asked++
		return client.Decision{Approved: h.sc.Approve.Decision == "approve", Reason: h.sc.Approve.Reason}, nil
	})}
}

// event notes ev, and steers the turn from another goroutine, as a caller
// would, on the scenario's event.
func (h *hitlRun) event(t *testing.T, turn *client.Turn, ev *client.Event, obs observation) {
	if _, ok := obs["approvals"]; !ok && h.sc.Approve != nil {
		obs["approvals"] = []any{}
	}
	if h.sc.Steer != nil || h.sc.Approve != nil {
		if _, ok := obs["steered"]; !ok {
			obs["steered"] = float64(0)
		}
	}
	switch {
	case ev.Agent.GetToolApprovalDecided() != nil:
		d := ev.Agent.GetToolApprovalDecided()
		obs["approvals"] = append(obs["approvals"].([]any), map[string]any{"name": d.GetName(), "approved": d.GetApproved(), "reason": d.GetReason()})
	case ev.Agent.GetSteered() != nil:
		obs["steered"] = obs["steered"].(float64) + 1
	case ev.Agent.GetTextDelta() != nil && h.sc.Steer != nil && h.sc.Steer.On == "text_delta" && !h.steered:
		h.steered = true
		h.wg.Go(func() {
			if err := turn.Steer(context.Background(), h.sc.Steer.Text); err != nil {
				t.Errorf("steer: %v", err)
			}
		})
	}
}

// done notes what the turn's end says.
func (h *hitlRun) done(res *client.Result, obs observation) {
	h.wg.Wait()
	if h.sc.Approve == nil && h.sc.Steer == nil {
		return
	}
	obs["approvals_asked"] = float64(h.asked)
	if res != nil {
		c := res.Counters
		obs["counters"] = map[string]any{
			"approvals_requested": float64(c.GetApprovalsRequested()),
			"approvals_denied":    float64(c.GetApprovalsDenied()),
			"steered":             float64(c.GetSteered()),
		}
	}
}
