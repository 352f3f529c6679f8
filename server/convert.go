package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// Limits on requests, checked before a turn starts.
const (
	maxTurnIDLen      = 128
	maxStopSequences  = 8
	maxModelCallsCap  = 256
	maxTemperature    = 2
	maxToolNameLength = 64
)

var toolNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// toTurnRequest validates req and converts it for the runtime. A problem is
// reported as a [*runtime.FieldError] naming the field.
func toTurnRequest(req *turnstilev1.RunTurnRequest) (*runtime.TurnRequest, error) {
	bad := func(field, format string, args ...any) error {
		return &runtime.FieldError{Field: field, Description: fmt.Sprintf(format, args...)}
	}
	if len(req.GetTurnId()) > maxTurnIDLen || !utf8.ValidString(req.GetTurnId()) {
		return nil, bad("turn_id", "must be valid UTF-8 of at most %d bytes", maxTurnIDLen)
	}
	if len(req.GetMessages()) == 0 {
		return nil, bad("messages", "at least one message is required")
	}
	tr := &runtime.TurnRequest{
		TurnID: req.GetTurnId(),
		Model:  req.GetModel(),
		System: req.GetSystem(),
	}
	for i, m := range req.GetMessages() {
		field := fmt.Sprintf("messages[%d]", i)
		msg, err := toMessage(field, m)
		if err != nil {
			return nil, err
		}
		tr.Messages = append(tr.Messages, msg)
	}
	seen := map[string]bool{}
	for i, t := range req.GetTools() {
		field := fmt.Sprintf("tools[%d]", i)
		if !toolNameRE.MatchString(t.GetName()) {
			return nil, bad(field+".name", "must be 1 to %d letters, digits, '_' or '-'", maxToolNameLength)
		}
		if seen[t.GetName()] {
			return nil, bad(field+".name", "%q is declared twice", t.GetName())
		}
		seen[t.GetName()] = true
		spec := llm.ToolSpec{Name: t.GetName(), Description: t.GetDescription()}
		if s := t.GetInputSchema(); s != nil {
			b, err := protojson.Marshal(s)
			if err != nil {
				return nil, bad(field+".input_schema", "cannot be encoded as JSON: %v", err)
			}
			spec.Schema = json.RawMessage(b)
		}
		tr.ClientTools = append(tr.ClientTools, spec)
	}
	if g := req.GetGeneration(); g != nil {
		if g.MaxOutputTokens != nil {
			if g.GetMaxOutputTokens() < 1 {
				return nil, bad("generation.max_output_tokens", "must be at least 1")
			}
			tr.MaxOutputTokens = int(g.GetMaxOutputTokens())
		}
		if g.Temperature != nil {
			t := g.GetTemperature()
			if t < 0 || t > maxTemperature {
				return nil, bad("generation.temperature", "must be between 0 and %d", maxTemperature)
			}
			tr.Temperature = &t
		}
		if len(g.GetStopSequences()) > maxStopSequences {
			return nil, bad("generation.stop_sequences", "at most %d are allowed", maxStopSequences)
		}
		for i, s := range g.GetStopSequences() {
			if s == "" {
				return nil, bad(fmt.Sprintf("generation.stop_sequences[%d]", i), "must not be empty")
			}
		}
		tr.StopSequences = g.GetStopSequences()
	}
	if l := req.GetLimits(); l != nil && l.MaxModelCalls != nil {
		if n := l.GetMaxModelCalls(); n < 1 || n > maxModelCallsCap {
			return nil, bad("limits.max_model_calls", "must be between 1 and %d", maxModelCallsCap)
		}
		tr.MaxModelCalls = int(l.GetMaxModelCalls())
	}
	return tr, nil
}

