package config

import (
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/runtime"
)

func TestContextSettings(t *testing.T) {
	t.Run("accepted", func(t *testing.T) {
		c, err := Parse("config.yaml", []byte(`
providers:
  sim: {type: simulator}
models:
  a: {provider: sim, model: m, context_window: 1000, compaction: {}}
  b: {provider: sim, model: n, context_window: 1000, prompt_cache: off, compaction: {at: 0.5, strategy: summarize, model: a}}
  c: {provider: sim, model: o}
default_model: a
`))
		if err != nil {
			t.Fatal(err)
		}
		a, b, m := c.Models["a"], c.Models["b"], c.Models["c"]
		if a.PromptCache != runtime.PromptCacheAuto || a.Compaction == nil || a.Compaction.At != nil || a.Compaction.Strategy != "" {
			t.Errorf("a: %+v %+v", a.PromptCache, a.Compaction)
		}
		if b.PromptCache != runtime.PromptCacheOff || *b.Compaction.At != 0.5 || b.Compaction.Strategy != runtime.CompactSummarize || b.Compaction.Model != "a" {
			t.Errorf("b: %+v %+v", b.PromptCache, b.Compaction)
		}
		if m.Compaction != nil || m.PromptCache != runtime.PromptCacheAuto {
			t.Errorf("c: compaction %+v, prompt_cache %q: unset is no compaction before a call, and caching", m.Compaction, m.PromptCache)
		}
	})
	t.Run("mistakes", func(t *testing.T) {
		_, err := Parse("config.yaml", []byte(`
providers:
  sim: {type: simulator}
models:
  a: {provider: sim, model: m, context_window: 1000, prompt_cache: always, compaction: {at: 0}}
  b: {provider: sim, model: n, compaction: {at: 1.5, strategy: summarise}}
  c: {provider: sim, model: o, context_window: 10, compaction: {strategy: summarize, model: d}}
  d: {provider: sim, model: p, context_window: 10, compaction: {model: a}}
  e: {provider: sim, model: q, context_window: 10, compaction: {strategy: summarize}}
default_model: a
`))
		want := `config.yaml:5: models.a.compaction.at: 0 is not in (0, 1]: the share of context_window at which to compact
config.yaml:5: models.a.prompt_cache: "always" is not auto or off
config.yaml:6: models.b.compaction: needs context_window: compaction.at is a share of it
config.yaml:6: models.b.compaction.at: 1.5 is not in (0, 1]: the share of context_window at which to compact
config.yaml:6: models.b.compaction.strategy: "summarise" is not keep_ends or summarize
config.yaml:8: models.d.compaction.model: only strategy summarize calls a model
config.yaml:9: models.e.compaction.model: required with strategy summarize: the alias of the model that writes the summary`
		if err == nil || strings.TrimSpace(err.Error()) != want {
			t.Errorf("got\n%v\nwant\n%s", err, want)
		}
	})
}
