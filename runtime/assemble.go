package runtime

import (
	"strings"

	"github.com/turnstile-dev/turnstile/llm"
)

// assembler builds an assistant message from a model call's chunks, and
// turns the chunks into delta events.
type assembler struct {
	parts    []llm.Part
	text     *textBuf
	textAt   int
	thinking map[int]int // chunk index -> part index
	calls    map[int]int // chunk index -> part index
	args     map[int]*strings.Builder
	ended    map[int]bool
	streamed bool
	// seam is whitespace the reply already ends with (a continued reply
	// whose prefill lost it): the first text drops a leading copy of it.
	seam string
	// signer names the API that signs the model's thinking
	// ([llm.Capabilities].Signer), recorded on its thinking parts.
	signer string
	// newID makes the id of a tool call; taken reports an id the
	// conversation already holds.
	newID func() string
	taken func(id string) bool
}

// add records c and returns the event payload to emit for it, nil for
// none. A tool call whose id is missing, or is one the conversation or the
// reply already holds (Gemini 2.5 sends none; some servers send the same
// ids every step), gets a new one: ids are unique in a conversation.
func (b *assembler) add(c llm.Chunk) Payload {
	if b.seam != "" && c.Kind != llm.ChunkUsage && c.Kind != llm.ChunkStop {
		c.Text = b.trimSeam(c)
	}
	switch c.Kind {
	case llm.ChunkText:
		if c.Text == "" {
			return nil
		}
		if b.text == nil || b.textAt != len(b.parts)-1 {
			b.text = &textBuf{}
			b.parts = append(b.parts, llm.Part{Kind: llm.PartText})
			b.textAt = len(b.parts) - 1
		}
		b.text.write(c.Text)
		return &TextDelta{Text: c.Text}
	case llm.ChunkThinking:
		if b.thinking == nil {
			b.thinking = map[int]int{}
		}
		i, ok := b.thinking[c.Index]
		if !ok {
			b.parts = append(b.parts, llm.Part{Kind: llm.PartThinking})
			i = len(b.parts) - 1
			b.thinking[c.Index] = i
			b.closeText()
		}
		b.parts[i].Text += c.Text
		if c.Signature != "" {
			b.parts[i].Signature, b.parts[i].Signer = c.Signature, b.signer
		}
		return &ThinkingDelta{Text: c.Text, Signature: c.Signature}
	case llm.ChunkToolCallStart:
		if b.calls == nil {
			b.calls, b.args, b.ended = map[int]int{}, map[int]*strings.Builder{}, map[int]bool{}
		}
		id := c.CallID
		if id == "" || b.hasCall(id) || b.taken != nil && b.taken(id) {
			id = "call_" + b.newID()
		}
		b.closeText()
		b.parts = append(b.parts, llm.Part{Kind: llm.PartToolCall, ToolCall: &llm.ToolCall{ID: id, Name: c.Name}})
		b.calls[c.Index] = len(b.parts) - 1
		b.args[c.Index] = &strings.Builder{}
		return &ToolCallDelta{Index: c.Index, CallID: id, Name: c.Name}
	case llm.ChunkToolCallArgs:
		if _, ok := b.calls[c.Index]; !ok || c.Text == "" {
			return nil
		}
		b.args[c.Index].WriteString(c.Text)
		return &ToolCallDelta{Index: c.Index, ArgumentsDelta: c.Text}
	case llm.ChunkToolCallEnd:
		if _, ok := b.calls[c.Index]; ok {
			b.ended[c.Index] = true
		}
	}
	return nil
}

// hasCall reports whether the reply holds a tool call of id.
func (b *assembler) hasCall(id string) bool {
	for _, pi := range b.calls {
		if b.parts[pi].ToolCall.ID == id {
			return true
		}
	}
	return false
}

// trimSeam returns c's text without the part of it that repeats the seam,
// and consumes the seam: all of it once anything else arrives.
func (b *assembler) trimSeam(c llm.Chunk) string {
	if c.Kind != llm.ChunkText {
		b.seam = ""
		return c.Text
	}
	n := 0
	for n < len(c.Text) && n < len(b.seam) && c.Text[n] == b.seam[n] {
		n++
	}
	if n < len(c.Text) {
		b.seam = ""
	} else {
		b.seam = b.seam[n:]
	}
	return c.Text[n:]
}

// closeText ends the text part being written, so later text opens a new
// part after what comes between.
func (b *assembler) closeText() {
	if b.text != nil {
		b.parts[b.textAt].Text = b.text.String()
		b.text = nil
	}
}

// message returns the assembled message. A reply cut by the output limit
// loses the tool calls whose arguments were not complete.
func (b *assembler) message(stop llm.StopReason) llm.Message {
	return b.assemble(stop == llm.StopMaxTokens)
}

// interrupted returns the parts of a reply its turn stopped, as far as
// they got: the tool calls whose arguments were not complete are dropped.
func (b *assembler) interrupted() []llm.Part { return b.assemble(true).Parts }

// assemble returns the assembled message, without the tool calls whose
// arguments were not complete when dropIncomplete is set.
func (b *assembler) assemble(dropIncomplete bool) llm.Message {
	b.closeText()
	complete := make(map[int]bool, len(b.calls)) // part index -> arguments complete
	for ci, pi := range b.calls {
		if b.ended[ci] {
			complete[pi] = true
		}
	}
	argsOf := make(map[int]string, len(b.calls))
	for ci, pi := range b.calls {
		argsOf[pi] = b.args[ci].String()
	}
	m := llm.Message{Role: llm.RoleAssistant, Parts: make([]llm.Part, 0, len(b.parts))}
	for i, p := range b.parts {
		if p.Kind == llm.PartToolCall {
			if !complete[i] && dropIncomplete {
				continue
			}
			tc := *p.ToolCall
			tc.Arguments = argsOf[i]
			if tc.Arguments == "" {
				tc.Arguments = "{}"
			}
			p.ToolCall = &tc
		}
		m.Parts = append(m.Parts, p)
	}
	return m
}

// Bounds of the blocks a [textBuf] holds.
const (
	textBlockMin = 512
	textBlockMax = 64 << 10
)

// textBuf accumulates the text of a reply as the model streams it, in
// blocks each as large as the text before it (from textBlockMin up to
// textBlockMax), and joins them once, into a string of the text's own
// length. A strings.Builder grows by append's steps of a quarter once past
// a few hundred bytes, each a new copy: a 120 KB reply allocated some
// 600 KB on its way, and its string kept the last step's spare capacity
// for the turn's life. Here a reply allocates about twice its length: its
// blocks, and the string.
type textBuf struct {
	blocks [][]byte
	n      int // the bytes written
}

// write appends s.
func (t *textBuf) write(s string) {
	for len(s) > 0 {
		k := len(t.blocks)
		if k == 0 || len(t.blocks[k-1]) == cap(t.blocks[k-1]) {
			t.blocks = append(t.blocks, make([]byte, 0, min(max(t.n, textBlockMin), textBlockMax)))
			k++
		}
		last := &t.blocks[k-1]
		m := min(len(s), cap(*last)-len(*last))
		*last = append(*last, s[:m]...)
		s = s[m:]
		t.n += m
	}
}

// String returns the text written.
func (t *textBuf) String() string {
	var sb strings.Builder
	sb.Grow(t.n)
	for _, b := range t.blocks {
		sb.Write(b)
	}
	return sb.String()
}
