package wire

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// samplePayloads holds one payload of every type the runtime emits, keyed
// by type name. TestEveryPayloadIsMapped fails when the runtime gains a
// payload this table (and so, fromEvent) does not know.
var samplePayloads = map[string]runtime.Payload{
	"TurnStarted":     &runtime.TurnStarted{Model: "m"},
	"LLMCallStarted":  &runtime.LLMCallStarted{Model: "m", Attempt: 1, Call: 1},
	"TextDelta":       &runtime.TextDelta{Text: "hi"},
	"ThinkingDelta":   &runtime.ThinkingDelta{Text: "hmm"},
	"ToolCallDelta":   &runtime.ToolCallDelta{Index: 0, CallID: "c1", Name: "t"},
	"LLMCallFinished": &runtime.LLMCallFinished{Model: "m", Attempt: 1},
	"UsageUpdated":    &runtime.UsageUpdated{Total: llm.Usage{InputTokens: 1}},
	"Retry":           &runtime.Retry{Attempt: 2, MaxAttempts: 3, Kind: llm.KindOverloaded},
	"Fallback":        &runtime.Fallback{From: "a", To: "b", Kind: llm.KindOverloaded},
	"Hedge":           &runtime.Hedge{From: "a", To: "b", After: 250 * time.Millisecond},
	"Compaction": &runtime.Compaction{Strategy: "keep_ends", BeforeCall: true, ReplacedFrom: 1, ReplacedCount: 3,
		Replacement: []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("[3 earlier messages were omitted]")}}}},
	"MessageCompleted":      &runtime.MessageCompleted{Message: llm.Message{Role: llm.RoleAssistant, Parts: []llm.Part{llm.TextPart("hi")}}},
	"ToolStarted":           &runtime.ToolStarted{CallID: "c1", Name: "t"},
	"ToolProgress":          &runtime.ToolProgress{CallID: "c1", Name: "t"},
	"ToolFinished":          &runtime.ToolFinished{CallID: "c1", Name: "t"},
	"TurnCompleted":         &runtime.TurnCompleted{Reason: runtime.EndTurn},
	"TurnError":             &runtime.TurnError{Kind: llm.KindOverloaded, Message: "x"},
	"ToolApprovalRequested": &runtime.ToolApprovalRequested{CallID: "c1", Name: "t", Arguments: "{}", Deadline: time.Unix(2, 0)},
	"ToolApprovalDecided":   &runtime.ToolApprovalDecided{CallID: "c1", Name: "t", Reason: "no", DecidedBy: "k"},
	"Steered":               &runtime.Steered{Message: llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("stop")}}},
}

// runtimePayloadTypes returns the names of the runtime's payload types: the
// types with an isPayload method, read from the package's source.
func runtimePayloadTypes(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../runtime/*.go")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	fset := token.NewFileSet()
	for _, f := range files {
		if filepath.Ext(f) != ".go" || len(f) > 8 && f[len(f)-8:] == "_test.go" {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Name.Name != "isPayload" || fd.Recv == nil {
				continue
			}
			typ := fd.Recv.List[0].Type
			if star, ok := typ.(*ast.StarExpr); ok {
				typ = star.X
			}
			names = append(names, typ.(*ast.Ident).Name)
		}
	}
	slices.Sort(names)
	if len(names) == 0 {
		t.Fatal("found no payload types in ../../runtime")
	}
	return names
}

// TestEveryPayloadIsMapped holds the runtime's payloads, the proto's
// AgentEvent oneof and fromEvent to each other: every runtime payload maps
// to a oneof case, and every oneof case is produced by some payload.
func TestEveryPayloadIsMapped(t *testing.T) {
	produced := map[protoreflect.Name]bool{}
	for _, name := range runtimePayloadTypes(t) {
		p, ok := samplePayloads[name]
		if !ok {
			t.Errorf("runtime payload %s has no sample here: add one, and its mapping to fromEvent", name)
			continue
		}
		out, err := fromEvent(runtime.Event{Seq: 1, Time: time.Unix(1, 0), TurnID: "t", Payload: p})
		if err != nil || out.GetPayload() == nil {
			t.Errorf("fromEvent(%s) = %v, %v; want a payload", name, out, err)
			continue
		}
		oneof := out.ProtoReflect().Descriptor().Oneofs().ByName("payload")
		produced[out.ProtoReflect().WhichOneof(oneof).Name()] = true
	}
	fields := (&turnstilev1.AgentEvent{}).ProtoReflect().Descriptor().Oneofs().ByName("payload").Fields()
	for i := range fields.Len() {
		if f := fields.Get(i); !produced[f.Name()] {
			t.Errorf("AgentEvent.%s is produced by no runtime payload", f.Name())
		}
	}
	if len(samplePayloads) != len(runtimePayloadTypes(t)) {
		t.Errorf("samplePayloads has %d entries, the runtime %d payload types", len(samplePayloads), len(runtimePayloadTypes(t)))
	}
}

// unknownPayload stands for a payload fromEvent has no mapping for.
type unknownPayload struct{ runtime.Payload }

func TestUnmappedPayloadIsAnError(t *testing.T) {
	if out, err := fromEvent(runtime.Event{Seq: 1, Payload: unknownPayload{}}); err == nil {
		t.Errorf("fromEvent(unknown) = %v, nil; want an error", out)
	}
}

// TestEveryKindIsMapped holds the error classes to the wire: each has an
// ErrorCode of its own name and a status code.
func TestEveryKindIsMapped(t *testing.T) {
	for _, k := range llm.Kinds() {
		if got := errorCode(k); got.String() != "ERROR_CODE_"+k.String() {
			t.Errorf("errorCode(%s) = %s", k, got)
		}
	}
}

// TestToResponseMatchesFromEvent holds the sink's single-allocation
// mapping to fromEvent, for every payload.
func TestToResponseMatchesFromEvent(t *testing.T) {
	for name, p := range samplePayloads {
		ev := runtime.Event{Seq: 7, Time: time.Unix(1700000000, 123456789), TurnID: "t", Payload: p}
		want, err := fromEvent(ev)
		if err != nil {
			t.Fatal(err)
		}
		got, err := toResponse(ev)
		if err != nil || !proto.Equal(got.GetEvent(), want) {
			t.Errorf("toResponse(%s) = %v, %v; want the event %v", name, got, err, want)
		}
	}
	if _, err := toResponse(runtime.Event{Seq: 1, Payload: unknownPayload{}}); err == nil {
		t.Error("toResponse(unknown) succeeded; want an error")
	}
}
