package wire

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// fullPayloads holds one payload of every type the runtime emits, keyed by
// type name, with every field the wire carries set to a value other than
// its zero: a field the conversion drops, either way, changes the payload
// read back.
func fullPayloads() map[string]runtime.Payload {
	yes := true
	usage := llm.Usage{InputTokens: 10, OutputTokens: 20, CacheReadTokens: 3, CacheWriteTokens: 4,
		Cost: llm.Cost{Currency: "USD", Nanos: 2_000_000_123, Priced: true, Unpriced: true}}
	failure := &runtime.TurnError{Kind: llm.KindOverloaded, Message: "busy", Retryable: &yes, RetryAfter: 2 * time.Second, Model: "m",
		Attempts: []runtime.ModelAttempts{{Model: "m", Attempts: 2, LastKind: llm.KindOverloaded}, {Model: "n", Attempts: 1, Succeeded: true}}}
	assistant := llm.Message{Role: llm.RoleAssistant, Parts: []llm.Part{
		{Kind: llm.PartThinking, Text: "hmm", Signature: "sig"},
		llm.TextPart("let me look"),
		{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: "c1", Name: "read", Arguments: `{"path":"a"}`}},
	}}
	results := llm.Message{Role: llm.RoleTool, Parts: []llm.Part{{Kind: llm.PartToolResult, ToolResult: &llm.ToolResult{
		CallID: "c1", Name: "read", Content: "failed", IsError: true,
		Media: []llm.Media{{MIMEType: "image/png", Data: []byte{1, 2, 3}, Name: "a.png"}},
	}}}}
	user := llm.Message{Role: llm.RoleUser, Parts: []llm.Part{
		llm.TextPart("and this?"),
		llm.MediaPart(llm.Media{MIMEType: "application/pdf", URI: "https://example.com/a.pdf", Name: "a.pdf"}),
	}}
	return map[string]runtime.Payload{
		"TurnStarted": &runtime.TurnStarted{Model: "m"},
		"LLMCallStarted": &runtime.LLMCallStarted{Model: "m", Provider: "p", ProviderModel: "p-1", Deployment: "eu",
			Attempt: 2, Call: 3},
		"TextDelta":     &runtime.TextDelta{Text: "hi"},
		"ThinkingDelta": &runtime.ThinkingDelta{Text: "hmm", Signature: "sig"},
		"ToolCallDelta": &runtime.ToolCallDelta{Index: 1, CallID: "c1", Name: "read", ArgumentsDelta: `{"pa`},
		"LLMCallFinished": &runtime.LLMCallFinished{Model: "m", Attempt: 2, Usage: usage, Stop: llm.StopToolUse, Err: failure,
			Duration: 1500 * time.Millisecond, TimeToFirstChunk: 200 * time.Millisecond},
		"UsageUpdated": &runtime.UsageUpdated{Total: usage},
		"Retry": &runtime.Retry{Attempt: 2, MaxAttempts: 3, Model: "m", Delay: 250 * time.Millisecond, Kind: llm.KindRateLimited,
			Message: "slow down", DiscardPartial: true, DiscardFromSeq: 4, ToDeployment: "us"},
		"Fallback": &runtime.Fallback{From: "a", To: "b", Kind: llm.KindServerError, Message: "down", DiscardPartial: true, DiscardFromSeq: 5},
		"Hedge":    &runtime.Hedge{From: "a", To: "b", After: 750 * time.Millisecond, ToDeployment: "us"},
		"Compaction": &runtime.Compaction{Strategy: "summarize", MessagesBefore: 10, MessagesAfter: 4, BytesBefore: 1000, BytesAfter: 300,
			BeforeCall: true, ReplacedFrom: 1, ReplacedCount: 7, Replacement: []llm.Message{user}, SummaryError: "too slow", EstimatedTokens: 900},
		"MessageCompleted": &runtime.MessageCompleted{Message: assistant},
		"ToolStarted":      &runtime.ToolStarted{CallID: "c1", Name: "read", Arguments: `{"path":"a"}`},
		"ToolProgress": &runtime.ToolProgress{CallID: "c1", Name: "read",
			ToolProgress: llm.ToolProgress{Message: "half", Progress: 1, Total: 2}},
		"ToolFinished": &runtime.ToolFinished{CallID: "c1", Name: "read", Content: "failed", IsError: true, Duration: 3 * time.Second},
		"TurnCompleted": &runtime.TurnCompleted{Reason: runtime.EndToolCallsRequired, Messages: []llm.Message{assistant, results, user},
			Usage: usage, Counters: runtime.Counters{ModelCalls: 1, Retries: 2, Fallbacks: 3, Hedges: 4, Compactions: 5, ToolCalls: 6,
				ToolErrors: 7, ApprovalsRequested: 8, ApprovalsDenied: 9, Steered: 10}},
		"TurnError": failure,
		"ToolApprovalRequested": &runtime.ToolApprovalRequested{CallID: "c1", Name: "rm", Arguments: `{}`, Preview: "removes a",
			Deadline: time.Unix(1700000060, 5).UTC()},
		"ToolApprovalDecided": &runtime.ToolApprovalDecided{CallID: "c1", Name: "rm", Approved: true, Reason: "ok", TimedOut: true, DecidedBy: "ops"},
		"Steered":             &runtime.Steered{Message: user, RequestID: "r1"},
	}
}

