package runtime

import (
	"cmp"

	"github.com/turnstile-dev/turnstile/llm"
)

// CallBound is what one model call may use at most, as known before it is
// made: what a client key's limits hold for it until it has reported what
// it used ([TurnRequest].Budget). Its prompt is an estimate; its output is
// bounded only when the request or the model sets an output limit.
type CallBound struct {
	// InputTokens, CacheReadTokens and CacheWriteTokens estimate the
	// call's prompt as compaction does (see [modelCalls.estimateTokens]): the
	// size the provider last reported in the turn, split as it reported
	// it, plus a quarter of the bytes of the messages since (input), or a
	// quarter of the bytes of the system prompt, the tool definitions and
	// the conversation before any report (input).
	InputTokens, CacheReadTokens, CacheWriteTokens int64
	// MaxOutputTokens is the output limit of the call: the request's
	// max_output_tokens, else the model's; 0 when neither sets one (the
	// provider's default applies, which the runtime does not know).
	MaxOutputTokens int64
	// Price is what the call's tokens cost; nil when unknown.
	Price *llm.Price
}

// PromptTokens returns the tokens of the call's prompt, all three kinds.
func (b CallBound) PromptTokens() int64 {
	return b.InputTokens + b.CacheReadTokens + b.CacheWriteTokens
}

// Cost returns what the call costs at b.Price when it reads its prompt
// and writes output tokens: unpriced when the price is unknown.
func (b CallBound) Cost(output int64) llm.Cost {
	return llm.CostOf(b.Price, llm.Usage{InputTokens: b.InputTokens, CacheReadTokens: b.CacheReadTokens, CacheWriteTokens: b.CacheWriteTokens, OutputTokens: output})
}

// bound returns the bound of the turn's next call, to m.
func (t *turn) bound(m *Model) CallBound {
	b := CallBound{
		InputTokens:     int64(t.calls.estimateTokens(m)),
		MaxOutputTokens: int64(cmp.Or(max(t.req.MaxOutputTokens, 0), m.MaxOutputTokens)),
		Price:           m.Price,
	}
	if s := t.calls.seen; s.tokens > 0 && b.InputTokens >= int64(s.tokens) {
		// Built on the size last reported: its cached part as reported.
		b.CacheReadTokens, b.CacheWriteTokens = int64(s.read), int64(s.write)
		b.InputTokens -= b.CacheReadTokens + b.CacheWriteTokens
	}
	return b
}

// FirstCall returns the bound of the first model call of req, a request
// [Runner.Validate] accepted, before its turn starts: its prompt estimated
// from its bytes (no provider has reported its size yet), the output limit
// of the request or of its model, and the highest input and output prices
// among the model's deployments (the call goes to one of them), nil when
// one of them has no price.
func (r *Runner) FirstCall(req *TurnRequest) CallBound {
	m := r.models[cmp.Or(req.Model, r.defaultModel)]
	if m == nil {
		return CallBound{}
	}
	t := &turn{r: r, req: req}
	t.tools.t = t
	b := CallBound{
		InputTokens:     int64(promptSeen{}.estimate(req.System, req.Messages, t.tools.toolSpecs(m))),
		MaxOutputTokens: int64(cmp.Or(max(req.MaxOutputTokens, 0), m.MaxOutputTokens)),
	}
	deps := []*Model{m}
	if rt := r.routers[m.Alias]; rt != nil && len(rt.deps) > 0 {
		deps = rt.deps
	}
	for _, d := range deps {
		if d.Price == nil {
			return CallBound{InputTokens: b.InputTokens, MaxOutputTokens: b.MaxOutputTokens}
		}
		if b.Price == nil {
			p := *d.Price
			b.Price = &llm.Price{Currency: p.Currency, Input: p.Input, Output: p.Output}
			continue
		}
		b.Price.Input, b.Price.Output = max(b.Price.Input, d.Price.Input), max(b.Price.Output, d.Price.Output)
	}
	return b
}
