package client

import (
	"testing"

	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// TestAddUsageCost: the usage of a turn's attempts adds their costs
// exactly, nanos carried into units; tokens of unknown cost beside a
// known cost make the sum partial; with no known cost there is none.
func TestAddUsageCost(t *testing.T) {
	usd := func(units int64, nanos int32) *turnstilev1.Cost {
		return &turnstilev1.Cost{Currency: "USD", Units: units, Nanos: nanos}
	}
	priced := func(units int64, nanos int32) *turnstilev1.Usage {
		return &turnstilev1.Usage{InputTokens: 10, Cost: usd(units, nanos)}
	}
	unpriced := &turnstilev1.Usage{InputTokens: 10}
	tests := []struct {
		name string
		add  []*turnstilev1.Usage
		want *turnstilev1.Usage
	}{
		{"carried", []*turnstilev1.Usage{priced(0, 600_000_000), priced(1, 700_000_000)},
			&turnstilev1.Usage{InputTokens: 20, Cost: usd(2, 300_000_000)}},
		{"unpriced after priced", []*turnstilev1.Usage{priced(0, 5), unpriced},
			&turnstilev1.Usage{InputTokens: 20, Cost: usd(0, 5), CostPartial: true}},
		{"priced after unpriced", []*turnstilev1.Usage{unpriced, priced(0, 5)},
			&turnstilev1.Usage{InputTokens: 20, Cost: usd(0, 5), CostPartial: true}},
		{"partial attempt", []*turnstilev1.Usage{{InputTokens: 1, Cost: usd(0, 1), CostPartial: true}, priced(0, 1)},
			&turnstilev1.Usage{InputTokens: 11, Cost: usd(0, 2), CostPartial: true}},
		{"no price at all", []*turnstilev1.Usage{unpriced, unpriced, nil}, &turnstilev1.Usage{InputTokens: 20}},
		{"nothing used", []*turnstilev1.Usage{{}, priced(0, 3)}, &turnstilev1.Usage{InputTokens: 10, Cost: usd(0, 3)}},
	}
	for _, tt := range tests {
		got := &turnstilev1.Usage{}
		for _, u := range tt.add {
			addUsage(got, u)
		}
		if !proto.Equal(got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
