package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// eventRenderer shows a turn's events.
type eventRenderer interface {
	render(ev *client.Event) error
	done(res *client.Result)
	close()
}

// jsonRenderer prints each event as one turnstile.v1.ClientEvent in
// protojson per line: the server's events and the client's step retries
// alike.
type jsonRenderer struct {
	out    io.Writer
	turnID string
}

func (j *jsonRenderer) render(ev *client.Event) error {
	line, err := protojson.Marshal(clientEvent(ev, j.turnID))
	if err != nil {
		return fmt.Errorf("encoding an event: %w", err)
	}
	_, err = fmt.Fprintf(j.out, "%s\n", line)
	return err
}

func (j *jsonRenderer) done(*client.Result) {}
func (j *jsonRenderer) close()              {}

// clientEvent is the contract's form of a client event.
func clientEvent(ev *client.Event, turnID string) *turnstilev1.ClientEvent {
	ce := &turnstilev1.ClientEvent{Attempt: uint32(ev.Attempt), TurnId: turnID}
	switch {
	case ev.Agent != nil:
		ce.Kind = &turnstilev1.ClientEvent_Agent{Agent: ev.Agent}
	case ev.StepRetry != nil:
		sr := ev.StepRetry
		e := &turnstilev1.Error{
			Code:      sr.Err.Code,
			Message:   sr.Err.Message,
			Retryable: &sr.Err.Retryable,
			Model:     sr.Err.Model,
			Attempts:  sr.Err.ModelAttempts,
		}
		if sr.Err.RetryAfter > 0 {
			e.RetryAfter = durationpb.New(sr.Err.RetryAfter)
		}
		ce.Kind = &turnstilev1.ClientEvent_StepRetry{StepRetry: &turnstilev1.StepRetry{
			Attempt:        uint32(sr.Attempt),
			MaxAttempts:    uint32(sr.MaxAttempts),
			Delay:          durationpb.New(sr.Delay),
			Error:          e,
			DiscardPartial: sr.DiscardPartial,
			Messages:       sr.Messages,
		}}
	}
	return ce
}

// ANSI sequences, used only on terminals that take them.
const (
	ansiDim    = "\x1b[2m"
	ansiYellow = "\x1b[33m"
	ansiReset  = "\x1b[0m"
)

// textRenderer renders a turn for a person: text as it arrives, wrapped at
// word boundaries on a terminal, thinking dimmed, tool calls, progress and
// results, notices on stderr.
type textRenderer struct {
	out, errw io.Writer
	con       console
	spin      *spinner
	wrap      wrapper
	mode      string // what stdout shows last: "", "text", "thinking", "tool"
	anyOutput bool
	// shown reports output written since the last committed message;
	// shownCommitted, for each message committed, whether output of it was
	// written. Together they say whether a discard drops anything shown.
	shown          bool
	shownCommitted []bool
	// calls are the tool calls of committed messages, by id; started the
	// ids of the calls a tool_started announced.
	calls   map[string]*turnstilev1.ToolCall
	started map[string]bool
	// cut reports that the last reply stopped at the output token limit.
	cut bool
	// steering holds the texts of the steering messages received and not
	// yet committed.
	steering []string
}

func newTextRenderer(stdout, stderr io.Writer, con console) *textRenderer {
	r := &textRenderer{
		out: stdout, errw: stderr, con: con, wrap: wrapper{width: con.width},
		calls: map[string]*turnstilev1.ToolCall{}, started: map[string]bool{},
	}
	if con.spinner {
		r.spin = &spinner{w: stderr}
		r.spin.start("waiting for the model")
	}
	return r
}

const discarded = "; the partial output above is discarded"

