package llm

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// NanosPerUnit is the number of nanos in one unit of a currency: money is
// counted in billionths of the currency (nanos) as int64, never as a float,
// so sums do not drift. An int64 of nanos holds up to about 9.2 billion
// units.
const NanosPerUnit = 1_000_000_000

// Price is what a model's tokens cost, per million tokens, in nanos of the
// configured currency. Input and Output are always set; a nil cache rate
// means the provider's cache tokens are billed at the input rate (the
// conservative reading: no discount is assumed that was not configured).
type Price struct {
	// Currency is the currency's code (pricing.currency, e.g. "USD").
	Currency string
	// Input is the price of a million prompt tokens billed at the full rate.
	Input int64
	// Output is the price of a million generated tokens, reasoning included.
	Output int64
	// CacheRead is the price of a million prompt tokens read from the
	// provider's prompt cache; nil: Input.
	CacheRead *int64
	// CacheWrite is the price of a million prompt tokens written to the
	// provider's prompt cache; nil: Input.
	CacheWrite *int64
}

// Cost returns what u's tokens cost at p, in nanos, rounded half up per
// class of token. It saturates at math.MaxInt64 instead of overflowing.
func (p Price) Cost(u Usage) int64 {
	cr, cw := p.Input, p.Input
	if p.CacheRead != nil {
		cr = *p.CacheRead
	}
	if p.CacheWrite != nil {
		cw = *p.CacheWrite
	}
	var total int64
	for _, c := range [...]struct{ tokens, rate int64 }{
		{u.InputTokens, p.Input}, {u.OutputTokens, p.Output}, {u.CacheReadTokens, cr}, {u.CacheWriteTokens, cw},
	} {
		total = addSat(total, perMillion(c.tokens, c.rate))
	}
	return total
}

// perMillion returns tokens×rate/1e6 rounded half up, exact for any
// non-negative inputs (a 128-bit product), saturated at math.MaxInt64.
func perMillion(tokens, rate int64) int64 {
	if tokens <= 0 || rate <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(tokens), uint64(rate))
	lo, carry := bits.Add64(lo, 500_000, 0)
	hi += carry
	if hi >= 1_000_000 {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, 1_000_000)
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

func addSat(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}

// Cost is what a model call or, summed, a turn cost. Priced says at least
// one call was of a model with a price, whose tokens Nanos counts;
// Unpriced says at least one call that used tokens was of a model without
// a price, whose cost is unknown and not in Nanos. A Cost that is not
// Priced is unknown, not zero.
type Cost struct {
	// Currency is the currency's code, empty when not Priced.
	Currency string
	// Nanos is the cost of the priced calls, in nanos of the currency.
	Nanos int64
	// Priced says Nanos counts at least one call of a priced model.
	Priced bool
	// Unpriced says some call that used tokens had no price.
	Unpriced bool
}

// Add returns the sum of c and d.
func (c Cost) Add(d Cost) Cost {
	cur := c.Currency
	if cur == "" {
		cur = d.Currency
	}
	return Cost{Currency: cur, Nanos: addSat(c.Nanos, d.Nanos), Priced: c.Priced || d.Priced, Unpriced: c.Unpriced || d.Unpriced}
}

// CostOf returns the cost of one call's usage u at price p; nil p is a
// model without a price. A call that used no tokens has no cost, priced
// or not: its usage stays zero.
func CostOf(p *Price, u Usage) Cost {
	switch {
	case u.InputTokens|u.OutputTokens|u.CacheReadTokens|u.CacheWriteTokens == 0:
		return Cost{}
	case p == nil:
		return Cost{Unpriced: true}
	}
	return Cost{Currency: p.Currency, Nanos: p.Cost(u), Priced: true}
}

// ParseMoney parses a non-negative decimal amount of a currency ("3",
// "0.075", "1e-3" is refused) into nanos, exactly: at most nine decimal
// places.
func ParseMoney(s string) (int64, error) {
	s = strings.TrimSpace(s)
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" && frac == "" || strings.ContainsAny(whole, "+-") {
		return 0, fmt.Errorf("%q is not a non-negative decimal number", s)
	}
	if len(frac) > 9 {
		if strings.TrimRight(frac[9:], "0") != "" {
			return 0, fmt.Errorf("%q has more than nine decimal places", s)
		}
		frac = frac[:9]
	}
	var w, f uint64
	var err error
	if whole != "" {
		if w, err = strconv.ParseUint(whole, 10, 63); err != nil {
			return 0, fmt.Errorf("%q is not a non-negative decimal number", s)
		}
	}
	if frac != "" {
		if f, err = strconv.ParseUint(frac+strings.Repeat("0", 9-len(frac)), 10, 63); err != nil {
			return 0, fmt.Errorf("%q is not a non-negative decimal number", s)
		}
	}
	if w > (math.MaxInt64-f)/NanosPerUnit {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return int64(w*NanosPerUnit + f), nil
}

// FormatMoney writes nanos as a decimal amount without trailing zeros
// ("0.00105", "3").
func FormatMoney(nanos int64) string {
	sign := ""
	if nanos < 0 {
		sign, nanos = "-", -nanos
	}
	s := strconv.FormatInt(nanos/NanosPerUnit, 10)
	if f := nanos % NanosPerUnit; f != 0 {
		s += "." + strings.TrimRight(fmt.Sprintf("%09d", f), "0")
	}
	return sign + s
}

// Money is an amount of a currency in nanos, read from a decimal number
// of the currency ("0.075", "25") with at most nine decimal places.
type Money int64

// UnmarshalText reads a non-negative decimal amount (see [ParseMoney]).
func (m *Money) UnmarshalText(b []byte) error {
	n, err := ParseMoney(string(b))
	if err != nil {
		return err
	}
	*m = Money(n)
	return nil
}

// MarshalText writes m as a decimal amount (see [FormatMoney]).
func (m Money) MarshalText() ([]byte, error) { return []byte(FormatMoney(int64(m))), nil }

// String returns m as a decimal amount.
func (m Money) String() string { return FormatMoney(int64(m)) }