func toMessage(field string, m *turnstilev1.Message) (llm.Message, error) {
	bad := func(f, format string, args ...any) error {
		return &runtime.FieldError{Field: f, Description: fmt.Sprintf(format, args...)}
	}
	var msg llm.Message
	switch m.GetRole() {
	case turnstilev1.Role_ROLE_USER:
		msg.Role = llm.RoleUser
	case turnstilev1.Role_ROLE_ASSISTANT:
		msg.Role = llm.RoleAssistant
	case turnstilev1.Role_ROLE_TOOL:
		msg.Role = llm.RoleTool
	default:
		return msg, bad(field+".role", "must be ROLE_USER, ROLE_ASSISTANT or ROLE_TOOL")
	}
	if len(m.GetParts()) == 0 {
		return msg, bad(field+".parts", "at least one part is required")
	}
	for j, p := range m.GetParts() {
		pf := fmt.Sprintf("%s.parts[%d]", field, j)
		var part llm.Part
		switch k := p.GetKind().(type) {
		case *turnstilev1.Part_Text:
			part = llm.TextPart(k.Text)
		case *turnstilev1.Part_Thinking:
			if msg.Role != llm.RoleAssistant {
				return msg, bad(pf+".thinking", "only assistant messages hold thinking")
			}
			part = llm.Part{Kind: llm.PartThinking, Text: k.Thinking.GetText(), Signature: k.Thinking.GetSignature()}
		case *turnstilev1.Part_ToolCall:
			tc := k.ToolCall
			switch {
			case msg.Role != llm.RoleAssistant:
				return msg, bad(pf+".tool_call", "only assistant messages hold tool calls")
			case tc.GetId() == "":
				return msg, bad(pf+".tool_call.id", "required")
			case tc.GetName() == "":
				return msg, bad(pf+".tool_call.name", "required")
			case tc.GetArguments() != "" && !json.Valid([]byte(tc.GetArguments())):
				return msg, bad(pf+".tool_call.arguments", "must be JSON text")
			}
			part = llm.Part{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: tc.GetId(), Name: tc.GetName(), Arguments: tc.GetArguments()}}
		case *turnstilev1.Part_ToolResult:
			tr := k.ToolResult
			if tr.GetCallId() == "" {
				return msg, bad(pf+".tool_result.call_id", "required")
			}
			part = llm.Part{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{
				CallID: tr.GetCallId(), Name: tr.GetName(), Content: tr.GetContent(), IsError: tr.GetIsError(),
			}}
		default:
			return msg, bad(pf, "one of text, thinking, tool_call or tool_result must be set")
		}
		msg.Parts = append(msg.Parts, part)
	}
	return msg, nil
}

// fromMessage converts a runtime message for the wire.
func fromMessage(m llm.Message) *turnstilev1.Message {
	out := &turnstilev1.Message{Role: turnstilev1.Role(m.Role)}
	for _, p := range m.Parts {
		pp := &turnstilev1.Part{}
		switch p.Kind {
		case llm.PartText:
			pp.Kind = &turnstilev1.Part_Text{Text: p.Text}
		case llm.PartThinking:
			pp.Kind = &turnstilev1.Part_Thinking{Thinking: &turnstilev1.Thinking{Text: p.Text, Signature: p.Signature}}
		case llm.PartToolCall:
			pp.Kind = &turnstilev1.Part_ToolCall{ToolCall: &turnstilev1.ToolCall{Id: p.ToolCall.ID, Name: p.ToolCall.Name, Arguments: p.ToolCall.Arguments}}
		case llm.PartToolResult:
			r := p.ToolResult
			pp.Kind = &turnstilev1.Part_ToolResult{ToolResult: &turnstilev1.ToolResult{CallId: r.CallID, Name: r.Name, Content: r.Content, IsError: r.IsError}}
		default:
			continue
		}
		out.Parts = append(out.Parts, pp)
	}
	return out
}

func fromUsage(u llm.Usage) *turnstilev1.Usage {
	return &turnstilev1.Usage{
		InputTokens: u.InputTokens, OutputTokens: u.OutputTokens,
		CacheReadTokens: u.CacheReadTokens, CacheWriteTokens: u.CacheWriteTokens,
	}
}

// errorCode maps a runtime kind to the wire's error code.
func errorCode(k llm.Kind) turnstilev1.ErrorCode {
	if v, ok := turnstilev1.ErrorCode_value["ERROR_CODE_"+k.String()]; ok {
		return turnstilev1.ErrorCode(v)
	}
	return turnstilev1.ErrorCode_ERROR_CODE_INTERNAL
}