func (r *textRenderer) render(ev *client.Event) error {
	if sr := ev.StepRetry; sr != nil {
		msg := fmt.Sprintf("%s: %s; resuming the turn in %s (resume %d of %d)",
			client.CodeName(sr.Err.Code), sr.Err.Message, roundDelay(sr.Delay), sr.Attempt-1, sr.MaxAttempts-1)
		if sr.DiscardPartial && r.discard(len(sr.Messages)) {
			msg += discarded
		}
		r.notice(msg)
		r.waiting()
		return nil
	}
	a := ev.Agent
	switch p := a.GetPayload().(type) {
	case *turnstilev1.AgentEvent_TextDelta:
		return r.write("text", p.TextDelta.GetText())
	case *turnstilev1.AgentEvent_ThinkingDelta:
		return r.write("thinking", p.ThinkingDelta.GetText())
	case *turnstilev1.AgentEvent_ToolCallDelta:
		r.stopSpinner()
	case *turnstilev1.AgentEvent_MessageCompleted:
		r.shownCommitted = append(r.shownCommitted, r.shown)
		r.shown = false
		if m := p.MessageCompleted.GetMessage(); m.GetRole() == turnstilev1.Role_ROLE_USER {
			if i := slices.Index(r.steering, messageText(m)); i >= 0 {
				r.steering = slices.Delete(r.steering, i, i+1)
				if err := r.line("steered", "» "+clip(messageText(m), 300)); err != nil {
					return err
				}
				r.waiting()
			}
		}
		for _, part := range p.MessageCompleted.GetMessage().GetParts() {
			if c := part.GetToolCall(); c != nil {
				r.calls[c.GetId()] = c
			}
		}
	case *turnstilev1.AgentEvent_LlmCallFinished:
		r.cut = p.LlmCallFinished.GetError() == nil && p.LlmCallFinished.GetStopReason() == turnstilev1.StopReason_STOP_REASON_MAX_TOKENS
	case *turnstilev1.AgentEvent_LlmCallStarted:
		if r.cut {
			r.cut = false
			r.notice(fmt.Sprintf("the reply reached the output token limit; model %s continues it", p.LlmCallStarted.GetModel()))
			r.waiting()
		}
	case *turnstilev1.AgentEvent_ToolStarted:
		t := p.ToolStarted
		r.started[t.GetCallId()] = true
		if err := r.line("tool", toolLine(t.GetName(), t.GetArguments())); err != nil {
			return err
		}
		r.waiting()
	case *turnstilev1.AgentEvent_ToolProgress:
		t := p.ToolProgress
		if err := r.line("tool", progressLine(t)); err != nil {
			return err
		}
		r.waiting()
	case *turnstilev1.AgentEvent_ToolFinished:
		t := p.ToolFinished
		if !r.started[t.GetCallId()] {
			// A call that did not run (an unknown tool, bad arguments, a
			// disabled tool) has no tool_started: show the call first.
			if err := r.line("tool", toolLine(t.GetName(), r.calls[t.GetCallId()].GetArguments())); err != nil {
				return err
			}
		}
		delete(r.started, t.GetCallId())
		if err := r.line("tool", resultLine(t)); err != nil {
			return err
		}
		r.waiting()
	case *turnstilev1.AgentEvent_Retry:
		e := p.Retry
		msg := fmt.Sprintf("model %s: %s: %s; retrying in %s (retry %d of %d)",
			e.GetModel(), client.CodeName(e.GetReason()), e.GetMessage(), roundDelay(e.GetDelay().AsDuration()), e.GetAttempt()-1, e.GetMaxAttempts()-1)
		if to := e.GetToDeployment(); to != "" {
			msg = fmt.Sprintf("model %s: %s: %s; moving to its deployment %s", e.GetModel(), client.CodeName(e.GetReason()), e.GetMessage(), to)
		}
		if e.GetDiscardPartial() && r.discard(len(r.shownCommitted)) {
			msg += discarded
		}
		r.noticeAt(msg, e.GetDiscardPartial())
		r.waiting()
	case *turnstilev1.AgentEvent_Fallback:
		e := p.Fallback
		msg := fmt.Sprintf("model %s: %s: %s; falling back to model %s", e.GetFromModel(), client.CodeName(e.GetReason()), e.GetMessage(), e.GetToModel())
		if e.GetDiscardPartial() && r.discard(len(r.shownCommitted)) {
			msg += discarded
		}
		r.noticeAt(msg, e.GetDiscardPartial())
		r.waiting()
	case *turnstilev1.AgentEvent_Hedge:
		e := p.Hedge
		r.notice(fmt.Sprintf("model %s: no output after %s; asking model %s in parallel", e.GetFromModel(), roundDelay(e.GetAfter().AsDuration()), e.GetToModel()))
		r.waiting()
	case *turnstilev1.AgentEvent_ToolApprovalRequested:
		return r.approvalRequested(p.ToolApprovalRequested)
	case *turnstilev1.AgentEvent_ToolApprovalDecided:
		if err := r.line("tool", decisionLine(p.ToolApprovalDecided)); err != nil {
			return err
		}
		r.waiting()
	case *turnstilev1.AgentEvent_Steered:
		// Received, not yet taken: the reply under way goes on, and the
		// message is shown where the turn commits it.
		text := messageText(p.Steered.GetMessage())
		r.steering = append(r.steering, text)
		r.noticeAt("steering message received: "+clip(text, 200)+"; the turn takes it before its next model call", false)
		if r.mode == "" {
			r.waiting()
		}
	case *turnstilev1.AgentEvent_Compaction:
		e := p.Compaction
		how := e.GetStrategy()
		if s := e.GetSummaryError(); s != "" {
			how += ", as the summary failed: " + s
		}
		r.notice(fmt.Sprintf("the conversation was compacted (%s): %d → %d messages", how, e.GetMessagesBefore(), e.GetMessagesAfter()))
	}
	return nil
}

