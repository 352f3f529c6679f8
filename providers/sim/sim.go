package sim

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// DefaultTokenDelay paces the output when Config.TokenDelay is zero.
const DefaultTokenDelay = 15 * time.Millisecond

// maxCounters bounds the call counters kept for times=K, so a long-running
// server does not grow without bound; the oldest counters go first.
const maxCounters = 4096

// maxContinuations bounds how far back a continuation is looked for.
const maxContinuations = 16

// Config configures a [Provider]. The zero value is usable: default pacing
// and no script.
type Config struct {
	// TokenDelay is the pause before each streamed token. Zero means
	// [DefaultTokenDelay]; a negative value means no pause at all.
	TokenDelay time.Duration
	// Script lists directives applied to every call, before the prompt's
	// own. Each entry holds one or more bracketed directives, or the inside
	// of one directive without its brackets ("fail=overloaded times=1").
	Script []string
}

// Provider is the embedded deterministic model. Create one with [New]. It is
// safe for concurrent use; its only state is the call counters of times=K
// directives (the most recent 4096 are kept) and a request id counter.
type Provider struct {
	name       string
	tokenDelay time.Duration
	script     []directive

	calls atomic.Uint64 // numbers request ids

	mu     sync.Mutex
	counts map[string]int
	order  []string // keys of counts, oldest first
}

var _ llm.Provider = (*Provider)(nil)

// New returns a simulator named name, the provider name its errors report
// ("sim" when empty). It fails when a script directive is malformed; the
// error names the directive and wraps [ErrInvalidDirective].
func New(name string, cfg Config) (*Provider, error) {
	if name == "" {
		name = "sim"
	}
	p := &Provider{name: name, tokenDelay: cfg.TokenDelay}
	if p.tokenDelay == 0 {
		p.tokenDelay = DefaultTokenDelay
	}
	for i, entry := range cfg.Script {
		ds, err := parseScript(entry)
		if err != nil {
			return nil, fmt.Errorf("sim: script[%d]: %w", i, err)
		}
		p.script = append(p.script, ds...)
	}
	return p, nil
}

// Capabilities reports that the simulator, like Claude before 4.6,
// continues a conversation that ends with assistant text from where that
// text ends (prefill), and takes an output schema beside tools; it signs
// no thinking and takes every option as asked.
func (p *Provider) Capabilities(string) llm.Capabilities {
	return llm.Capabilities{Prefill: true, SchemaWithTools: true}
}

// Inputs reports that the simulator takes every kind of input: it
// describes the media it gets (type, size, name) in its answer.
func (p *Provider) Inputs(string) []llm.Modality { return llm.Modalities }

// FetchesURI reports true: the simulator takes media by URI of every kind,
// and fetches nothing.
func (p *Provider) FetchesURI(llm.Modality) bool { return true }

// Stream answers req as described in the package documentation. Nothing
// happens until the sequence is ranged over; each range is one model call.
// When ctx is done the sequence ends at once without yielding anything more.
func (p *Provider) Stream(ctx context.Context, req *llm.Request) iter.Seq2[llm.Chunk, error] {
	return func(yield func(llm.Chunk, error) bool) {
		if ctx.Err() != nil {
			return
		}
		pl, err := p.prepare(req)
		if err != nil {
			yield(llm.Chunk{}, err)
			return
		}
		p.run(ctx, pl, yield)
	}
}

// plan is one call worked out in advance: what to stream and how it ends.
type plan struct {
	delay time.Duration // before the first chunk
	// segments are the reply's content, in order. Text is kept whole and
	// cut into tokens as it streams, so a long reply costs its text, not
	// a chunk per word.
	segments  []segment
	stop      llm.StopReason
	input     int        // input tokens
	fail      *directive // the failure injected, nil when none
	model     string
	size      int // request text bytes
	requestID string
}

// segment is a run of text or reasoning streamed a token at a time, or
// one chunk as it is.
type segment struct {
	// words, when not empty, is streamed token by token as chunks of kind.
	words string
	kind  llm.ChunkKind
	// chunk is the segment when words is empty.
	chunk llm.Chunk
}