func fromTurnError(e *runtime.TurnError) *turnstilev1.Error {
	out := &turnstilev1.Error{Code: errorCode(e.Kind), Message: e.Message, Retryable: e.Retryable, Model: e.Model}
	if e.RetryAfter > 0 {
		out.RetryAfter = durationpb.New(e.RetryAfter)
	}
	for _, a := range e.Attempts {
		ma := &turnstilev1.ModelAttempts{Model: a.Model, Attempts: uint32(a.Attempts)}
		if !a.Succeeded {
			ma.LastCode = errorCode(a.LastKind)
		}
		out.Attempts = append(out.Attempts, ma)
	}
	return out
}

func optDuration(d time.Duration) *durationpb.Duration {
	if d <= 0 {
		return nil
	}
	return durationpb.New(d)
}

// errUnmapped is the failure of an event whose payload has no wire form:
// a bug, caught by the tests that hold the runtime's payloads and the
// proto's oneof to this mapping.
var errUnmapped = errors.New("server: event payload has no wire mapping")

// fromEvent converts a runtime event for the wire. A payload it does not
// know is an error, never an event without a payload.
func fromEvent(ev runtime.Event) (*turnstilev1.AgentEvent, error) {
	out := &turnstilev1.AgentEvent{Seq: ev.Seq, Time: timestamppb.New(ev.Time), TurnId: ev.TurnID}
	if err := setPayload(out, ev.Payload); err != nil {
		return nil, err
	}
	return out, nil
}

// wireEvent holds in one allocation the messages of one response: the
// response, its event, the event's time and, for a text delta (the bulk
// of a turn's events), the payload. Built separately they were five
// allocations per event.
type wireEvent struct {
	resp turnstilev1.RunTurnResponse
	ev   turnstilev1.AgentEvent
	ts   timestamppb.Timestamp
	text turnstilev1.AgentEvent_TextDelta
	td   turnstilev1.TextDelta
}

// toResponse converts a runtime event into the response that carries it,
// as fromEvent does.
func toResponse(ev runtime.Event) (*turnstilev1.RunTurnResponse, error) {
	w := &wireEvent{}
	w.ts.Seconds, w.ts.Nanos = ev.Time.Unix(), int32(ev.Time.Nanosecond())
	w.ev.Seq, w.ev.Time, w.ev.TurnId = ev.Seq, &w.ts, ev.TurnID
	w.resp.Event = &w.ev
	if e, ok := ev.Payload.(*runtime.TextDelta); ok {
		w.td.Text = e.Text
		w.text.TextDelta = &w.td
		w.ev.Payload = &w.text
		return &w.resp, nil
	}
	if err := setPayload(&w.ev, ev.Payload); err != nil {
		return nil, err
	}
	return &w.resp, nil
}

