package runtime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/turnstile-dev/turnstile/llm"
)

// summaryPrompt is the system prompt of a summary call.
const summaryPrompt = "You compact an agent's conversation that grew too long for its model. " +
	"Summarize the transcript you are given: the user's goals and constraints, decisions made, " +
	"facts learned from tools (names, ids, numbers, paths) and what is still open. " +
	"Write only the summary, in the language of the conversation, as concisely as fidelity allows."

// Bounds of a summary call.
const (
	// DefaultSummaryTimeout bounds a summary call when Summarize.Timeout
	// is zero.
	DefaultSummaryTimeout = 60 * time.Second
	// defaultSummaryTokens caps the summary when the summarizing model has
	// no max_output_tokens.
	defaultSummaryTokens = 1024
	// defaultTranscriptBytes caps the transcript sent to a summarizing
	// model whose context window is unknown.
	defaultTranscriptBytes = 256 << 10
)

// errNoSummaryModel is the cause of a summary asked of an alias that is
// not configured.
var errNoSummaryModel = errors.New("runtime: the summary model is not configured")

// Summarize is a [Compactor] that drops what [KeepEnds] drops and puts in
// its place a summary of it written by another model: one call to
// Model's provider, bounded by Timeout. When the call fails, the result
// is KeepEnds' (its note in place of the summary), and the Compaction
// event's summary_error says why. One Summarize compacts once.
type Summarize struct {
	// Model writes the summary; Alias names it (Model is nil when the
	// alias is not configured).
	Model *Model
	Alias string
	// KeepEnds chooses what is dropped, and compacts when the summary
	// fails.
	KeepEnds KeepEnds
	// Timeout bounds the summary call (default DefaultSummaryTimeout).
	Timeout time.Duration

	err     error     // why the summary failed, nil when it did not
	usage   llm.Usage // what the summary call used
	cutOnly bool      // nothing was dropped: KeepEnds only cut tool results
}

// Name returns "summarize".
func (*Summarize) Name() string { return string(CompactSummarize) }

// outcome returns the strategy that compacted and, when the summary
// failed, why.
func (s *Summarize) outcome() (strategy, summaryErr string) {
	switch {
	case s.err != nil:
		return KeepEnds{}.Name(), s.err.Error()
	case s.cutOnly:
		return KeepEnds{}.Name(), ""
	}
	return s.Name(), ""
}

// Compact implements [Compactor]. Its error is always nil: a summary that
// fails falls back to KeepEnds.
func (s *Summarize) Compact(ctx context.Context, system string, msgs []llm.Message) ([]llm.Message, error) {
	out, first, start := s.KeepEnds.plan(msgs)
	if start < 0 {
		s.cutOnly = true
		return out, nil
	}
	summary, err := s.summary(ctx, out[first+1:start])
	if err != nil {
		s.err = err
		return s.KeepEnds.Compact(ctx, system, msgs)
	}
	m := llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(fmt.Sprintf(
		"[A summary of %d earlier messages, omitted to fit the context window]\n%s", start-first-1, summary))}}
	return splice(out, first, start, m), nil
}

// summary asks s.Model for a summary of dropped.
func (s *Summarize) summary(ctx context.Context, dropped []llm.Message) (string, error) {
	m := s.Model
	if m == nil || m.Provider == nil {
		return "", fmt.Errorf("%w: %q", errNoSummaryModel, s.Alias)
	}
	limit := defaultTranscriptBytes
	if m.ContextWindow > 0 {
		limit = m.ContextWindow * bytesPerToken * 3 / 4
	}
	maxOut := m.MaxOutputTokens
	if maxOut <= 0 {
		maxOut = defaultSummaryTokens
	}
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = DefaultSummaryTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req := &llm.Request{
		Model:           m.ID,
		System:          summaryPrompt,
		Messages:        []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(transcript(dropped, limit))}}},
		MaxOutputTokens: maxOut,
	}
	var b strings.Builder
	stopped := false
	for ch, err := range m.Provider.Stream(ctx, req) {
		if err != nil {
			// The class and the provider's message only: a cause may hold
			// a URL or other detail that has no place in an event.
			e := llm.AsError(err)
			return "", fmt.Errorf("the summary call to %s failed: %s: %s", s.Alias, e.Kind, e.Message)
		}
		switch ch.Kind {
		case llm.ChunkText:
			b.WriteString(ch.Text)
		case llm.ChunkUsage:
			s.usage = ch.Usage
		case llm.ChunkStop:
			stopped = true
		}
	}
	switch {
	case !stopped:
		return "", fmt.Errorf("the summary call to %s ended before the model finished", s.Alias)
	case strings.TrimSpace(b.String()) == "":
		return "", fmt.Errorf("the summary call to %s returned no text", s.Alias)
	}
	return strings.TrimSpace(b.String()), nil
}

// transcript renders msgs as text for the summarizing model, at most
// limit bytes (the middle of a longer one is cut).
func transcript(msgs []llm.Message, limit int) string {
	var b strings.Builder
	for _, m := range msgs {
		for _, p := range m.Parts {
			switch {
			case p.Kind == llm.PartText && p.Text != "":
				fmt.Fprintf(&b, "%s: %s\n", m.Role, p.Text)
			case p.Kind == llm.PartToolCall && p.ToolCall != nil:
				fmt.Fprintf(&b, "assistant called tool %s with %s\n", p.ToolCall.Name, p.ToolCall.Arguments)
			case p.Kind == llm.PartToolResult && p.ToolResult != nil:
				state := "returned"
				if p.ToolResult.IsError {
					state = "failed with"
				}
				fmt.Fprintf(&b, "tool %s %s: %s\n", p.ToolResult.Name, state, p.ToolResult.Content)
			}
		}
	}
	s := b.String()
	if len(s) <= limit {
		return s
	}
	// Cut at the start of a character, so the text stays UTF-8.
	head, tail := limit/2, len(s)-limit/2
	for head > 0 && !utf8.RuneStart(s[head]) {
		head--
	}
	for tail < len(s) && !utf8.RuneStart(s[tail]) {
		tail++
	}
	return s[:head] + fmt.Sprintf("\n[%d bytes omitted]\n", tail-head) + s[tail:]
}
