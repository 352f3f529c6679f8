package wire

import (
	"fmt"
	"math"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// RuntimeEvent converts an event of the wire, as a turn's log stores it,
// back into the runtime's: the inverse of [AgentEvent], for a turn resumed
// from its log. What the wire does not carry comes back zero: a
// TurnError's Cause, Usage and Estimated, an LLMCallFinished's Estimated,
// a ModelAttempts' Deployments; what [AgentEvent] clipped (a message over
// [MaxMessageBytes]) comes back clipped, and a cost is kept only when
// priced. Messages are checked as a request's are, without the media
// bounds (the server made them). A payload it does not know is an error
// wrapping [ErrUnmapped].
func RuntimeEvent(ev *turnstilev1.AgentEvent) (runtime.Event, error) {
	out := runtime.Event{Seq: ev.GetSeq(), Time: ev.GetTime().AsTime(), TurnID: ev.GetTurnId()}
	p, err := toPayload(ev)
	if err != nil {
		return runtime.Event{}, err
	}
	out.Payload = p
	return out, nil
}

// toPayload returns the runtime's payload of ev.
func toPayload(ev *turnstilev1.AgentEvent) (runtime.Payload, error) {
	switch p := ev.GetPayload().(type) {
	case *turnstilev1.AgentEvent_TurnStarted:
		return &runtime.TurnStarted{Model: p.TurnStarted.GetModel()}, nil
	case *turnstilev1.AgentEvent_LlmCallStarted:
		e := p.LlmCallStarted
		return &runtime.LLMCallStarted{
			Model: e.GetModel(), Provider: e.GetProvider(), ProviderModel: e.GetProviderModel(),
			Attempt: int(e.GetAttempt()), Call: int(e.GetCall()), Deployment: e.GetDeployment(),
		}, nil
	case *turnstilev1.AgentEvent_TextDelta:
		return &runtime.TextDelta{Text: p.TextDelta.GetText()}, nil
	case *turnstilev1.AgentEvent_ThinkingDelta:
		return &runtime.ThinkingDelta{Text: p.ThinkingDelta.GetText(), Signature: p.ThinkingDelta.GetSignature()}, nil
	case *turnstilev1.AgentEvent_ToolCallDelta:
		e := p.ToolCallDelta
		return &runtime.ToolCallDelta{Index: int(e.GetIndex()), CallID: e.GetCallId(), Name: e.GetName(), ArgumentsDelta: e.GetArgumentsDelta()}, nil
	case *turnstilev1.AgentEvent_MessageCompleted:
		m, err := storedMessage("message_completed", p.MessageCompleted.GetMessage())
		if err != nil {
			return nil, err
		}
		return &runtime.MessageCompleted{Message: m}, nil
	case *turnstilev1.AgentEvent_ToolStarted:
		e := p.ToolStarted
		return &runtime.ToolStarted{CallID: e.GetCallId(), Name: e.GetName(), Arguments: e.GetArguments()}, nil
	case *turnstilev1.AgentEvent_ToolProgress:
		e := p.ToolProgress
		return &runtime.ToolProgress{CallID: e.GetCallId(), Name: e.GetName(),
			ToolProgress: llm.ToolProgress{Message: e.GetMessage(), Progress: e.GetProgress(), Total: e.GetTotal()}}, nil
	case *turnstilev1.AgentEvent_ToolFinished:
		e := p.ToolFinished
		return &runtime.ToolFinished{CallID: e.GetCallId(), Name: e.GetName(), Content: e.GetContent(), IsError: e.GetIsError(),
			Duration: e.GetDuration().AsDuration()}, nil
	case *turnstilev1.AgentEvent_LlmCallFinished:
		e := p.LlmCallFinished
		f := &runtime.LLMCallFinished{
			Model: e.GetModel(), Attempt: int(e.GetAttempt()), Usage: toUsage(e.GetUsage()),
			Stop: llm.StopReason(e.GetStopReason()), Duration: e.GetDuration().AsDuration(),
		}
		if e.GetTimeToFirstChunk() != nil {
			f.TimeToFirstChunk = e.GetTimeToFirstChunk().AsDuration()
		}
		if e.GetError() != nil {
			f.Err = TurnError(e.GetError())
		}
		return f, nil
	case *turnstilev1.AgentEvent_Retry:
		e := p.Retry
		return &runtime.Retry{
			Attempt: int(e.GetAttempt()), MaxAttempts: int(e.GetMaxAttempts()), Model: e.GetModel(),
			Delay: e.GetDelay().AsDuration(), Kind: kindOf(e.GetReason()), Message: e.GetMessage(),
			DiscardPartial: e.GetDiscardPartial(), DiscardFromSeq: e.GetDiscardFromSeq(), ToDeployment: e.GetToDeployment(),
		}, nil
	case *turnstilev1.AgentEvent_Fallback:
		e := p.Fallback
		return &runtime.Fallback{
			From: e.GetFromModel(), To: e.GetToModel(), Kind: kindOf(e.GetReason()), Message: e.GetMessage(),
			DiscardPartial: e.GetDiscardPartial(), DiscardFromSeq: e.GetDiscardFromSeq(),
		}, nil
	case *turnstilev1.AgentEvent_Hedge:
		e := p.Hedge
		return &runtime.Hedge{From: e.GetFromModel(), To: e.GetToModel(), After: e.GetAfter().AsDuration(), ToDeployment: e.GetToDeployment()}, nil
	case *turnstilev1.AgentEvent_Compaction:
		return toCompaction(p.Compaction)
	case *turnstilev1.AgentEvent_Usage:
		return &runtime.UsageUpdated{Total: toUsage(p.Usage)}, nil
	case *turnstilev1.AgentEvent_ToolApprovalRequested:
		e := p.ToolApprovalRequested
		return &runtime.ToolApprovalRequested{CallID: e.GetCallId(), Name: e.GetName(), Arguments: e.GetArguments(), Preview: e.GetPreview(),
			Deadline: e.GetDeadline().AsTime()}, nil
	case *turnstilev1.AgentEvent_ToolApprovalDecided:
		e := p.ToolApprovalDecided
		return &runtime.ToolApprovalDecided{CallID: e.GetCallId(), Name: e.GetName(), Approved: e.GetApproved(), Reason: e.GetReason(),
			TimedOut: e.GetTimedOut(), DecidedBy: e.GetDecidedBy()}, nil
	case *turnstilev1.AgentEvent_Steered:
		m, err := storedMessage("steered", p.Steered.GetMessage())
		if err != nil {
			return nil, err
		}
		return &runtime.Steered{Message: m, RequestID: p.Steered.GetRequestId()}, nil
	case *turnstilev1.AgentEvent_Error:
		return TurnError(p.Error), nil
	case *turnstilev1.AgentEvent_TurnCompleted:
		e := p.TurnCompleted
		c := e.GetCounters()
		tc := &runtime.TurnCompleted{
			Reason: runtime.EndReason(e.GetEndReason()), Usage: toUsage(e.GetUsage()), MessagesOmitted: e.GetMessagesOmitted(),
			Counters: runtime.Counters{
				ModelCalls: int(c.GetModelCalls()), Retries: int(c.GetRetries()), Fallbacks: int(c.GetFallbacks()),
				Hedges: int(c.GetHedges()), Compactions: int(c.GetCompactions()), ToolCalls: int(c.GetToolCalls()),
				ToolErrors: int(c.GetToolErrors()), ApprovalsRequested: int(c.GetApprovalsRequested()),
				ApprovalsDenied: int(c.GetApprovalsDenied()), Steered: int(c.GetSteered()),
			},
		}
		for i, m := range e.GetMessages() {
			msg, err := storedMessage(fmt.Sprintf("turn_completed.messages[%d]", i), m)
			if err != nil {
				return nil, err
			}
			tc.Messages = append(tc.Messages, msg)
		}
		return tc, nil
	}
	return nil, fmt.Errorf("%w: %T", ErrUnmapped, ev.GetPayload())
}

// storedMessage converts a message the server made (its media were
// bounded then), checked as a request's message is: the first problem is
// the error.
func storedMessage(field string, m *turnstilev1.Message) (llm.Message, error) {
	var bad violations
	unbounded := mediaLimits{perPart: math.MaxInt, perRequest: math.MaxInt}
	msg := toMessage(&bad, &unbounded, field, m)
	if len(bad) > 0 {
		return llm.Message{}, bad[0]
	}
	return msg, nil
}

// TurnError is the inverse of the wire's Error: the terminal failure of a
// turn, or of one model call, as its event says it.
func TurnError(e *turnstilev1.Error) *runtime.TurnError {
	te := &runtime.TurnError{Kind: kindOf(e.GetCode()), Message: e.GetMessage(), Retryable: e.Retryable, Model: e.GetModel()}
	if ra := e.GetRetryAfter(); ra != nil {
		te.RetryAfter = ra.AsDuration()
	}
	for _, a := range e.GetAttempts() {
		ma := runtime.ModelAttempts{Model: a.GetModel(), Attempts: int(a.GetAttempts()), Succeeded: a.GetLastCode() == turnstilev1.ErrorCode_ERROR_CODE_UNSPECIFIED}
		if !ma.Succeeded {
			ma.LastKind = kindOf(a.GetLastCode())
		}
		te.Attempts = append(te.Attempts, ma)
	}
	return te
}

// kinds maps the wire's error codes back to the runtime's kinds.
var kinds = func() map[turnstilev1.ErrorCode]llm.Kind {
	m := map[turnstilev1.ErrorCode]llm.Kind{}
	for _, k := range llm.Kinds() {
		m[errorCode(k)] = k
	}
	return m
}()

func kindOf(c turnstilev1.ErrorCode) llm.Kind {
	if k, ok := kinds[c]; ok {
		return k
	}
	return llm.KindInternal
}