// setPayload sets out's payload to the wire form of p.
func setPayload(out *turnstilev1.AgentEvent, p runtime.Payload) error {
	switch e := p.(type) {
	case *runtime.TurnStarted:
		out.Payload = &turnstilev1.AgentEvent_TurnStarted{TurnStarted: &turnstilev1.TurnStarted{Model: e.Model}}
	case *runtime.LLMCallStarted:
		out.Payload = &turnstilev1.AgentEvent_LlmCallStarted{LlmCallStarted: &turnstilev1.LlmCallStarted{
			Model: e.Model, Provider: e.Provider, ProviderModel: e.ProviderModel, Attempt: uint32(e.Attempt), Call: uint32(e.Call),
		}}
	case *runtime.TextDelta:
		out.Payload = &turnstilev1.AgentEvent_TextDelta{TextDelta: &turnstilev1.TextDelta{Text: e.Text}}
	case *runtime.ThinkingDelta:
		out.Payload = &turnstilev1.AgentEvent_ThinkingDelta{ThinkingDelta: &turnstilev1.ThinkingDelta{Text: e.Text, Signature: e.Signature}}
	case *runtime.ToolCallDelta:
		out.Payload = &turnstilev1.AgentEvent_ToolCallDelta{ToolCallDelta: &turnstilev1.ToolCallDelta{
			Index: uint32(e.Index), CallId: e.CallID, Name: e.Name, ArgumentsDelta: e.ArgumentsDelta,
		}}
	case *runtime.MessageCompleted:
		out.Payload = &turnstilev1.AgentEvent_MessageCompleted{MessageCompleted: &turnstilev1.MessageCompleted{Message: fromMessage(e.Message)}}
	case *runtime.ToolStarted:
		out.Payload = &turnstilev1.AgentEvent_ToolStarted{ToolStarted: &turnstilev1.ToolStarted{CallId: e.CallID, Name: e.Name, Arguments: e.Arguments}}
	case *runtime.ToolProgress:
		out.Payload = &turnstilev1.AgentEvent_ToolProgress{ToolProgress: &turnstilev1.ToolProgress{
			CallId: e.CallID, Name: e.Name, Message: e.Message, Progress: e.Progress, Total: e.Total,
		}}
	case *runtime.ToolFinished:
		out.Payload = &turnstilev1.AgentEvent_ToolFinished{ToolFinished: &turnstilev1.ToolFinished{
			CallId: e.CallID, Name: e.Name, Content: e.Content, IsError: e.IsError, Duration: durationpb.New(e.Duration),
		}}
	case *runtime.LLMCallFinished:
		f := &turnstilev1.LlmCallFinished{
			Model: e.Model, Attempt: uint32(e.Attempt), Usage: fromUsage(e.Usage),
			StopReason: turnstilev1.StopReason(e.Stop), Duration: durationpb.New(e.Duration),
			TimeToFirstChunk: optDuration(e.TimeToFirstChunk),
		}
		if e.Err != nil {
			f.Error = fromTurnError(e.Err)
		}
		out.Payload = &turnstilev1.AgentEvent_LlmCallFinished{LlmCallFinished: f}
	case *runtime.Retry:
		out.Payload = &turnstilev1.AgentEvent_Retry{Retry: &turnstilev1.Retry{
			Attempt: uint32(e.Attempt), MaxAttempts: uint32(e.MaxAttempts), Model: e.Model,
			Delay: durationpb.New(e.Delay), Reason: errorCode(e.Kind), Message: e.Message,
			DiscardPartial: e.DiscardPartial, DiscardFromSeq: e.DiscardFromSeq,
		}}
	case *runtime.Fallback:
		out.Payload = &turnstilev1.AgentEvent_Fallback{Fallback: &turnstilev1.Fallback{
			FromModel: e.From, ToModel: e.To, Reason: errorCode(e.Kind), Message: e.Message,
			DiscardPartial: e.DiscardPartial, DiscardFromSeq: e.DiscardFromSeq,
		}}
	case *runtime.Compaction:
		out.Payload = &turnstilev1.AgentEvent_Compaction{Compaction: &turnstilev1.Compaction{
			Strategy: e.Strategy, MessagesBefore: uint32(e.MessagesBefore), MessagesAfter: uint32(e.MessagesAfter),
			BytesBefore: uint64(e.BytesBefore), BytesAfter: uint64(e.BytesAfter),
		}}
	case *runtime.UsageUpdated:
		out.Payload = &turnstilev1.AgentEvent_Usage{Usage: fromUsage(e.Total)}
	case *runtime.TurnError:
		out.Payload = &turnstilev1.AgentEvent_Error{Error: fromTurnError(e)}
	case *runtime.TurnCompleted:
		tc := &turnstilev1.TurnCompleted{
			EndReason: turnstilev1.EndReason(e.Reason), Usage: fromUsage(e.Usage),
			Counters: &turnstilev1.TurnCounters{
				ModelCalls: uint32(e.Counters.ModelCalls), Retries: uint32(e.Counters.Retries),
				Fallbacks: uint32(e.Counters.Fallbacks), ToolCalls: uint32(e.Counters.ToolCalls),
				ToolErrors: uint32(e.Counters.ToolErrors), Compactions: uint32(e.Counters.Compactions),
			},
		}
		for _, m := range e.Messages {
			tc.Messages = append(tc.Messages, fromMessage(m))
		}
		out.Payload = &turnstilev1.AgentEvent_TurnCompleted{TurnCompleted: tc}
	default:
		return fmt.Errorf("%w: %T", errUnmapped, p)
	}
	return nil
}
