package config

import "github.com/turnstile-dev/turnstile/runtime"

// checkContext checks a model's prompt_cache and compaction at path.
func (c *Config) checkContext(v *checker, path string, m Model, aliases []string) {
	if p := m.PromptCache; p != runtime.PromptCacheAuto && p != runtime.PromptCacheOff {
		v.at(path+".prompt_cache", "%q is not auto or off", string(p))
	}
	cc := m.Compaction
	if cc == nil {
		return
	}
	v.settings(path+".compaction", cc.Problems(), false)
	if m.ContextWindow == 0 {
		v.at(path+".compaction", "needs context_window: compaction.at is a share of it")
	}
	if cc.Model == "" {
		return
	}
	if _, ok := c.Models[cc.Model]; !ok {
		v.at(path+".compaction.model", "%q is not a configured model%s", cc.Model, didYouMean(cc.Model, aliases))
	}
}