// discard drops what was shown after the first standing messages (those
// of the turn's committed messages that still stand) and reports whether
// any of it had been shown.
func (r *textRenderer) discard(standing int) bool {
	shown := r.shown
	if standing < len(r.shownCommitted) {
		for _, s := range r.shownCommitted[standing:] {
			shown = shown || s
		}
		r.shownCommitted = r.shownCommitted[:standing]
	}
	r.shown = false
	return shown
}

// approvalRequested shows a tool call that waits for a decision, and
// leaves the spinner off: a question may be asked on stderr.
func (r *textRenderer) approvalRequested(e *turnstilev1.ToolApprovalRequested) error {
	// Shown here: a denied call's result needs no line of its own first.
	r.started[e.GetCallId()] = true
	if err := r.line("tool", "? "+strings.TrimPrefix(toolLine(e.GetName(), e.GetArguments()), "⚙ ")+" waits for approval"); err != nil {
		return err
	}
	if pv := e.GetPreview(); pv != "" {
		return r.line("tool", "  preview: "+clip(pv, 300))
	}
	return nil
}

// decisionLine says how a call that waited for approval was decided, and
// by whom.
func decisionLine(e *turnstilev1.ToolApprovalDecided) string {
	s := "  ↳ " + e.GetName() + " approved"
	switch {
	case e.GetTimedOut():
		s = "  ↳ " + e.GetName() + " denied: nobody decided in time"
	case !e.GetApproved():
		s = "  ↳ " + e.GetName() + " denied"
	}
	if by := e.GetDecidedBy(); by != "" {
		s += " by " + by
	}
	if reason := e.GetReason(); reason != "" {
		s += ": " + clip(reason, 300)
	}
	return s
}

// messageText joins the text parts of m.
func messageText(m *turnstilev1.Message) string {
	var texts []string
	for _, p := range m.GetParts() {
		if t := p.GetText(); t != "" {
			texts = append(texts, t)
		}
	}
	return strings.Join(texts, " ")
}

func toolLine(name, args string) string {
	return fmt.Sprintf("⚙ %s(%s)", name, clip(args, 200))
}

func progressLine(t *turnstilev1.ToolProgress) string {
	s := "  … " + t.GetName()
	if m := t.GetMessage(); m != "" {
		s += ": " + clip(m, 200)
	}
	switch {
	case t.GetTotal() > 0:
		s += fmt.Sprintf(" (%s of %s)", number(t.GetProgress()), number(t.GetTotal()))
	case t.GetProgress() > 0:
		s += fmt.Sprintf(" (%s)", number(t.GetProgress()))
	}
	return s
}

func resultLine(t *turnstilev1.ToolFinished) string {
	label := t.GetName() + ":"
	if t.GetIsError() {
		label = t.GetName() + " error:"
	}
	s := fmt.Sprintf("  ↳ %s %s", label, clip(t.GetContent(), 300))
	if d := t.GetDuration().AsDuration(); d > 0 {
		s += fmt.Sprintf(" (%s)", roundDelay(d))
	}
	return s
}

