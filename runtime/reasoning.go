package runtime

import (
	"fmt"

	"github.com/turnstile-dev/turnstile/llm"
)

// ReasoningConfig is a model's default reasoning, asked for when a request
// asks for none: the configuration's models.ALIAS.reasoning.
type ReasoningConfig struct {
	// Effort is low, medium or high; empty leaves it to budget_tokens.
	Effort string `yaml:"effort"`
	// BudgetTokens is the most tokens the model may spend reasoning, from
	// 1024 to 1000000; 0 means the effort's budget (low 1024, medium 4096,
	// high 16384).
	BudgetTokens int `yaml:"budget_tokens"`
}

// Problems lists what is out of range in c.
func (c ReasoningConfig) Problems() []llm.Problem {
	var out []llm.Problem
	if _, ok := parseEffort(c.Effort); !ok {
		out = append(out, llm.Problem{Field: "effort", Message: fmt.Sprintf("%q is not low, medium or high", c.Effort)})
	}
	if n := c.BudgetTokens; n != 0 && (n < llm.MinBudgetTokens || n > llm.MaxBudgetTokens) {
		out = append(out, llm.Problem{Field: "budget_tokens", Message: fmt.Sprintf("must be from %d to %d (0 means the effort's budget)", llm.MinBudgetTokens, llm.MaxBudgetTokens)})
	}
	if c.Effort == "" && c.BudgetTokens == 0 {
		out = append(out, llm.Problem{Field: "effort", Message: "set effort or budget_tokens"})
	}
	return out
}

// Reasoning returns the reasoning c asks for; nil when c is nil.
func (c *ReasoningConfig) Reasoning() *llm.Reasoning {
	if c == nil {
		return nil
	}
	e, _ := parseEffort(c.Effort)
	return &llm.Reasoning{Effort: e, BudgetTokens: c.BudgetTokens}
}

func parseEffort(s string) (llm.Effort, bool) {
	for _, e := range []llm.Effort{llm.EffortUnspecified, llm.EffortLow, llm.EffortMedium, llm.EffortHigh} {
		if e.String() == s {
			return e, true
		}
	}
	return llm.EffortUnspecified, false
}
