package runtime

import (
	"fmt"

	"github.com/turnstile-dev/turnstile/llm"
)

// ResumeFrom rebuilds a turn's state from the events it emitted, in order
// from its first (seq 1 without gaps): the [Resume] from which another
// runner continues the turn when the one that ran it went away. It
// returns nil when an event ends the turn (there is nothing to resume).
// An event out of order, or of a payload the fold does not know, is an
// error.
//
// The fold decides about every payload of this package (a test holds its
// switches to the payloads there are): what it restores of the turn, in
// add, and whether it moves the turn on, in [Advances].
func ResumeFrom(events []Event) (*Resume, error) {
	f := fold{rs: &Resume{}}
	for i, ev := range events {
		if ev.Seq != uint64(i+1) {
			return nil, fmt.Errorf("runtime: event %d of the turn has seq %d", i+1, ev.Seq)
		}
		if ev.Terminal() {
			return nil, nil
		}
		if err := f.add(ev); err != nil {
			return nil, err
		}
	}
	f.rs.NextSeq = uint64(len(events)) + 1
	if f.rs.DiscardFromSeq != 0 && f.textOnly && f.cut != "" {
		f.rs.Cut = []llm.Part{llm.TextPart(f.cut)}
	}
	return f.rs, nil
}

// fold is the state of [ResumeFrom] between two events.
type fold struct {
	rs *Resume
	// lastStop is why the last model call that completed stopped.
	lastStop llm.StopReason
	// cut is the text streamed from rs.DiscardFromSeq on; textOnly says
	// nothing else was.
	cut      string
	textOnly bool
}

// add folds ev, which is not terminal, into f.
func (f *fold) add(ev Event) error {
	rs := f.rs
	switch p := ev.Payload.(type) {
	case *TurnStarted:
		rs.Model = p.Model
	case *LLMCallStarted:
		rs.Counters.ModelCalls++
		rs.Model = p.Model
	case *TextDelta:
		if rs.DiscardFromSeq == 0 {
			rs.DiscardFromSeq, f.cut, f.textOnly = ev.Seq, "", true
		}
		f.cut += p.Text
	case *ThinkingDelta, *ToolCallDelta:
		if rs.DiscardFromSeq == 0 {
			rs.DiscardFromSeq = ev.Seq
		}
		f.textOnly = false
	case *LLMCallFinished:
		f.lastStop = p.Stop
	case *UsageUpdated:
		rs.Usage = p.Total
	case *Retry:
		rs.Counters.Retries++
		if p.DiscardPartial {
			rs.DiscardFromSeq = 0
		}
	case *Fallback:
		rs.Counters.Fallbacks++
		rs.Model = p.To
		if p.DiscardPartial {
			rs.DiscardFromSeq = 0
		}
	case *Hedge:
		// Its call's LLMCallStarted follows; the call that answers first
		// streams the output.
		rs.Counters.Hedges++
	case *Compaction:
		rs.Counters.Compactions++
		rs.Edits = append(rs.Edits, editOf(p, len(rs.Committed)))
	case *MessageCompleted:
		m := p.Message
		rs.Committed = append(rs.Committed, m)
		rs.DiscardFromSeq = 0
		if m.Role == llm.RoleAssistant {
			rs.LastStop = f.lastStop
			rs.ToolResults, rs.ToolsStarted = map[string]llm.ToolResult{}, map[string]bool{}
			rs.Decided, rs.Requested = map[string]Decided{}, map[string]bool{}
		}
		if m.Role == llm.RoleUser && len(rs.Steering) > 0 {
			// A steering message committed: the oldest queued.
			rs.Steering = rs.Steering[1:]
			rs.Counters.Steered++
		}
	case *Steered:
		rs.Steering = append(rs.Steering, p.Message)
		rs.SteerBytes += len(p.Message.Text())
		if id := p.RequestID; id != "" {
			rs.SteerIDs = append(rs.SteerIDs, SteerID{ID: id, Seq: ev.Seq})
		}
	case *ToolApprovalRequested:
		// A request a resumed turn emitted again counts once.
		if id := p.CallID; !rs.Requested[id] {
			rs.Counters.ApprovalsRequested++
			if rs.Requested != nil {
				rs.Requested[id] = true
			}
		}
	case *ToolApprovalDecided:
		if !p.Approved {
			rs.Counters.ApprovalsDenied++
		}
		if rs.Decided != nil {
			rs.Decided[p.CallID] = Decided{
				Decision: Decision{Approved: p.Approved, Reason: p.Reason, DecidedBy: p.DecidedBy},
				TimedOut: p.TimedOut, Seq: ev.Seq, At: ev.Time,
			}
		}
	case *ToolStarted:
		if rs.ToolsStarted != nil {
			rs.ToolsStarted[p.CallID] = true
		}
	case *ToolProgress:
		// What a tool said while it ran: it runs again, or its result is
		// stored.
	case *ToolFinished:
		rs.Counters.ToolCalls++
		if p.IsError {
			rs.Counters.ToolErrors++
		}
		if rs.ToolResults != nil {
			rs.ToolResults[p.CallID] = llm.ToolResult{CallID: p.CallID, Name: p.Name, Content: p.Content, IsError: p.IsError}
			delete(rs.ToolsStarted, p.CallID)
		}
	case *TurnCompleted, *TurnError:
		return fmt.Errorf("runtime: event %d ends the turn: there is nothing to resume", ev.Seq)
	default:
		return fmt.Errorf("runtime: event %d: the fold does not know the payload %T", ev.Seq, p)
	}
	return nil
}

// Advances reports whether an event of payload p is work its turn did,
// rather than work begun or asked for: the model's output (a text,
// reasoning or tool call delta), a committed message, a tool's result, a
// compaction, or the turn's end. A runner that stored none of those before
// it went away did none of the turn's work: a runner resuming the turn
// makes its other events again (a call or a tool started, a retry) or
// keeps them as they are (what others asked of the turn: an approval
// decided, a steering message). A durable layer bounds by it the
// takeovers of a turn whose runners keep going away before doing any
// work, which the turn itself may be the cause of.
func Advances(p Payload) bool {
	switch p.(type) {
	case *TextDelta, *ThinkingDelta, *ToolCallDelta, *MessageCompleted, *ToolFinished, *Compaction:
		return true
	case *TurnStarted, *LLMCallStarted, *LLMCallFinished, *UsageUpdated, *Retry, *Fallback, *Hedge,
		*ToolStarted, *ToolProgress, *ToolApprovalRequested, *ToolApprovalDecided, *Steered:
		return false
	case *TurnCompleted, *TurnError:
		// The turn's end: there is no runner after it.
		return true
	}
	return false
}

// editOf is the edit of a compaction made once committed messages had
// been committed. One whose replacement was left out of the event (see
// [Compaction].ReplacementOmitted) cannot be replayed: its edit (From -1)
// ends the replay, as a client stops applying the turn's compactions
// there.
func editOf(c *Compaction, committed int) ConversationEdit {
	e := ConversationEdit{Committed: committed, From: c.ReplacedFrom, Count: c.ReplacedCount}
	if c.ReplacementOmitted {
		e.From = -1
		return e
	}
	e.Replacement = c.Replacement
	return e
}
