package client

import (
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// addUsage adds u to dst: tokens, and the cost (see the comment within).
func addUsage(dst, u *turnstilev1.Usage) {
	if u == nil {
		return
	}
	// Costs add up exactly; tokens of unknown cost beside a known cost
	// make the sum partial, and without any known cost there is none.
	unpricedBefore := dst.Cost == nil && usedTokens(dst)
	unpricedNow := u.GetCost() == nil && usedTokens(u)
	dst.InputTokens += u.GetInputTokens()
	dst.OutputTokens += u.GetOutputTokens()
	dst.CacheReadTokens += u.GetCacheReadTokens()
	dst.CacheWriteTokens += u.GetCacheWriteTokens()
	if c := u.GetCost(); c != nil {
		if dst.Cost == nil {
			dst.Cost = &turnstilev1.Cost{Currency: c.GetCurrency()}
		}
		nanos := int64(dst.Cost.GetNanos()) + int64(c.GetNanos())
		dst.Cost.Units += c.GetUnits() + nanos/1e9
		dst.Cost.Nanos = int32(nanos % 1e9)
		dst.CostPartial = dst.CostPartial || u.GetCostPartial() || unpricedBefore
	} else if unpricedNow && dst.Cost != nil {
		dst.CostPartial = true
	}
}

// usedTokens reports whether u counts any token.
func usedTokens(u *turnstilev1.Usage) bool {
	return u.GetInputTokens()|u.GetOutputTokens()|u.GetCacheReadTokens()|u.GetCacheWriteTokens() != 0
}

// addCounters adds c to dst, counter by counter.
func addCounters(dst, c *turnstilev1.TurnCounters) {
	if c == nil {
		return
	}
	dst.ModelCalls += c.GetModelCalls()
	dst.Retries += c.GetRetries()
	dst.Fallbacks += c.GetFallbacks()
	dst.ToolCalls += c.GetToolCalls()
	dst.ToolErrors += c.GetToolErrors()
	dst.Compactions += c.GetCompactions()
	dst.Hedges += c.GetHedges()
	dst.ApprovalsRequested += c.GetApprovalsRequested()
	dst.ApprovalsDenied += c.GetApprovalsDenied()
	dst.Steered += c.GetSteered()
}