// chunks calls yield with each chunk of the segment, until it returns
// false; it reports whether yield always returned true.
func (s segment) chunks(yield func(llm.Chunk) bool) bool {
	if s.words == "" {
		return yield(s.chunk)
	}
	for tok, rest := nextToken(s.words); tok != ""; tok, rest = nextToken(rest) {
		if !yield(llm.Chunk{Kind: s.kind, Text: tok}) {
			return false
		}
	}
	return true
}

func one(c llm.Chunk) segment { return segment{chunk: c} }

// view is what a call answers: the user message that asks and the
// directives that apply.
type view struct {
	user     int    // index of the asking user message, -1 when none
	question string // its text without directives
	ds       []directive
}

// outcome is the reply a conversation calls for, before pacing and limits.
type outcome struct {
	text      string
	refusal   bool
	calls     []llm.ToolCall
	maxTokens int // from a max_tokens directive, 0 when none
	// directed reports that text is a reply directive's.
	directed bool
}

// prepare works out the call req: the failure to inject, if any, and the
// chunks of the reply. It fails when the request is malformed.
func (p *Provider) prepare(req *llm.Request) (*plan, *llm.Error) {
	if req == nil {
		return nil, invalidRequest(p.name, errors.New("sim: nil request"))
	}
	if err := checkToolPairs(req.Messages); err != nil {
		return nil, invalidRequest(p.name, err)
	}
	size := textSize(req)
	rest, v, base, cont := p.continuation(req.Model, req.Messages)
	if !cont {
		var err error
		if v, err = p.view(req.Model, req.Messages); err != nil {
			return nil, invalidRequest(p.name, err)
		}
		base = len(req.Messages)
	}
	// A call continuing a cut reply counts as a call of the request it
	// continues.
	fp := fingerprint(req.System, req.Messages[:base])
	pl := &plan{
		input:     tokensOf(size),
		model:     req.Model,
		size:      size,
		requestID: fmt.Sprintf("req_sim_%s_%d", fp[:12], p.calls.Add(1)),
	}
	pl.fail, pl.delay = p.pickFailure(v.ds, req.Model+"\x00"+req.TurnID+"\x00"+fp, size)
	pl.segments = reasoning(v)

	o := outcome{text: rest}
	if !cont {
		o = compose(v, req.Messages)
		if s := req.OutputSchema; s != nil && !o.directed && !o.refusal && len(o.calls) == 0 {
			if text := schemaReply(s.Schema, "sim"); text != "" {
				o.text = text
			}
		}
	}
	switch {
	case o.refusal:
		pl.segments = append(pl.segments, segment{words: o.text, kind: llm.ChunkText})
		pl.stop = llm.StopRefusal
	case len(o.calls) > 0:
		for i, c := range o.calls {
			pl.segments = append(pl.segments, one(llm.Chunk{Kind: llm.ChunkToolCallStart, Index: i, CallID: c.ID, Name: c.Name}))
			for _, f := range fragments(c.Arguments) {
				pl.segments = append(pl.segments, one(llm.Chunk{Kind: llm.ChunkToolCallArgs, Index: i, Text: f}))
			}
			pl.segments = append(pl.segments, one(llm.Chunk{Kind: llm.ChunkToolCallEnd, Index: i}))
		}
		pl.stop = llm.StopToolUse
	default:
		limit := req.MaxOutputTokens
		if o.maxTokens > 0 && (limit <= 0 || o.maxTokens < limit) {
			limit = o.maxTokens
		}
		var text string
		text, pl.stop = cut(o.text, limit, req.StopSequences)
		pl.segments = append(pl.segments, segment{words: text, kind: llm.ChunkText})
	}
	return pl, nil
}

// pickFailure returns the first fail directive of ds whose conditions hold
// for a call under key (model id and conversation) of size text bytes, and
// the delay before the call's first chunk. It counts the call against each
// times=K directive it reaches.
func (p *Provider) pickFailure(ds []directive, key string, size int) (*directive, time.Duration) {
	var (
		fail  *directive
		delay time.Duration
	)
	for i := range ds {
		d := &ds[i]
		switch {
		case d.action != actFail:
			delay = max(delay, d.delay)
		case fail != nil, d.above > 0 && size <= d.above:
			// Not reached, or the request is small enough.
		case d.times > 0 && p.count(key+"\x00"+strconv.Itoa(i)) > d.times:
			// Spent on earlier calls.
		default:
			fail = d
			delay = max(delay, d.delay)
		}
	}
	return fail, delay
}

