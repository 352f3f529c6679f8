package runtime

import (
	"fmt"

	"github.com/turnstile-dev/turnstile/llm"
)

// PromptCache says whether a model's calls ask the provider's prompt cache
// for the conversation's stable prefix.
type PromptCache string

// The values of [PromptCache].
const (
	// PromptCacheAuto marks the stable prefix where the provider needs
	// marks (Anthropic's cache_control breakpoints) and sends a prompt
	// cache key where the provider takes one (OpenAI). The default; the
	// empty value means it too.
	PromptCacheAuto PromptCache = "auto"
	// PromptCacheOff sends neither.
	PromptCacheOff PromptCache = "off"
)

// CompactStrategy names how a conversation is shortened before a call.
type CompactStrategy string

// The strategies of [CompactionConfig].
const (
	// CompactKeepEnds drops the middle of the conversation (see [KeepEnds]).
	// The default; the empty value means it too.
	CompactKeepEnds CompactStrategy = "keep_ends"
	// CompactSummarize replaces the middle [KeepEnds] would drop by a
	// summary that CompactionConfig.Model writes (see [Summarize]).
	CompactSummarize CompactStrategy = "summarize"
)

// DefaultCompactAt is the share of the context window at which a
// conversation is compacted before a call when CompactionConfig.At is
// unset.
const DefaultCompactAt = 0.8

// CompactionConfig compacts a model's conversation before a call, when
// its estimated size reaches At of the model's context window, rather than
// only after the provider refused it as too long.
type CompactionConfig struct {
	// At is the share of the model's context_window at which the
	// conversation is compacted before a call (default 0.8; in (0, 1]).
	At *float64 `yaml:"at"`
	// Strategy is keep_ends (default: drop the middle) or summarize (a
	// summary of the middle, written by model).
	Strategy CompactStrategy `yaml:"strategy"`
	// Model is the alias of the model that writes summaries; required
	// with strategy summarize, and only then.
	Model string `yaml:"model"`
}

// Problems lists what is wrong with c, at its yaml keys; none when c is
// valid. That model names a configured alias is the configuration's check.
func (c CompactionConfig) Problems() []llm.Problem {
	var out []llm.Problem
	if c.At != nil && !(*c.At > 0 && *c.At <= 1) {
		out = append(out, llm.Problem{Field: "at", Message: fmt.Sprintf("%v is not in (0, 1]: the share of context_window at which to compact", *c.At)})
	}
	switch c.Strategy {
	case "", CompactKeepEnds:
		if c.Model != "" {
			out = append(out, llm.Problem{Field: "model", Message: "only strategy summarize calls a model"})
		}
	case CompactSummarize:
		if c.Model == "" {
			out = append(out, llm.Problem{Field: "model", Message: "required with strategy summarize: the alias of the model that writes the summary"})
		}
	default:
		out = append(out, llm.Problem{Field: "strategy", Message: fmt.Sprintf("%q is not keep_ends or summarize", string(c.Strategy))})
	}
	return out
}

// at returns At with its default applied.
func (c *CompactionConfig) at() float64 {
	if c.At == nil {
		return DefaultCompactAt
	}
	return *c.At
}
