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
	if !ok {
		return nil
	}
	return c.runtimePrice(m.Price)
}

// DeploymentPrice returns the price of deployment d of the model alias in
// the runtime's form: its own when it has one, else nil, which takes the
// model's ([Config.ModelPrice]).
func (c *Config) DeploymentPrice(d Deployment) *llm.Price { return c.runtimePrice(d.Price) }

// runtimePrice converts mp to the runtime's form; nil when it is unset or
// incomplete (an incomplete price is reported at its own path).
func (c *Config) runtimePrice(mp *Price) *llm.Price {
	if mp == nil || mp.Input == nil || mp.Output == nil {
		return nil
	}
	p := &llm.Price{Currency: c.Pricing.Currency, Input: int64(*mp.Input), Output: int64(*mp.Output)}
	if r := mp.CacheRead; r != nil {
		v := int64(*r)
		p.CacheRead = &v
	}
	if w := mp.CacheWrite; w != nil {
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
	check := func(path string, p *Price) {
		if p == nil {
			return
		}
		priced = true
		if p.Input == nil {
			v.at(path+".input", "required: the price of a million input tokens (0 for free)")
		}
		if p.Output == nil {
			v.at(path+".output", "required: the price of a million output tokens (0 for free)")
		}
	}
	for _, alias := range sortedKeys(c.Models) {
		m := c.Models[alias]
		check("models."+alias+".price", m.Price)
		for i, d := range m.Deployments {
			check(fmt.Sprintf("models.%s.deployments[%d].price", alias, i), d.Price)
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
		if !m.priced() {
			out = append(out, alias)
		}
		todo = append(todo, m.Fallbacks...)
	}
	slices.Sort(out)
	return out
}

// priced reports whether every call of m has a price: the model's, or
// each of its deployments' own (an incomplete price is reported at its
// own path).
func (m Model) priced() bool {
	if m.Price != nil {
		return true
	}
	if len(m.Deployments) == 0 {
		return false
	}
	for _, d := range m.Deployments {
		if d.Price == nil {
			return false
		}
	}
	return true
}
