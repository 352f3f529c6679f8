package config

import (
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
)

// TestPricing: a price block reads exact decimal amounts into nanos,
// cache rates left out are nil (billed at input), and every problem of
// prices and budgets is reported at once with its path.
func TestPricing(t *testing.T) {
	c, err := Parse("config.yaml", []byte(`
providers: {sim: {type: simulator}}
pricing: {currency: USD}
models:
  big: {provider: sim, model: m, price: {input: 3, output: 15, cache_read: 0.3, cache_write: 3.75}, fallbacks: [small]}
  small: {provider: sim, model: m2, price: {input: 0.075, output: "0.3"}}
  unpriced: {provider: sim, model: m3}
default_model: big
auth:
  keys:
    - {name: team, token_sha256: "`+strings.Repeat("ab", 32)+`", models: [big], limits: {cost_per_day: 25, cost_per_month: "500.50"}}
`))
	if err != nil {
		t.Fatal(err)
	}
	big, small := c.ModelPrice("big"), c.ModelPrice("small")
	if big.Currency != "USD" || big.Input != 3e9 || big.Output != 15e9 || *big.CacheRead != 3e8 || *big.CacheWrite != 375e7 {
		t.Errorf("big's price %+v", big)
	}
	if small.Input != 75e6 || small.Output != 3e8 || small.CacheRead != nil || small.CacheWrite != nil {
		t.Errorf("small's price %+v", small)
	}
	if c.ModelPrice("unpriced") != nil {
		t.Error("a model without a price has one")
	}
	if l := c.Auth.Keys[0].Limits; *l.CostPerDay != llm.Money(25e9) || *l.CostPerMonth != llm.Money(5005e8) {
		t.Errorf("budgets %v %v", *l.CostPerDay, *l.CostPerMonth)
	}

	_, err = Parse("config.yaml", []byte(`
providers: {sim: {type: simulator}}
models:
  a: {provider: sim, model: m, price: {input: 1}, fallbacks: [b]}
  b: {provider: sim, model: m}
  c: {provider: sim, model: m, price: {output: -1}}
default_model: a
auth:
  keys:
    - {name: team, token_sha256: "`+strings.Repeat("ab", 32)+`", models: [a], limits: {cost_per_day: 1}}
    - {name: all, token_sha256: "`+strings.Repeat("cd", 32)+`", limits: {cost_per_month: 1}}
`))
	for _, want := range []string{
		`config.yaml:4: models.a.price.output: required: the price of a million output tokens (0 for free)`,
		`config.yaml:6: models.c.price.output: "-1" is not a non-negative decimal number`,
		`config.yaml:10: auth.keys[0].limits.cost_per_day: the key may use models without a price ([b]), whose cost its budget cannot count`,
		`config.yaml:11: auth.keys[1].limits.cost_per_month: the key may use models without a price ([b])`,
		`config.yaml: pricing.currency: required when a model has a price or a key a cost limit`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse error = %v\nwant it to contain %q", err, want)
		}
	}
}

// TestDeploymentPricing: a deployment's own price is checked at its path
// and given to the runtime, one without takes the model's, and a model
// whose every deployment has a price counts as priced for a budget.
func TestDeploymentPricing(t *testing.T) {
	c, err := Parse("config.yaml", []byte(`
providers: {east: {type: simulator}, west: {type: simulator}}
pricing: {currency: USD}
models:
  chat:
    deployments:
      - {name: e, provider: east, model: m, price: {input: 1, output: 4}}
      - {name: w, provider: west, model: m, price: {input: 2, output: 8}}
auth:
  keys:
    - {name: team, token_sha256: "`+strings.Repeat("ab", 32)+`", limits: {cost_per_day: 5}}
`))
	if err != nil {
		t.Fatal(err)
	}
	routes := c.Models["chat"].Routes()
	if e, w := c.DeploymentPrice(routes[0]), c.DeploymentPrice(routes[1]); e == nil || w == nil || e.Input != 1e9 || w.Output != 8e9 || w.Currency != "USD" {
		t.Errorf("deployment prices %+v %+v", e, w)
	}
	if c.ModelPrice("chat") != nil {
		t.Error("a model without its own price has one")
	}

	_, err = Parse("config.yaml", []byte(`
providers: {east: {type: simulator}, west: {type: simulator}}
pricing: {currency: USD}
models:
  chat:
    deployments:
      - {name: e, provider: east, model: m, price: {input: 1}}
      - {name: w, provider: west, model: m}
auth:
  keys:
    - {name: team, token_sha256: "`+strings.Repeat("ab", 32)+`", limits: {cost_per_day: 5}}
`))
	for _, want := range []string{
		`config.yaml:7: models.chat.deployments[0].price.output: required: the price of a million output tokens (0 for free)`,
		`config.yaml:11: auth.keys[0].limits.cost_per_day: the key may use models without a price ([chat])`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse error = %v\nwant it to contain %q", err, want)
		}
	}
}