// omittedPayloads are the payloads whose wire form can say that a part
// was left out for size (Fit): read back, they say so too.
func omittedPayloads() map[string]runtime.Payload {
	return map[string]runtime.Payload{
		"Compaction":    &runtime.Compaction{Strategy: "keep_ends", ReplacedFrom: 1, ReplacedCount: 3, ReplacementOmitted: true},
		"TurnCompleted": &runtime.TurnCompleted{Reason: runtime.EndTurn, MessagesOmitted: true},
	}
}

// TestEveryEventRoundTrips: every payload the runtime emits, converted
// for the wire and read back (RuntimeEvent, as a resumed turn reads its
// log), is the payload it was, with the event's seq, time and turn id; and
// the event read back converts to the same wire form again.
func TestEveryEventRoundTrips(t *testing.T) {
	full := fullPayloads()
	if n := len(runtimePayloadTypes(t)); len(full) != n {
		t.Errorf("fullPayloads has %d entries, the runtime %d payload types", len(full), n)
	}
	for _, name := range runtimePayloadTypes(t) {
		if _, ok := full[name]; !ok {
			t.Errorf("runtime payload %s has no sample in fullPayloads: add one, and its conversions both ways", name)
		}
	}
	for _, samples := range []map[string]runtime.Payload{full, omittedPayloads()} {
		for name, p := range samples {
			t.Run(name, func(t *testing.T) {
				ev := runtime.Event{Seq: 7, Time: time.Unix(1700000000, 123456789).UTC(), TurnID: "t", Payload: p}
				out, err := AgentEvent(ev)
				if err != nil {
					t.Fatal(err)
				}
				back, err := RuntimeEvent(out)
				if err != nil {
					t.Fatalf("RuntimeEvent(%v): %v", out, err)
				}
				if diff := cmp.Diff(ev, back); diff != "" {
					t.Errorf("read back differs (-sent +read):\n%s", diff)
				}
				again, err := AgentEvent(back)
				if err != nil || !proto.Equal(again, out) {
					t.Errorf("converted again: %v, %v; want %v", again, err, out)
				}
			})
		}
	}
}

// TestEveryOneofCaseReadsBack walks the AgentEvent oneof by reflection:
// each of its cases is produced by a runtime payload and read back into
// one, so a case added to the proto without both conversions fails here.
func TestEveryOneofCaseReadsBack(t *testing.T) {
	byCase := map[protoreflect.Name]*turnstilev1.AgentEvent{}
	for _, p := range fullPayloads() {
		out, err := AgentEvent(runtime.Event{Seq: 1, Time: time.Unix(1, 0), TurnID: "t", Payload: p})
		if err != nil {
			t.Fatal(err)
		}
		oneof := out.ProtoReflect().Descriptor().Oneofs().ByName("payload")
		byCase[out.ProtoReflect().WhichOneof(oneof).Name()] = out
	}
	fields := (&turnstilev1.AgentEvent{}).ProtoReflect().Descriptor().Oneofs().ByName("payload").Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		ev, ok := byCase[f.Name()]
		if !ok {
			// A case no payload produces: it must still read back, or
			// fail as unmapped.
			ev = &turnstilev1.AgentEvent{Seq: 1}
			m := ev.ProtoReflect()
			m.Set(f, m.NewField(f))
			t.Errorf("AgentEvent.%s is produced by no runtime payload", f.Name())
		}
		if _, err := RuntimeEvent(ev); err != nil {
			t.Errorf("AgentEvent.%s does not read back: %v", f.Name(), err)
		}
	}
	if _, err := RuntimeEvent(&turnstilev1.AgentEvent{Seq: 1}); !errors.Is(err, ErrUnmapped) {
		t.Errorf("an event without a payload read back with %v; want ErrUnmapped", err)
	}
}
