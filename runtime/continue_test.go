package runtime_test

import (
	"context"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// cutAfter returns a reply that streams text, then loses its connection.
func cutAfter(text ...string) fake.Reply {
	var chunks []llm.Chunk
	for _, s := range text {
		chunks = append(chunks, llm.Chunk{Kind: llm.ChunkText, Text: s})
	}
	return fake.Reply{Chunks: chunks, Err: &llm.Error{Kind: llm.KindNetwork, Message: "connection reset"}}
}

func textMsg(role llm.Role, text string) llm.Message {
	return llm.Message{Role: role, Parts: []llm.Part{llm.TextPart(text)}}
}

// TestStreamCutContinues: with on_stream_cut continue, the text a cut
// stream showed stays (the retry says discard_partial false), the next call
// continues it — from a prefill where the provider has one, else after a
// continuation prompt the client never sees — and the committed reply is
// the partial text and its continuation, with nothing repeated or missing
// at the seam.
func TestStreamCutContinues(t *testing.T) {
	const want = "The quick brown fox jumps over the lazy dog."
	tests := []struct {
		name    string
		prefill bool
		cut     fake.Reply
		rest    string
		// tail is what the continuing request sends after the user's message.
		tail []llm.Message
	}{
		{"prompt", false, cutAfter("The quick ", "brown fox"), " jumps over the lazy dog.", []llm.Message{
			textMsg(llm.RoleAssistant, "The quick brown fox"),
			textMsg(llm.RoleUser, runtime.ContinuationPrompt),
		}},
		{"prefill", true, cutAfter("The quick ", "brown fox"), " jumps over the lazy dog.", []llm.Message{
			textMsg(llm.RoleAssistant, "The quick brown fox"),
		}},
		{"prefill cut after a space", true, cutAfter("The quick ", "brown fox "), " jumps over the lazy dog.", []llm.Message{
			textMsg(llm.RoleAssistant, "The quick brown fox"),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := fake.NewProvider(tt.cut, fake.Reply{Chunks: fake.Text(tt.rest)})
			p.Caps.Prefill = tt.prefill
			m := model("a", p)
			m.OnStreamCut = runtime.StreamCutContinue
			obs := &continuesLog{}
			r := newRunner(t, []*runtime.Model{m}, nil, runtime.WithObserver(obs))
			evs, res, terr := run(t, t.Context(), r, userTurn("hi"))
			if terr != nil {
				t.Fatal(terr)
			}
			wantEvents := "start | call a#1 | text | failed STREAM_INTERRUPTED | retry 2/3 STREAM_INTERRUPTED | call a#2 | text | finished | usage | commit assistant | completed end_turn"
			if got := describeAll(evs); got != wantEvents {
				t.Errorf("events:\n got %s\nwant %s", got, wantEvents)
			}
			if len(res.Messages) != 1 || len(res.Messages[0].Parts) != 1 || res.Messages[0].Text() != want {
				t.Errorf("committed %+v, want one text part %q", res.Messages, want)
			}
			if got := shownText(evs); got != want {
				t.Errorf("shown %q, want %q", got, want)
			}
			if diff := cmp.Diff(tt.tail, p.Requests()[1].Messages[1:]); diff != "" {
				t.Errorf("continuing request (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]bool{false, true}, obs.continues); diff != "" {
				t.Errorf("AttemptInfo.Continues per call (-want +got):\n%s", diff)
			}
		})
	}
}

// continuesLog notes, per call, whether it continues a reply.
type continuesLog struct {
	runtime.NopObserver
	mu        sync.Mutex
	continues []bool
}

func (o *continuesLog) AttemptStart(ctx context.Context, a runtime.AttemptInfo) context.Context {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.continues = append(o.continues, a.Continues)
	return ctx
}

// TestStreamCutContinueEdges: what continue does not keep, and where it
// continues.
func TestStreamCutContinueEdges(t *testing.T) {
	toolCut := fake.Reply{
		Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "Let me look."}, {Kind: llm.ChunkToolCallStart, CallID: "c1", Name: "lookup"}},
		Err:    &llm.Error{Kind: llm.KindNetwork, Message: "connection reset"},
	}
	thinkingCut := fake.Reply{
		Chunks: []llm.Chunk{{Kind: llm.ChunkThinking, Text: "hmm"}, {Kind: llm.ChunkText, Text: "So"}},
		Err:    &llm.Error{Kind: llm.KindNetwork, Message: "connection reset"},
	}
	tests := []struct {
		name      string
		primary   []fake.Reply
		backup    []fake.Reply // nil: no fallback
		cut       runtime.StreamCut
		events    string
		committed string
	}{
		{
			name:      "a cut during a tool call restarts",
			primary:   []fake.Reply{toolCut, {Chunks: fake.Text("All good.")}},
			cut:       runtime.StreamCutContinue,
			events:    "start | call a#1 | text | tooldelta | failed STREAM_INTERRUPTED | retry 2/3 STREAM_INTERRUPTED discard | call a#2 | text | finished | usage | commit assistant | completed end_turn",
			committed: "All good.",
		},
		{
			name:      "a cut during reasoning restarts",
			primary:   []fake.Reply{thinkingCut, {Chunks: fake.Text("All good.")}},
			cut:       runtime.StreamCutContinue,
			events:    "start | call a#1 | thinking | text | failed STREAM_INTERRUPTED | retry 2/3 STREAM_INTERRUPTED discard | call a#2 | text | finished | usage | commit assistant | completed end_turn",
			committed: "All good.",
		},
		{
			name:      "restart is the default",
			primary:   []fake.Reply{cutAfter("The quick"), {Chunks: fake.Text("A whole reply.")}},
			events:    "start | call a#1 | text | failed STREAM_INTERRUPTED | retry 2/3 STREAM_INTERRUPTED discard | call a#2 | text | finished | usage | commit assistant | completed end_turn",
			committed: "A whole reply.",
		},
		{
			name:      "kept text, then a cut during a tool call: everything the step showed is dropped",
			primary:   []fake.Reply{cutAfter("The quick"), toolCut, {Chunks: fake.Text("All good.")}},
			cut:       runtime.StreamCutContinue,
			events:    "start | call a#1 | text | failed STREAM_INTERRUPTED | retry 2/3 STREAM_INTERRUPTED | call a#2 | text | tooldelta | failed STREAM_INTERRUPTED | retry 3/3 STREAM_INTERRUPTED discard | call a#3 | text | finished | usage | commit assistant | completed end_turn",
			committed: "All good.",
		},
		{
			name:      "two cuts in a row are both kept",
			primary:   []fake.Reply{cutAfter("The quick"), cutAfter(" brown fox"), {Chunks: fake.Text(" jumps.")}},
			cut:       runtime.StreamCutContinue,
			events:    "start | call a#1 | text | failed STREAM_INTERRUPTED | retry 2/3 STREAM_INTERRUPTED | call a#2 | text | failed STREAM_INTERRUPTED | retry 3/3 STREAM_INTERRUPTED | call a#3 | text | finished | usage | commit assistant | completed end_turn",
			committed: "The quick brown fox jumps.",
		},
		{
			name:      "the next model continues after the retries",
			primary:   []fake.Reply{cutAfter("The quick"), {Err: providerErr(llm.KindServerError, 0)}},
			backup:    []fake.Reply{{Chunks: fake.Text(" brown fox.")}},
			cut:       runtime.StreamCutContinue,
			events:    "start | call a#1 | text | failed STREAM_INTERRUPTED | retry 2/3 STREAM_INTERRUPTED | call a#2 | failed SERVER_ERROR | retry 3/3 SERVER_ERROR | call a#3 | failed SERVER_ERROR | fallback a>b SERVER_ERROR | call b#1 | text | finished | usage | commit assistant | completed end_turn",
			committed: "The quick brown fox.",
		},
		{
			name:    "the turn fails: the kept text is not committed",
			primary: []fake.Reply{cutAfter("The quick"), {Err: providerErr(llm.KindAuth, 0)}},
			cut:     runtime.StreamCutContinue,
			events:  "start | call a#1 | text | failed STREAM_INTERRUPTED | retry 2/3 STREAM_INTERRUPTED | call a#2 | failed AUTH | error AUTH retryable=false",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := model("a", fake.NewProvider(tt.primary...))
			a.OnStreamCut = tt.cut
			models := []*runtime.Model{a}
			if tt.backup != nil {
				a.Fallbacks = []string{"b"}
				models = append(models, model("b", fake.NewProvider(tt.backup...)))
			}
			r := newRunner(t, models, nil)
			evs, res, _ := run(t, t.Context(), r, userTurn("hi"))
			if got := describeAll(evs); got != tt.events {
				t.Errorf("events:\n got %s\nwant %s", got, tt.events)
			}
			if tt.committed == "" {
				if res != nil {
					t.Errorf("the turn completed: %+v", res)
				}
				return
			}
			if res == nil || len(res.Messages) != 1 || res.Messages[0].Text() != tt.committed {
				t.Fatalf("committed %+v, want %q", res, tt.committed)
			}
			if got := shownText(evs); got != tt.committed {
				t.Errorf("shown %q, want %q", got, tt.committed)
			}
		})
	}
}
