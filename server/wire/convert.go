package wire

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// Limits on requests, checked before a turn starts. The request's size is
// bounded on the wire (server.max_request_bytes); these bound its parts.
const (
	maxTurnIDLen         = 128
	maxModelLen          = 128
	maxMessages          = 10000
	maxPartsPerMessage   = 1000
	maxParts             = 20000
	maxCallIDLen         = 256
	maxTools             = 128
	maxToolNameLength    = 64
	maxToolDescription   = 8192
	maxToolSchemaBytes   = 64 << 10
	maxStopSequences     = 8
	maxStopSequenceBytes = 128
	maxModelCallsCap     = 256
	maxTemperature       = 2
)

var toolNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// violations collects every problem of a request, each naming its field.
type violations []*runtime.FieldError

func (v *violations) add(field, format string, args ...any) {
	*v = append(*v, &runtime.FieldError{Field: field, Description: fmt.Sprintf(format, args...)})
}

// toTurnRequest validates req and converts it for the runtime. It reports
// every problem it finds, each naming its field; the request is converted
// only when there is none. checkSchemas, when not nil, checks the client
// tools' input schemas (JSON) under ctx; media bounds the request's media.
func toTurnRequest(ctx context.Context, req *turnstilev1.RunTurnRequest, checkSchemas schemaCheck, media mediaLimits) (*runtime.TurnRequest, violations) {
	var bad violations
	if len(req.GetTurnId()) > maxTurnIDLen || !utf8.ValidString(req.GetTurnId()) {
		bad.add("turn_id", "must be valid UTF-8 of at most %d bytes", maxTurnIDLen)
	}
	if len(req.GetModel()) > maxModelLen {
		bad.add("model", "must be at most %d bytes", maxModelLen)
	}
	switch n := len(req.GetMessages()); {
	case n == 0:
		bad.add("messages", "at least one message is required")
	case n > maxMessages:
		bad.add("messages", "at most %d messages are allowed, got %d", maxMessages, n)
	}
	tr := &runtime.TurnRequest{
		TurnID: req.GetTurnId(),
		Model:  req.GetModel(),
		System: req.GetSystem(),
	}
	parts := 0
	for _, m := range req.GetMessages() {
		parts += len(m.GetParts())
	}
	if parts > maxParts {
		bad.add("messages", "at most %d parts are allowed in all messages, got %d", maxParts, parts)
	}
	if len(bad) == 0 {
		for i, m := range req.GetMessages() {
			tr.Messages = append(tr.Messages, toMessage(&bad, &media, fmt.Sprintf("messages[%d]", i), m))
		}
		checkConversation(&bad, tr.Messages)
	}
	tr.ClientTools = toTools(ctx, &bad, req.GetTools(), checkSchemas)
	if g := req.GetGeneration(); g != nil {
		if g.MaxOutputTokens != nil {
			if g.GetMaxOutputTokens() < 1 {
				bad.add("generation.max_output_tokens", "must be at least 1")
			}
			tr.MaxOutputTokens = int(g.GetMaxOutputTokens())
		}
		if g.Temperature != nil {
			t := g.GetTemperature()
			// NaN fails every comparison: test for the valid range.
			if !(t >= 0 && t <= maxTemperature) {
				bad.add("generation.temperature", "must be a number from 0 to %d", maxTemperature)
			}
			tr.Temperature = &t
		}
		if len(g.GetStopSequences()) > maxStopSequences {
			bad.add("generation.stop_sequences", "at most %d are allowed", maxStopSequences)
		}
		for i, s := range g.GetStopSequences() {
			switch {
			case s == "":
				bad.add(fmt.Sprintf("generation.stop_sequences[%d]", i), "must not be empty")
			case len(s) > maxStopSequenceBytes:
				bad.add(fmt.Sprintf("generation.stop_sequences[%d]", i), "must be at most %d bytes", maxStopSequenceBytes)
			}
		}
		tr.StopSequences = g.GetStopSequences()
		toGenerationOptions(&bad, g, tr)
	}
	tr.Metadata = toMetadata(&bad, req.GetMetadata())
	if l := req.GetLimits(); l != nil && l.MaxModelCalls != nil {
		if n := l.GetMaxModelCalls(); n < 1 || n > maxModelCallsCap {
			bad.add("limits.max_model_calls", "must be between 1 and %d", maxModelCallsCap)
		}
		tr.MaxModelCalls = int(l.GetMaxModelCalls())
	}
	if len(bad) > 0 {
		return nil, bad
	}
	return tr, nil
}