// reasoning returns the segments of v's think directive, if any: the
// reasoning token by token, then the block's signature.
func reasoning(v view) []segment {
	i := slices.IndexFunc(v.ds, func(d directive) bool { return d.action == actThink })
	if i < 0 {
		return nil
	}
	text := v.ds[i].text
	if !v.ds[i].hasText {
		text = thinkingText(v.question)
	}
	return []segment{{words: text, kind: llm.ChunkThinking}, one(llm.Chunk{Kind: llm.ChunkThinking, Signature: signature(text)})}
}

// run streams pl, pacing each token, and ends with usage and the stop, or
// with the injected failure.
func (p *Provider) run(ctx context.Context, pl *plan, yield func(llm.Chunk, error) bool) {
	var pc pacer
	defer pc.stop()
	send := func(c llm.Chunk) bool { return ctx.Err() == nil && yield(c, nil) }
	streamed := 0
	fail := func() {
		e := failureError(pl.fail, p.name, pl.model, pl.size, streamed, pl.requestID)
		if e == nil { // a stall: hang until the caller gives up
			<-ctx.Done()
			return
		}
		if ctx.Err() == nil {
			yield(llm.Chunk{}, e)
		}
	}
	if !pc.wait(ctx, pl.delay) {
		return
	}
	failed := false
	for _, seg := range pl.segments {
		ok := seg.chunks(func(c llm.Chunk) bool {
			if paced(c) {
				if pl.fail != nil && streamed == pl.fail.after {
					fail()
					failed = true
					return false
				}
				if !pc.wait(ctx, p.tokenDelay) {
					return false
				}
				streamed++
			}
			return send(c)
		})
		if !ok || failed {
			return
		}
	}
	if pl.fail != nil {
		fail()
		return
	}
	usage := llm.Usage{InputTokens: int64(pl.input), OutputTokens: int64(streamed)}
	if send(llm.Chunk{Kind: llm.ChunkUsage, Usage: usage}) {
		send(llm.Chunk{Kind: llm.ChunkStop, Stop: pl.stop, Model: pl.model})
	}
}

// paced reports whether c is a token of output, streamed after a delay and
// counted in the usage.
func paced(c llm.Chunk) bool {
	switch c.Kind {
	case llm.ChunkText, llm.ChunkToolCallArgs:
		return true
	case llm.ChunkThinking:
		return c.Text != ""
	}
	return false
}

// pacer waits between tokens on one reusable timer.
type pacer struct{ t *time.Timer }

// wait pauses for d, and reports false when ctx is done first (or already).
func (pc *pacer) wait(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	if pc.t == nil {
		pc.t = time.NewTimer(d)
	} else {
		pc.t.Reset(d)
	}
	select {
	case <-ctx.Done():
		return false
	case <-pc.t.C:
		return ctx.Err() == nil
	}
}

func (pc *pacer) stop() {
	if pc.t != nil {
		pc.t.Stop()
	}
}

// count increments and returns the number of calls seen under key.
func (p *Provider) count(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.counts == nil {
		p.counts = map[string]int{}
	}
	if _, ok := p.counts[key]; !ok {
		if len(p.order) >= maxCounters {
			delete(p.counts, p.order[0])
			p.order = p.order[1:]
		}
		p.order = append(p.order, key)
	}
	p.counts[key]++
	return p.counts[key]
}

// view finds the last user message with text in msgs and the directives
// that apply to model: the script's, then the message's.
func (p *Provider) view(model string, msgs []llm.Message) (view, error) {
	v := view{user: -1}
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == llm.RoleUser && hasText(msgs[i]) {
			v.user = i
			break
		}
	}
	var prompt []directive
	if v.user >= 0 {
		var err error
		if prompt, v.question, err = parseText(msgs[v.user].Text()); err != nil {
			return v, err
		}
	}
	for _, d := range slices.Concat(p.script, prompt) {
		if d.appliesTo(model) {
			v.ds = append(v.ds, d)
		}
	}
	return v, nil
}

