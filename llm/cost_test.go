package llm_test

import (
	"math"
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
)

func money(t *testing.T, s string) int64 {
	t.Helper()
	n, err := llm.ParseMoney(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPriceCost(t *testing.T) {
	cr, cw := money(t, "0.3"), money(t, "3.75")
	sonnet := llm.Price{Currency: "USD", Input: money(t, "3"), Output: money(t, "15"), CacheRead: &cr, CacheWrite: &cw}
	noCache := llm.Price{Currency: "USD", Input: money(t, "3"), Output: money(t, "15")}
	cheap := llm.Price{Currency: "USD", Input: money(t, "0.075"), Output: money(t, "0.3")}
	tests := []struct {
		name string
		p    llm.Price
		u    llm.Usage
		want string
	}{
		// 1200×3 + 350×15 + 8000×0.3 + 2000×3.75 = 3600 + 5250 + 2400 + 7500 per million.
		{"every class at its rate", sonnet, llm.Usage{InputTokens: 1200, OutputTokens: 350, CacheReadTokens: 8000, CacheWriteTokens: 2000}, "0.01875"},
		// Without cache rates, cache tokens cost the input rate: (1200+8000+2000)×3 + 350×15.
		{"cache at the input rate", noCache, llm.Usage{InputTokens: 1200, OutputTokens: 350, CacheReadTokens: 8000, CacheWriteTokens: 2000}, "0.03885"},
		// 7 × 0.075 / 1e6 = 0.000000525: exact in nanos, no float.
		{"below a micro-unit", cheap, llm.Usage{InputTokens: 7}, "0.000000525"},
		// 1 × 0.0000015 per million is 0.0000000000015: rounds to 0 nanos.
		{"rounds half up per class", llm.Price{Input: 1500}, llm.Usage{InputTokens: 1}, "0"},
		{"half a nano rounds up", llm.Price{Input: 500_000}, llm.Usage{InputTokens: 1}, "0.000000001"},
		{"nothing used", sonnet, llm.Usage{}, "0"},
		{"free model", llm.Price{}, llm.Usage{InputTokens: 1e9, OutputTokens: 1e9}, "0"},
		{"a billion tokens", sonnet, llm.Usage{OutputTokens: 1e9}, "15000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := llm.FormatMoney(tt.p.Cost(tt.u)); got != tt.want {
				t.Errorf("Cost = %s, want %s", got, tt.want)
			}
		})
	}
	huge := llm.Price{Input: math.MaxInt64, Output: math.MaxInt64}
	if got := huge.Cost(llm.Usage{InputTokens: math.MaxInt64, OutputTokens: math.MaxInt64}); got != math.MaxInt64 {
		t.Errorf("an overflowing cost = %d, want it saturated", got)
	}
}

// TestCostSums: a turn's cost is the sum of its calls' in nanos, with no
// drift over many calls; an unpriced call makes the sum partial, and only
// unpriced calls leave it unknown.
func TestCostSums(t *testing.T) {
	p := &llm.Price{Currency: "EUR", Input: money(t, "0.1")}
	var total llm.Usage
	for range 1000 {
		u := llm.Usage{InputTokens: 1}
		u.Cost = llm.CostOf(p, u)
		total = total.Add(u)
	}
	// 1000 × 0.1 / 1e6 = 0.0001 exactly (a float64 sum of 1e-7 drifts).
	if got := llm.FormatMoney(total.Cost.Nanos); got != "0.0001" || total.Cost.Currency != "EUR" || !total.Cost.Priced || total.Cost.Unpriced {
		t.Errorf("sum = %s %+v", got, total.Cost)
	}
	total = total.Add(llm.Usage{InputTokens: 5, Cost: llm.CostOf(nil, llm.Usage{InputTokens: 5})})
	if !total.Cost.Unpriced || !total.Cost.Priced || total.Cost.Nanos != 100_000 {
		t.Errorf("with an unpriced call: %+v", total.Cost)
	}
	if c := llm.CostOf(nil, llm.Usage{InputTokens: 1}); c.Priced || !c.Unpriced {
		t.Errorf("unpriced call: %+v", c)
	}
	if c := llm.CostOf(nil, llm.Usage{}); c != (llm.Cost{}) {
		t.Errorf("unpriced call that used nothing: %+v", c)
	}
}

func TestParseMoney(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		bad  bool
	}{
		{in: "3", want: 3e9}, {in: "0.075", want: 75e6}, {in: "15.", want: 15e9}, {in: ".5", want: 5e8},
		{in: "0.123456789", want: 123456789}, {in: "1.1000000000", want: 11e8}, {in: "0", want: 0},
		{in: "0.0000000001", bad: true}, {in: "-1", bad: true}, {in: "+1", bad: true}, {in: "1e-3", bad: true},
		{in: "", bad: true}, {in: ".", bad: true}, {in: "abc", bad: true}, {in: "1.2.3", bad: true},
		{in: "99999999999", bad: true},
	}
	for _, tt := range tests {
		got, err := llm.ParseMoney(tt.in)
		if (err != nil) != tt.bad || !tt.bad && got != tt.want {
			t.Errorf("ParseMoney(%q) = %d, %v; want %d, bad %v", tt.in, got, err, tt.want, tt.bad)
		}
	}
	var m llm.Money
	if err := m.UnmarshalText([]byte("2.50")); err != nil || m.String() != "2.5" {
		t.Errorf("Money 2.50 = %s, %v", m, err)
	}
}