// schemaCheck checks the input schemas of a request's tools: one error per
// schema, nil for each that passes (see [Options.CheckToolSchemas]).
type schemaCheck func(ctx context.Context, schemas [][]byte) []error

// toTools converts the client's tool declarations.
func toTools(ctx context.Context, bad *violations, tools []*turnstilev1.ToolDefinition, checkSchemas schemaCheck) []llm.ToolSpec {
	if len(tools) > maxTools {
		bad.add("tools", "at most %d tools are allowed, got %d", maxTools, len(tools))
		return nil
	}
	// The schemas first, compiled together: their bounds hold for the
	// request. problems[i] is what is wrong with tools[i]'s.
	problems, encoded := toolSchemas(ctx, tools, checkSchemas)
	var specs []llm.ToolSpec
	seen := map[string]bool{}
	for i, t := range tools {
		field := fmt.Sprintf("tools[%d]", i)
		switch {
		case !toolNameRE.MatchString(t.GetName()):
			bad.add(field+".name", "must be 1 to %d letters, digits, '_' or '-'", maxToolNameLength)
		case seen[t.GetName()]:
			bad.add(field+".name", "%q is declared twice", t.GetName())
		}
		seen[t.GetName()] = true
		if len(t.GetDescription()) > maxToolDescription {
			bad.add(field+".description", "must be at most %d bytes", maxToolDescription)
		}
		if problems[i] != "" {
			bad.add(field+".input_schema", "%s", problems[i])
		}
		specs = append(specs, llm.ToolSpec{Name: t.GetName(), Description: t.GetDescription(), Schema: encoded[i]})
	}
	return specs
}

// toolSchemas encodes the input schema of each of tools as JSON and checks
// them all at once with checkSchemas, when not nil, under ctx. It returns
// what is wrong with each tool's schema ("" when nothing is, or it has
// none) and the JSON of each that can be encoded and sent.
func toolSchemas(ctx context.Context, tools []*turnstilev1.ToolDefinition, checkSchemas schemaCheck) ([]string, []json.RawMessage) {
	problems, encoded := make([]string, len(tools)), make([]json.RawMessage, len(tools))
	var schemas [][]byte
	var of []int
	for i, t := range tools {
		s := t.GetInputSchema()
		if s == nil {
			continue
		}
		b, err := protojson.Marshal(s)
		switch {
		case err != nil:
			// NaN and infinities have no JSON form.
			problems[i] = "cannot be encoded as JSON: " + clip(err.Error(), 200)
		case len(b) > maxToolSchemaBytes:
			problems[i] = fmt.Sprintf("must be at most %d bytes as JSON", maxToolSchemaBytes)
		case !describesObject(s):
			problems[i] = `must describe a JSON object: its "type" must be "object"`
		default:
			schemas, of = append(schemas, b), append(of, i)
			encoded[i] = b
		}
	}
	if checkSchemas != nil && len(schemas) > 0 {
		for j, err := range checkSchemas(ctx, schemas) {
			if err != nil {
				problems[of[j]] = clip(err.Error(), 300)
			}
		}
	}
	return problems, encoded
}

// describesObject reports whether a tool's input schema may describe its
// arguments, a JSON object: a type, when set, must say so.
func describesObject(s *structpb.Struct) bool {
	v, ok := s.GetFields()["type"]
	return !ok || v.GetStringValue() == "object"
}