// compose works out the reply to msgs under v: a refusal, the tool calls of
// the current step, or text (the reply directive's, an answer from the tool
// results, or the default answer).
func compose(v view, msgs []llm.Message) outcome {
	var o outcome
	var reply *directive
	for i := range v.ds {
		d := &v.ds[i]
		switch {
		case d.action == actRefuse:
			o.refusal = true
			o.text = defaultRefusal
			if d.hasText {
				o.text = d.text
			}
			return o
		case d.action == actMaxTokens && o.maxTokens == 0:
			o.maxTokens = d.maxTokens
		case d.action == actReply && reply == nil:
			reply = d
		}
	}

	steps := 0
	var results []llm.ToolResult
	for _, m := range msgs[v.user+1:] {
		if m.Role == llm.RoleAssistant && len(m.ToolCalls()) > 0 {
			steps++
		}
		for _, part := range m.Parts {
			if part.Kind == llm.PartToolResult && part.ToolResult != nil {
				results = append(results, *part.ToolResult)
			}
		}
	}
	for _, d := range v.ds {
		if d.action == actTool && max(d.step, 1) == steps+1 {
			args := d.args
			if args == "" {
				args = "{}"
			}
			o.calls = append(o.calls, llm.ToolCall{Name: d.tool, Arguments: args})
		}
	}
	if len(o.calls) > 0 {
		n := 0
		for _, m := range msgs {
			n += len(m.ToolCalls())
		}
		for i := range o.calls {
			o.calls[i].ID = "call_" + strconv.Itoa(n+i+1)
		}
		return o
	}

	switch {
	case reply != nil:
		o.text, o.directed = reply.text, true
	case steps > 0 || len(results) > 0:
		o.text = toolAnswer(v.question, results)
	default:
		o.text = defaultAnswer(v.question)
		if v.user >= 0 {
			o.text += describeMedia(userMedia(msgs[v.user]))
		}
	}
	return o
}

// userMedia returns the media parts of m.
func userMedia(m llm.Message) []llm.Media {
	var out []llm.Media
	for _, p := range m.Parts {
		if p.Kind == llm.PartMedia && p.Media != nil {
			out = append(out, *p.Media)
		}
	}
	return out
}

// continuation recognises a reply cut short being continued: msgs ends with
// one or more assistant messages of plain text, each followed by a user
// prompt without directives (or, for the last one, by nothing), and their
// text is a strict prefix of the reply the earlier conversation calls for.
// It returns the rest of that reply, the view it was answered under, and
// the length of the earlier conversation.
func (p *Provider) continuation(model string, msgs []llm.Message) (string, view, int, bool) {
	j := len(msgs) - 1
	if j < 0 {
		return "", view{}, 0, false
	}
	if msgs[j].Role == llm.RoleUser {
		if !isPrompt(msgs[j]) {
			return "", view{}, 0, false
		}
		j--
	}
	var partial []string
	for range maxContinuations {
		if j < 1 || msgs[j].Role != llm.RoleAssistant || !plainText(msgs[j]) || msgs[j].Text() == "" {
			return "", view{}, 0, false
		}
		partial = append([]string{msgs[j].Text()}, partial...)
		j--
		base := msgs[:j+1]
		if v, err := p.view(model, base); err == nil && v.user >= 0 {
			o := compose(v, base)
			if !o.refusal && len(o.calls) == 0 {
				if i, ok := resumeAt(o.text, strings.Join(partial, "")); ok {
					return o.text[i:], v, len(base), true
				}
			}
		}
		// msgs[j] may itself be an earlier continuation prompt.
		if msgs[j].Role != llm.RoleUser || !isPrompt(msgs[j]) {
			return "", view{}, 0, false
		}
		j--
	}
	return "", view{}, 0, false
}

