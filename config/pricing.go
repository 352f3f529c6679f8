package config

import (
	"fmt"
	"slices"

	"github.com/turnstile-dev/turnstile/llm"
)

// Pricing sets what the models' prices are counted in.
type Pricing struct {
	// Currency is the code of the currency every models.ALIAS.price and
	// every key's cost limit is in (e.g. USD); required when any is set.
	// It is put on the wire with each cost, not converted.
	Currency string `yaml:"currency"`
}

// Price is what a model's tokens cost, per million tokens, in
// pricing.currency: decimal numbers of at most nine decimal places, 0 or
// more. Input and output are required; a model without price has an
// unknown cost (no cost on the wire), never 0.
type Price struct {
	// Input is the price of a million prompt tokens at the full rate.
	Input *llm.Money `yaml:"input"`
	// Output is the price of a million generated tokens (reasoning
	// included).
	Output *llm.Money `yaml:"output"`
	// CacheRead is the price of a million prompt tokens read from the
	// provider's prompt cache; unset bills them at input's rate.
	CacheRead *llm.Money `yaml:"cache_read"`
	// CacheWrite is the price of a million prompt tokens written to the
	// provider's prompt cache; unset bills them at input's rate.
	CacheWrite *llm.Money `yaml:"cache_write"`
}

// ModelPrice returns the price of the model alias in the runtime's form,
// nil when it has none.
func (c *Config) ModelPrice(alias string) *llm.Price {
	m, ok := c.Models[alias]
	if !ok || m.Price == nil || m.Price.Input == nil || m.Price.Output == nil {
		return nil
	}
	p := &llm.Price{Currency: c.Pricing.Currency, Input: int64(*m.Price.Input), Output: int64(*m.Price.Output)}
	if r := m.Price.CacheRead; r != nil {
		v := int64(*r)
		p.CacheRead = &v
	}
	if w := m.Price.CacheWrite; w != nil {
		v := int64(*w)
		p.CacheWrite = &v
	}
	return p
}

// checkPricing checks the prices and the keys' budgets: a price needs its
// input and output rates and the currency, and a key with a budget may use
// only priced models (a model without a price would spend it unseen).
func (c *Config) checkPricing(v *checker) {
	priced := false
	for _, alias := range sortedKeys(c.Models) {
		p := c.Models[alias].Price
		if p == nil {
			continue
		}
		priced = true
		path := "models." + alias + ".price"
		if p.Input == nil {
			v.at(path+".input", "required: the price of a million input tokens (0 for free)")
		}
		if p.Output == nil {
			v.at(path+".output", "required: the price of a million output tokens (0 for free)")
		}
	}
	for i, k := range c.Auth.Keys {
		path := fmt.Sprintf("auth.keys[%d].limits", i)
		for _, b := range []struct {
			name string
			set  bool
		}{{"cost_per_day", k.Limits.CostPerDay != nil}, {"cost_per_month", k.Limits.CostPerMonth != nil}} {
			if !b.set {
				continue
			}
			priced = true
			if unpriced := c.unpricedFor(k.Models); len(unpriced) > 0 {
				v.at(path+"."+b.name, "the key may use models without a price (%v), whose cost its budget cannot count: give them a price, or limit the key's models", unpriced)
			}
		}
	}
	if priced && c.Pricing.Currency == "" {
		v.at("pricing.currency", "required when a model has a price or a key a cost limit: the currency's code, e.g. USD")
	}
}

// unpricedFor returns the models without a price a key allowed models
// (nil: every model) may reach, fallbacks included, sorted.
func (c *Config) unpricedFor(models []string) []string {
	todo := models
	if todo == nil {
		todo = sortedKeys(c.Models)
	}
	seen := map[string]bool{}
	var out []string
	for len(todo) > 0 {
		alias := todo[0]
		todo = todo[1:]
		m, ok := c.Models[alias]
		if seen[alias] || !ok {
			continue
		}
		seen[alias] = true
		if m.Price == nil { // an incomplete price is reported at its own path
			out = append(out, alias)
		}
		todo = append(todo, m.Fallbacks...)
	}
	slices.Sort(out)
	return out
}