func toMessage(bad *violations, media *mediaLimits, field string, m *turnstilev1.Message) llm.Message {
	var msg llm.Message
	switch m.GetRole() {
	case turnstilev1.Role_ROLE_USER:
		msg.Role = llm.RoleUser
	case turnstilev1.Role_ROLE_ASSISTANT:
		msg.Role = llm.RoleAssistant
	case turnstilev1.Role_ROLE_TOOL:
		msg.Role = llm.RoleTool
	default:
		bad.add(field+".role", "must be ROLE_USER, ROLE_ASSISTANT or ROLE_TOOL")
	}
	switch n := len(m.GetParts()); {
	case n == 0:
		bad.add(field+".parts", "at least one part is required")
	case n > maxPartsPerMessage:
		bad.add(field+".parts", "at most %d parts are allowed, got %d", maxPartsPerMessage, n)
		return msg
	}
	for j, p := range m.GetParts() {
		pf := fmt.Sprintf("%s.parts[%d]", field, j)
		var part llm.Part
		switch k := p.GetKind().(type) {
		case *turnstilev1.Part_Text:
			if msg.Role == llm.RoleTool {
				bad.add(pf+".text", "tool messages hold only tool results")
			}
			part = llm.TextPart(k.Text)
		case *turnstilev1.Part_Thinking:
			if msg.Role != llm.RoleAssistant {
				bad.add(pf+".thinking", "only assistant messages hold thinking")
			}
			if !signerRE.MatchString(k.Thinking.GetSigner()) {
				bad.add(pf+".thinking.signer", "must be at most 32 letters, digits, '_' or '-'")
			}
			part = llm.Part{Kind: llm.PartThinking, Text: k.Thinking.GetText(), Signature: k.Thinking.GetSignature(), Signer: k.Thinking.GetSigner()}
		case *turnstilev1.Part_ToolCall:
			tc := k.ToolCall
			if msg.Role != llm.RoleAssistant {
				bad.add(pf+".tool_call", "only assistant messages hold tool calls")
			}
			switch {
			case tc.GetId() == "":
				bad.add(pf+".tool_call.id", "required")
			case len(tc.GetId()) > maxCallIDLen:
				bad.add(pf+".tool_call.id", "must be at most %d bytes", maxCallIDLen)
			}
			switch {
			case tc.GetName() == "":
				bad.add(pf+".tool_call.name", "required")
			case !toolNameRE.MatchString(tc.GetName()):
				bad.add(pf+".tool_call.name", "must be 1 to %d letters, digits, '_' or '-'", maxToolNameLength)
			}
			if tc.GetArguments() != "" && !json.Valid([]byte(tc.GetArguments())) {
				bad.add(pf+".tool_call.arguments", "must be JSON text")
			}
			part = llm.Part{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: tc.GetId(), Name: tc.GetName(), Arguments: tc.GetArguments()}}
		case *turnstilev1.Part_ToolResult:
			tr := k.ToolResult
			if msg.Role != llm.RoleTool {
				bad.add(pf+".tool_result", "only tool messages hold tool results")
			}
			switch {
			case tr.GetCallId() == "":
				bad.add(pf+".tool_result.call_id", "required")
			case len(tr.GetCallId()) > maxCallIDLen:
				bad.add(pf+".tool_result.call_id", "must be at most %d bytes", maxCallIDLen)
			}
			part = llm.Part{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{
				CallID: tr.GetCallId(), Name: tr.GetName(), Content: tr.GetContent(), IsError: tr.GetIsError(),
				Media: toResultMedia(bad, media, pf+".tool_result.media", tr.GetMedia()),
			}}
		case *turnstilev1.Part_Media:
			if msg.Role != llm.RoleUser {
				bad.add(pf+".media", "only user messages hold media (tool results hold theirs in tool_result.media)")
			}
			part = llm.MediaPart(toMedia(bad, media, pf+".media", k.Media))
		default:
			bad.add(pf, "one of text, thinking, tool_call, tool_result or media must be set")
			continue
		}
		msg.Parts = append(msg.Parts, part)
	}
	return msg
}