func number(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// write appends a fragment of kind mode ("text" or "thinking") to stdout.
func (r *textRenderer) write(mode, s string) error {
	if s == "" {
		return nil
	}
	r.stopSpinner()
	var b strings.Builder
	if r.mode != mode {
		b.WriteString(r.flushWord())
		if r.wrap.midLine() {
			b.WriteString("\n")
			r.wrap.newline()
		}
		if r.anyOutput {
			b.WriteString("\n")
		}
		if mode == "thinking" && !r.con.color {
			b.WriteString(r.wrap.text("thinking: ", "", ""))
		}
	}
	on, off := r.style(mode)
	b.WriteString(r.wrap.text(s, on, off))
	r.mode, r.anyOutput, r.shown = mode, true, true
	_, err := io.WriteString(r.out, b.String())
	return err
}

func (r *textRenderer) style(mode string) (on, off string) {
	if mode == "thinking" && r.con.color {
		return ansiDim, ansiReset
	}
	return "", ""
}

// flushWord returns the word the wrapper holds back, styled as the mode
// it belongs to.
func (r *textRenderer) flushWord() string {
	on, off := r.style(r.mode)
	return r.wrap.flush(on, off)
}

// line writes a whole line of kind mode to stdout, dimmed on a terminal.
func (r *textRenderer) line(mode, s string) error {
	r.stopSpinner()
	var b strings.Builder
	b.WriteString(r.flushWord())
	if r.wrap.midLine() {
		b.WriteString("\n")
	}
	if r.mode != mode && r.anyOutput {
		b.WriteString("\n")
	}
	if r.con.color {
		s = ansiDim + s + ansiReset
	}
	b.WriteString(s + "\n")
	r.wrap.newline()
	r.mode, r.anyOutput = mode, true
	_, err := io.WriteString(r.out, b.String())
	return err
}

// notice writes a line to stderr, ending stdout's line first.
func (r *textRenderer) notice(msg string) { r.noticeAt(msg, true) }

// noticeAt writes a notice; with endLine false, stdout's text line is ended
// only on a terminal, so a reply that goes on after the notice (a cut
// stream continued) stays as the model wrote it in a file.
func (r *textRenderer) noticeAt(msg string, endLine bool) {
	r.stopSpinner()
	if endLine || r.con.tty {
		r.endLine()
	}
	msg = r.wrapErr("turnstile: " + msg)
	if r.con.errColor {
		msg = ansiYellow + msg + ansiReset
	}
	fmt.Fprintln(r.errw, msg)
}

// wrapErr wraps a line for stderr at its terminal's width.
func (r *textRenderer) wrapErr(s string) string {
	if r.con.errWidth <= 0 {
		return s
	}
	w := wrapper{width: r.con.errWidth}
	return w.text(s, "", "") + w.flush("", "")
}

func (r *textRenderer) waiting() {
	if r.spin != nil {
		r.spin.start("waiting for the model")
	}
}

func (r *textRenderer) stopSpinner() {
	if r.spin != nil {
		r.spin.stop()
	}
}

// endLine writes the held-back word and ends stdout's line.
func (r *textRenderer) endLine() {
	s := r.flushWord()
	if r.wrap.midLine() {
		s += "\n"
	}
	r.wrap.newline()
	if s != "" {
		_, _ = io.WriteString(r.out, s)
	}
}

// done ends stdout's line and prints the usage line on stderr: the tokens,
// the cost when the server knows a price, and one word per counter (model
// calls, tool calls, retries by the server, fallbacks, resumes by this
// command).
func (r *textRenderer) done(res *client.Result) {
	r.close()
	switch res.EndReason {
	case turnstilev1.EndReason_END_REASON_MAX_TOKENS:
		r.notice("the reply was cut at the output token limit")
	case turnstilev1.EndReason_END_REASON_TOOL_ENDED_TURN:
		r.notice("a tool the server lists under ends_turn ended the turn; its result is the last message")
	}
	u, c := res.Usage, res.Counters
	line := fmt.Sprintf("%s · %s in, %s out",
		strings.ToLower(strings.TrimPrefix(res.EndReason.String(), "END_REASON_")),
		plural(int(u.GetInputTokens()), "token"), plural(int(u.GetOutputTokens()), "token"))
	if n := u.GetCacheReadTokens(); n > 0 {
		line += fmt.Sprintf(" (%d cached)", n)
	}
	if c := costText(u); c != "" {
		line += " · " + c
	}
	line += " · " + plural(int(c.GetModelCalls()), "model call")
	if n := c.GetToolCalls(); n > 0 {
		line += " · " + plural(int(n), "tool call")
	}
	if n := c.GetRetries(); n > 0 {
		line += " · " + plural(int(n), "retry")
	}
	if n := c.GetFallbacks(); n > 0 {
		line += " · " + plural(int(n), "fallback")
	}
	if n := c.GetHedges(); n > 0 {
		line += " · " + plural(int(n), "hedge")
	}
	if n := c.GetApprovalsRequested(); n > 0 {
		line += " · " + plural(int(n), "approval request")
		if d := c.GetApprovalsDenied(); d > 0 {
			line += fmt.Sprintf(" (%d denied)", d)
		}
	}
	if n := c.GetSteered(); n > 0 {
		line += " · " + plural(int(n), "steering message")
	}
	if res.Attempts > 1 {
		line += " · " + plural(res.Attempts-1, "resume")
	}
	line = r.wrapErr(line)
	if r.con.errColor {
		line = ansiDim + line + ansiReset
	}
	fmt.Fprintln(r.errw, line)
}

// costText says what the turn's tokens cost ("cost USD 0.00015"), marked
// partial when some call's model had no price; "" when the cost is unknown
// (no price configured), which is never shown as zero.
func costText(u *turnstilev1.Usage) string {
	c := u.GetCost()
	if c == nil {
		return ""
	}
	amount := strconv.FormatInt(c.GetUnits(), 10)
	if n := c.GetNanos(); n != 0 {
		amount += "." + strings.TrimRight(fmt.Sprintf("%09d", n), "0")
	}
	s := "cost " + c.GetCurrency() + " " + amount
	if u.GetCostPartial() {
		s += " (partial: a model without a price was called)"
	}
	return s
}

// close stops the spinner and ends stdout's line; it may be called again.
func (r *textRenderer) close() {
	r.stopSpinner()
	r.endLine()
}

// clip shortens s to n runes on one line.
func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}
