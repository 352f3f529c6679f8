package server

import (
	"context"
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// takeOvers takes over, until ctx is done, every run whose owner died:
// another replica's, or this one's before a restart.
func (s *service) takeOvers(ctx context.Context) {
	err := s.store.WatchExpired(ctx, func(turnID string, attempt uint32) {
		s.turns.Add(1)
		go func() {
			defer s.turns.Done()
			s.takeOver(ctx, runKey{turnID: turnID, attempt: attempt})
		}()
	})
	if err != nil {
		s.logger.Error("turn store: cannot watch for runs to take over", "error", err)
	}
}

// takeOver claims run k, whose owner went away, and continues it from
// its log. Of the replicas that try, one wins; the others do nothing.
func (s *service) takeOver(ctx context.Context, k runKey) {
	if s.admit() != nil {
		return // draining or full: another replica takes it
	}
	rctx, cancel := context.WithCancelCause(context.Background())
	r := newRun(k, nil, cancel)
	rec, raw, claims, err := s.store.Claim(ctx, k.turnID, k.attempt, func(sig string) []byte { return s.onSignal(r, sig) })
	if err != nil {
		cancel(nil)
		s.unadmit()
		s.logger.Debug("turn store: run not taken over", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
		return
	}
	tr, events, err := s.resumeRequest(k, rec, raw, claims)
	if err != nil || tr == nil {
		// Finished after all, or unreadable: give it up as it is.
		if err != nil {
			s.logger.Error("turn store: cannot take the run over", "turn_id", k.turnID, "attempt", k.attempt, "error", err)
		}
		_ = s.store.Finish(ctx, k.turnID, k.attempt)
		cancel(nil)
		s.unadmit()
		return
	}
	var first runRecord
	_ = json.Unmarshal(rec, &first)
	r.hash = first.Hash
	if !first.Deadline.IsZero() {
		var cancelDL context.CancelFunc
		rctx, cancelDL = context.WithDeadline(rctx, first.Deadline)
		stop := r.cancel
		r.cancel = func(cause error) { stop(cause); cancelDL() }
	}
	r.fill(events)
	s.logger.Info("taking over a turn whose server went away", "turn_id", k.turnID, "attempt", k.attempt, "takeover", claims,
		"last_seq", len(events), "discard_from_seq", tr.Resume.DiscardFromSeq, "continued", len(tr.Resume.Cut) > 0,
		"committed", len(tr.Resume.Committed), "abort", tr.Resume.Abort != nil)
	s.mu.Lock()
	s.runs[k] = r
	s.mu.Unlock()
	// Its clients re-attach, here or elsewhere; without any, the detach
	// grace ends it.
	r.touched(s.grace)
	go s.own(rctx, r, tr)
}

// maxTakeovers bounds the takeovers of one run: a run claimed more often
// than that (its owners keep going away, or the turn itself brings them
// down) ends with a retryable UNAVAILABLE error instead of looping.
const maxTakeovers = 3

// resumeRequest rebuilds the runtime request of a run taken over from its
// first record and its stored events; nil when the run already ended.
// claims counts the run's takeovers, this one's included.
func (s *service) resumeRequest(k runKey, rec []byte, raw [][]byte, claims int) (*runtime.TurnRequest, []*turnstilev1.AgentEvent, error) {
	var first runRecord
	if err := json.Unmarshal(rec, &first); err != nil {
		return nil, nil, fmt.Errorf("run record: %w", err)
	}
	req := &turnstilev1.RunTurnRequest{}
	if err := proto.Unmarshal(first.Request, req); err != nil {
		return nil, nil, fmt.Errorf("run request: %w", err)
	}
	tr, bad := toTurnRequest(req, nil)
	if len(bad) > 0 {
		return nil, nil, fmt.Errorf("run request: %v", bad[0])
	}
	tr.TurnID, tr.Client = k.turnID, first.Client
	if first.Model != "" {
		tr.Model = first.Model
	}
	events := make([]*turnstilev1.AgentEvent, len(raw))
	for i, b := range raw {
		ev := &turnstilev1.AgentEvent{}
		if err := proto.Unmarshal(b, ev); err != nil {
			return nil, nil, fmt.Errorf("event %d: %w", i+1, err)
		}
		if ev.GetSeq() != uint64(i+1) {
			return nil, nil, fmt.Errorf("event %d has seq %d", i+1, ev.GetSeq())
		}
		events[i] = ev
	}
	rs, err := resumeFrom(events)
	if err != nil || rs == nil {
		return nil, nil, err
	}
	if claims > maxTakeovers {
		rs.Abort = &llm.Error{Kind: llm.KindUnavailable, Message: fmt.Sprintf(
			"the turn was taken over %d times (at most %d): the servers running it kept going away; run it again", claims, maxTakeovers)}
	}
	tr.Resume = rs
	return tr, events, nil
}

// resumeFrom reads what a run's events say of its state; nil when its
// last event is terminal.
func resumeFrom(events []*turnstilev1.AgentEvent) (*runtime.Resume, error) {
	rs := &runtime.Resume{NextSeq: uint64(len(events)) + 1}
	var lastStop llm.StopReason
	// cut is the text streamed from rs.DiscardFromSeq on; textOnly says
	// nothing else was.
	var cut string
	var textOnly bool
	for _, ev := range events {
		switch p := ev.GetPayload().(type) {
		case *turnstilev1.AgentEvent_TurnCompleted, *turnstilev1.AgentEvent_Error:
			return nil, nil
		case *turnstilev1.AgentEvent_TurnStarted:
			rs.Model = p.TurnStarted.GetModel()
		case *turnstilev1.AgentEvent_LlmCallStarted:
			rs.Counters.ModelCalls++
			rs.Model = p.LlmCallStarted.GetModel()
		case *turnstilev1.AgentEvent_TextDelta:
			if rs.DiscardFromSeq == 0 {
				rs.DiscardFromSeq, cut, textOnly = ev.GetSeq(), "", true
			}
			cut += p.TextDelta.GetText()
		case *turnstilev1.AgentEvent_ThinkingDelta, *turnstilev1.AgentEvent_ToolCallDelta:
			if rs.DiscardFromSeq == 0 {
				rs.DiscardFromSeq = ev.GetSeq()
			}
			textOnly = false
		case *turnstilev1.AgentEvent_LlmCallFinished:
			lastStop = llm.StopReason(p.LlmCallFinished.GetStopReason())
		case *turnstilev1.AgentEvent_Retry:
			rs.Counters.Retries++
			if p.Retry.GetDiscardPartial() {
				rs.DiscardFromSeq = 0
			}
		case *turnstilev1.AgentEvent_Fallback:
			rs.Counters.Fallbacks++
			rs.Model = p.Fallback.GetToModel()
			if p.Fallback.GetDiscardPartial() {
				rs.DiscardFromSeq = 0
			}
		case *turnstilev1.AgentEvent_Compaction:
			rs.Counters.Compactions++
		case *turnstilev1.AgentEvent_Usage:
			u := p.Usage
			rs.Usage = llm.Usage{InputTokens: u.GetInputTokens(), OutputTokens: u.GetOutputTokens(), CacheReadTokens: u.GetCacheReadTokens(), CacheWriteTokens: u.GetCacheWriteTokens()}
		case *turnstilev1.AgentEvent_MessageCompleted:
			var bad violations
			m := toMessage(&bad, "message_completed", p.MessageCompleted.GetMessage())
			if len(bad) > 0 {
				return nil, bad[0]
			}
			rs.Committed = append(rs.Committed, m)
			rs.DiscardFromSeq = 0
			if m.Role == llm.RoleAssistant {
				rs.LastStop = lastStop
				rs.ToolResults, rs.ToolsStarted = map[string]llm.ToolResult{}, map[string]bool{}
			}
		case *turnstilev1.AgentEvent_ToolStarted:
			if rs.ToolsStarted != nil {
				rs.ToolsStarted[p.ToolStarted.GetCallId()] = true
			}
		case *turnstilev1.AgentEvent_ToolFinished:
			f := p.ToolFinished
			rs.Counters.ToolCalls++
			if f.GetIsError() {
				rs.Counters.ToolErrors++
			}
			if rs.ToolResults != nil {
				rs.ToolResults[f.GetCallId()] = llm.ToolResult{CallID: f.GetCallId(), Name: f.GetName(), Content: f.GetContent(), IsError: f.GetIsError()}
				delete(rs.ToolsStarted, f.GetCallId())
			}
		}
	}
	if rs.DiscardFromSeq != 0 && textOnly && cut != "" {
		rs.Cut = []llm.Part{llm.TextPart(cut)}
	}
	return rs, nil
}