// checkConversation checks how tool calls and results pair up, as
// providers require: every call id is unique; the calls of an assistant
// message are each answered exactly once by the tool messages right after
// it, before any other message; and every result answers such a call.
func checkConversation(bad *violations, msgs []llm.Message) {
	type call struct {
		field    string
		answered bool
	}
	seen := map[string]bool{} // every call id so far
	var pending map[string]*call
	var order []string // pending ids in order
	unanswered := func(before string) {
		for _, id := range order {
			if c := pending[id]; !c.answered {
				bad.add(c.field, "tool call %s has no result %s", quote(id), before)
			}
		}
		pending, order = nil, nil
	}
	for i, m := range msgs {
		field := fmt.Sprintf("messages[%d]", i)
		if m.Role != llm.RoleTool && len(pending) > 0 {
			unanswered("before " + field)
		}
		for j, p := range m.Parts {
			pf := fmt.Sprintf("%s.parts[%d]", field, j)
			switch {
			case p.Kind == llm.PartToolCall && m.Role == llm.RoleAssistant:
				id := p.ToolCall.ID
				if id == "" {
					continue
				}
				if seen[id] {
					bad.add(pf+".tool_call.id", "%s is the id of an earlier tool call: ids must be unique", quote(id))
					continue
				}
				seen[id] = true
				if pending == nil {
					pending = map[string]*call{}
				}
				pending[id] = &call{field: pf + ".tool_call"}
				order = append(order, id)
			case p.Kind == llm.PartToolResult && m.Role == llm.RoleTool:
				id := p.ToolResult.CallID
				if id == "" {
					continue
				}
				c := pending[id]
				switch {
				case c == nil && seen[id]:
					bad.add(pf+".tool_result.call_id", "%s is not a call of the assistant message right before", quote(id))
				case c == nil:
					bad.add(pf+".tool_result.call_id", "%s answers no tool call", quote(id))
				case c.answered:
					bad.add(pf+".tool_result.call_id", "%s has an earlier result", quote(id))
				default:
					c.answered = true
				}
			}
		}
	}
	unanswered("at the end of the conversation")
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
			pp.Kind = &turnstilev1.Part_Thinking{Thinking: &turnstilev1.Thinking{Text: p.Text, Signature: p.Signature, Signer: p.Signer}}
		case llm.PartToolCall:
			pp.Kind = &turnstilev1.Part_ToolCall{ToolCall: &turnstilev1.ToolCall{Id: p.ToolCall.ID, Name: p.ToolCall.Name, Arguments: p.ToolCall.Arguments}}
		case llm.PartToolResult:
			r := p.ToolResult
			pp.Kind = &turnstilev1.Part_ToolResult{ToolResult: &turnstilev1.ToolResult{CallId: r.CallID, Name: r.Name, Content: r.Content, IsError: r.IsError, Media: fromMediaList(r.Media)}}
		case llm.PartMedia:
			pp.Kind = &turnstilev1.Part_Media{Media: fromMedia(*p.Media)}
		default:
			continue
		}
		out.Parts = append(out.Parts, pp)
	}
	return out
}

func fromUsage(u llm.Usage) *turnstilev1.Usage {
	out := &turnstilev1.Usage{
		InputTokens: u.InputTokens, OutputTokens: u.OutputTokens,
		CacheReadTokens: u.CacheReadTokens, CacheWriteTokens: u.CacheWriteTokens,
	}
	if c := u.Cost; c.Priced {
		out.Cost = &turnstilev1.Cost{Currency: c.Currency, Units: c.Nanos / llm.NanosPerUnit, Nanos: int32(c.Nanos % llm.NanosPerUnit)}
		out.CostPartial = c.Unpriced
	}
	return out
}

// toUsage is fromUsage's inverse, for a turn resumed from its log.
func toUsage(u *turnstilev1.Usage) llm.Usage {
	out := llm.Usage{InputTokens: u.GetInputTokens(), OutputTokens: u.GetOutputTokens(), CacheReadTokens: u.GetCacheReadTokens(), CacheWriteTokens: u.GetCacheWriteTokens()}
	if c := u.GetCost(); c != nil {
		out.Cost = llm.Cost{Currency: c.GetCurrency(), Nanos: c.GetUnits()*llm.NanosPerUnit + int64(c.GetNanos()), Priced: true}
	}
	out.Cost.Unpriced = u.GetCostPartial() || out.Cost.Unpriced
	return out
}

// errorCode maps a runtime kind to the wire's error code.
func errorCode(k llm.Kind) turnstilev1.ErrorCode {
	if v, ok := turnstilev1.ErrorCode_value["ERROR_CODE_"+k.String()]; ok {
		return turnstilev1.ErrorCode(v)
	}
	return turnstilev1.ErrorCode_ERROR_CODE_INTERNAL
}

