package runtime

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// HedgeConfig configures hedged first tokens on a model: when a call has
// yielded no output (text, reasoning or a tool call) After into it, the
// same request goes to To as well, in parallel; the first of the two to
// answer wins and streams, the other is cancelled. A hedge spends the
// target's retry budget and is never sent to a model that is cooling down.
// The yaml names are the configuration file's keys (a model's hedge block).
type HedgeConfig struct {
	// After is how long a call may go without output before it is hedged.
	After HedgeDelay `yaml:"after"`
	// To is where the hedged call goes; empty means [HedgeNext].
	To HedgeTarget `yaml:"to"`
}

// HedgeTarget says which model a hedged call goes to.
type HedgeTarget string

// The targets of a [HedgeConfig].
const (
	// HedgeNext sends the hedged call to the next model of the turn's chain
	// that is not cooling down. A hedge that wins moves the turn to that
	// model, as a fallback would.
	HedgeNext HedgeTarget = "next"
	// HedgeSelf sends the hedged call to the same model: another replica
	// of it may answer sooner.
	HedgeSelf HedgeTarget = "self"
	// HedgeDeployment sends the hedged call to another deployment of the
	// same model (see [Deployment]): the least loaded for its weight that
	// is not cooling down; none when the model has no other. A hedge that
	// wins keeps the turn on the model, on that deployment.
	HedgeDeployment HedgeTarget = "deployment"
)

// Problems lists what is wrong with h, at its yaml keys; none when h is
// valid.
func (h HedgeConfig) Problems() []llm.Problem {
	var out []llm.Problem
	if !h.After.set {
		out = append(out, llm.Problem{Field: "after", Message: "required: a duration such as 500ms, or a quantile of the model's observed time to first chunk such as p95"})
	}
	if h.To != "" && h.To != HedgeNext && h.To != HedgeSelf && h.To != HedgeDeployment {
		out = append(out, llm.Problem{Field: "to", Message: fmt.Sprintf("%q is not next, self or deployment", string(h.To))})
	}
	return out
}

// target returns h.To with its default applied.
func (h *HedgeConfig) target() HedgeTarget {
	if h.To == "" {
		return HedgeNext
	}
	return h.To
}

// HedgeDelay is how long a call may go without output before it is
// hedged: a fixed duration (0 hedges at once, racing the two calls), or a
// quantile of the model's recent times to first chunk. Build one with
// [HedgeAfter] or [HedgeQuantile], or decode one from text with
// UnmarshalText. The zero value is unset, which [HedgeConfig.Problems]
// reports.
type HedgeDelay struct {
	fixed    time.Duration
	quantile float64 // in (0, 1); 0 for a fixed delay
	set      bool
}

// HedgeAfter returns a fixed delay d (at least 0).
func HedgeAfter(d time.Duration) HedgeDelay { return HedgeDelay{fixed: max(d, 0), set: true} }

// HedgeQuantile returns the delay that the q-quantile (0.5 ≤ q < 1) of
// the model's recent times to first chunk gives: HedgeQuantile(0.95) hedges
// about the slowest 5% of calls. The window holds the last 256 calls; until
// 20 calls are seen the model is not hedged. A call cancelled because its
// hedge answered first counts as a sample of the time it was cancelled at.
func HedgeQuantile(q float64) HedgeDelay {
	return HedgeDelay{quantile: min(max(q, 0.5), 0.999), set: true}
}

// String returns the delay as the configuration writes it: "500ms" or "p95".
func (d HedgeDelay) String() string {
	switch {
	case !d.set:
		return "unset"
	case d.quantile > 0:
		return "p" + strconv.FormatFloat(d.quantile*100, 'f', -1, 64)
	}
	return d.fixed.String()
}

// errHedgeDelay is the failure of UnmarshalText; it does not quote the
// text, which configuration errors never do.
var errHedgeDelay = errors.New("expected a duration such as 500ms, or a quantile from p50 to p99.9 such as p95")

// UnmarshalText reads a duration ("500ms", "2s", "0") or a quantile "pNN"
// with NN from 50 to 99.9 ("p95", "p99.5").
func (d *HedgeDelay) UnmarshalText(b []byte) error {
	s := strings.TrimSpace(string(b))
	if q, ok := strings.CutPrefix(s, "p"); ok {
		f, err := strconv.ParseFloat(q, 64)
		if err != nil || !(f >= 50 && f <= 99.9) {
			return errHedgeDelay
		}
		*d = HedgeDelay{quantile: f / 100, set: true}
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return errHedgeDelay
	}
	*d = HedgeDelay{fixed: v, set: true}
	return nil
}
