package runtime

import (
	"strings"
	"unicode"

	"github.com/turnstile-dev/turnstile/llm"
)

// StreamCut says what a turn does with the text a model already streamed
// when its stream is cut (the connection drops, the stream stalls, the
// provider fails mid-reply) and the policy retries or falls back.
type StreamCut string

// The behaviours of [StreamCut].
const (
	// StreamCutRestart drops the partial output (the retry or fallback
	// event says discard_partial) and asks for the whole reply again. The
	// default; the empty value means it too.
	StreamCutRestart StreamCut = "restart"
	// StreamCutContinue keeps partial text: the text already shown stays
	// (discard_partial is false) and the next call, on the same model or
	// the next, continues it, so the committed reply is the partial text
	// followed by the continuation. A cut during anything but text (a tool
	// call, reasoning) restarts.
	StreamCutContinue StreamCut = "continue"
)

// valid reports whether s is one of the behaviours, or empty.
func (s StreamCut) valid() bool {
	return s == "" || s == StreamCutRestart || s == StreamCutContinue
}

// ContinuationPrompt is the user message sent, inside the turn only, after
// a reply cut short (by the output token limit or a cut stream) when the
// model cannot continue the reply from an assistant prefill. It is never
// committed: the client gets the continued reply as one assistant message.
const ContinuationPrompt = "Your previous reply was cut off. Continue exactly where it stopped, without repeating or summarising anything."

// continuation returns the messages that follow the conversation in a call
// continuing reply, the assistant output written so far, to a model with
// caps, and the whitespace the continuation's text must not repeat. With
// a model that takes prefill ([llm.Capabilities].Prefill) and a reply of
// text only, the reply itself is the last message (its trailing
// whitespace removed, as APIs reject it; the continuation's leading copy
// of it is then dropped, since the client has shown it). Otherwise the
// reply is followed by [ContinuationPrompt]: a model that refuses prefill
// (Claude 4.6 and later) or answers a trailing assistant message instead
// of continuing it (Chat Completions, Gemini) gets a conversation that
// ends with a user message.
func continuation(caps llm.Capabilities, reply []llm.Part) (msgs []llm.Message, seam string) {
	if caps.Prefill && textOnly(reply) {
		text := joinText(reply)
		if trimmed := strings.TrimRightFunc(text, unicode.IsSpace); trimmed != "" {
			return []llm.Message{{Role: llm.RoleAssistant, Parts: []llm.Part{llm.TextPart(trimmed)}}}, text[len(trimmed):]
		}
	}
	return []llm.Message{
		{Role: llm.RoleAssistant, Parts: reply},
		{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(ContinuationPrompt)}},
	}, ""
}

// continuable reports whether the partial output of a cut stream may be
// continued: text only (a tool call or reasoning cut short restarts), and
// not blank.
func continuable(parts []llm.Part) bool {
	return textOnly(parts) && strings.TrimSpace(joinText(parts)) != ""
}

func textOnly(parts []llm.Part) bool {
	for _, p := range parts {
		if p.Kind != llm.PartText {
			return false
		}
	}
	return len(parts) > 0
}

func joinText(parts []llm.Part) string {
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// mergeParts returns the parts of a reply written in pieces: a followed by
// b, where a text part ending a and one starting b become one part.
func mergeParts(a, b []llm.Part) []llm.Part {
	if len(a) == 0 {
		return b
	}
	out := make([]llm.Part, 0, len(a)+len(b))
	out = append(out, a...)
	for _, p := range b {
		if n := len(out); n > 0 && p.Kind == llm.PartText && out[n-1].Kind == llm.PartText {
			out[n-1].Text += p.Text
			continue
		}
		out = append(out, p)
	}
	return out
}