func fromTurnError(e *runtime.TurnError) *turnstilev1.Error {
	out := &turnstilev1.Error{Code: errorCode(e.Kind), Message: clip(e.Message, maxMessageBytes), Retryable: e.Retryable, Model: e.Model}
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

// ErrUnmapped is the failure of an event whose payload has no wire form,
// or of a wire event whose payload has no runtime form: a bug, caught by
// the tests that hold the runtime's payloads and the proto's oneof to this
// mapping.
var ErrUnmapped = errors.New("server: event payload has no wire mapping")

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
			Deployment: e.Deployment,
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
			CallId: e.CallID, Name: e.Name, Message: clip(e.Message, maxMessageBytes), Progress: e.Progress, Total: e.Total,
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
			Delay: durationpb.New(e.Delay), Reason: errorCode(e.Kind), Message: clip(e.Message, maxMessageBytes),
			DiscardPartial: e.DiscardPartial, DiscardFromSeq: e.DiscardFromSeq, ToDeployment: e.ToDeployment,
		}}
	case *runtime.Fallback:
		out.Payload = &turnstilev1.AgentEvent_Fallback{Fallback: &turnstilev1.Fallback{
			FromModel: e.From, ToModel: e.To, Reason: errorCode(e.Kind), Message: clip(e.Message, maxMessageBytes),
			DiscardPartial: e.DiscardPartial, DiscardFromSeq: e.DiscardFromSeq,
		}}
	case *runtime.Hedge:
		out.Payload = &turnstilev1.AgentEvent_Hedge{Hedge: &turnstilev1.Hedge{
			FromModel: e.From, ToModel: e.To, After: durationpb.New(e.After), ToDeployment: e.ToDeployment,
		}}
	case *runtime.Compaction:
		out.Payload = &turnstilev1.AgentEvent_Compaction{Compaction: fromCompaction(e)}
	case *runtime.UsageUpdated:
		out.Payload = &turnstilev1.AgentEvent_Usage{Usage: fromUsage(e.Total)}
	case *runtime.ToolApprovalRequested:
		out.Payload = &turnstilev1.AgentEvent_ToolApprovalRequested{ToolApprovalRequested: &turnstilev1.ToolApprovalRequested{
			CallId: e.CallID, Name: e.Name, Arguments: e.Arguments, Preview: clip(e.Preview, maxMessageBytes), Deadline: timestamppb.New(e.Deadline),
		}}
	case *runtime.ToolApprovalDecided:
		out.Payload = &turnstilev1.AgentEvent_ToolApprovalDecided{ToolApprovalDecided: &turnstilev1.ToolApprovalDecided{
			CallId: e.CallID, Name: e.Name, Approved: e.Approved, Reason: e.Reason, TimedOut: e.TimedOut, DecidedBy: e.DecidedBy,
		}}
	case *runtime.Steered:
		out.Payload = &turnstilev1.AgentEvent_Steered{Steered: &turnstilev1.Steered{Message: fromMessage(e.Message), RequestId: e.RequestID}}
	case *runtime.TurnError:
		out.Payload = &turnstilev1.AgentEvent_Error{Error: fromTurnError(e)}
	case *runtime.TurnCompleted:
		tc := &turnstilev1.TurnCompleted{
			EndReason: turnstilev1.EndReason(e.Reason), Usage: fromUsage(e.Usage),
			Counters: &turnstilev1.TurnCounters{
				ModelCalls: uint32(e.Counters.ModelCalls), Retries: uint32(e.Counters.Retries),
				Fallbacks: uint32(e.Counters.Fallbacks), ToolCalls: uint32(e.Counters.ToolCalls),
				ToolErrors: uint32(e.Counters.ToolErrors), Compactions: uint32(e.Counters.Compactions),
				Hedges:             uint32(e.Counters.Hedges),
				ApprovalsRequested: uint32(e.Counters.ApprovalsRequested),
				ApprovalsDenied:    uint32(e.Counters.ApprovalsDenied),
				Steered:            uint32(e.Counters.Steered),
			},
		}
		for _, m := range e.Messages {
			tc.Messages = append(tc.Messages, fromMessage(m))
		}
		tc.MessagesOmitted = e.MessagesOmitted
		out.Payload = &turnstilev1.AgentEvent_TurnCompleted{TurnCompleted: tc}
	default:
		return fmt.Errorf("%w: %T", ErrUnmapped, p)
	}
	return nil
}