// isPrompt reports whether m is plain text holding no directive, as the
// runtime's continuation prompt is.
func isPrompt(m llm.Message) bool {
	if !plainText(m) {
		return false
	}
	ds, _, err := parseText(m.Text())
	return err == nil && len(ds) == 0
}

// plainText reports whether m has no tool calls or results.
func plainText(m llm.Message) bool {
	for _, part := range m.Parts {
		if part.Kind != llm.PartText && part.Kind != llm.PartThinking {
			return false
		}
	}
	return true
}

// hasText reports whether m holds text or media: what a question is.
func hasText(m llm.Message) bool {
	return slices.ContainsFunc(m.Parts, func(p llm.Part) bool { return p.Kind == llm.PartText || p.Kind == llm.PartMedia })
}

// cut returns the part of text a call streams under an output limit in
// tokens (0: none) and stop sequences, and says why the reply ends.
func cut(text string, limit int, stops []string) (string, llm.StopReason) {
	end, stop := len(text), llm.StopEndTurn
	for _, s := range stops {
		if i := strings.Index(text, s); s != "" && i >= 0 && i < end {
			end, stop = i, llm.StopSequence
		}
	}
	text = text[:end]
	if limit <= 0 {
		return text, stop
	}
	for n, rest := 0, text; rest != ""; n++ {
		if n == limit {
			return text[:len(text)-len(rest)], llm.StopMaxTokens
		}
		_, rest = nextToken(rest)
	}
	return text, stop
}

// checkToolPairs rejects a conversation whose tool calls and results do not
// match one to one, as providers do.
func checkToolPairs(msgs []llm.Message) error {
	calls := map[string]bool{} // id -> answered
	for i, m := range msgs {
		for _, part := range m.Parts {
			switch {
			case part.Kind == llm.PartToolCall && part.ToolCall != nil:
				if _, dup := calls[part.ToolCall.ID]; dup {
					return fmt.Errorf("messages.%d: tool call id %q is used twice", i, part.ToolCall.ID)
				}
				calls[part.ToolCall.ID] = false
			case part.Kind == llm.PartToolResult && part.ToolResult != nil:
				answered, ok := calls[part.ToolResult.CallID]
				if !ok {
					return fmt.Errorf("messages.%d: tool result for unknown tool call id %q", i, part.ToolResult.CallID)
				}
				if answered {
					return fmt.Errorf("messages.%d: tool call id %q has two results", i, part.ToolResult.CallID)
				}
				calls[part.ToolResult.CallID] = true
			}
		}
	}
	for i, m := range msgs {
		for _, c := range m.ToolCalls() {
			if !calls[c.ID] {
				return fmt.Errorf("messages.%d: tool call %q (%s) has no tool result", i, c.ID, c.Name)
			}
		}
	}
	return nil
}

// textSize measures the request's text in bytes: the system prompt and every
// part's text, signature, tool call name and arguments and tool result, the
// measure the runtime's compaction reports, plus the system prompt.
func textSize(req *llm.Request) int {
	n := len(req.System)
	for _, m := range req.Messages {
		for _, part := range m.Parts {
			n += len(part.Text) + len(part.Signature)
			if c := part.ToolCall; c != nil {
				n += len(c.Name) + len(c.Arguments)
			}
			if r := part.ToolResult; r != nil {
				n += len(r.Content)
			}
		}
	}
	return n
}

// fingerprint identifies a conversation: its system prompt and messages.
func fingerprint(system string, msgs []llm.Message) string {
	h := sha256.New()
	var buf [8]byte
	field := func(s string) {
		binary.BigEndian.PutUint64(buf[:], uint64(len(s)))
		h.Write(buf[:])
		h.Write([]byte(s))
	}
	field(system)
	for _, m := range msgs {
		field("m" + m.Role.String())
		for _, part := range m.Parts {
			field(strconv.Itoa(int(part.Kind)))
			field(part.Text)
			field(part.Signature)
			if c := part.ToolCall; c != nil {
				field(c.ID)
				field(c.Name)
				field(c.Arguments)
			}
			if r := part.ToolResult; r != nil {
				field(r.CallID)
				field(r.Name)
				field(r.Content)
				field(strconv.FormatBool(r.IsError))
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}
