package runtime

import (
	"sync/atomic"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// CooldownSharer carries the cooldowns a runner decides to the runners of
// the other replicas of a deployment, so a model that one replica found
// rate limited is skipped by all of them, not hit N times as hard. The
// other side calls [Runner.ApplyCooldown] with what it receives.
type CooldownSharer interface {
	// ShareCooldown says that alias is cooling down until until after a
	// failure of class kind. It must not block the turn.
	ShareCooldown(alias string, kind llm.Kind, until time.Time)
}

// ShareCooldowns makes the runner tell s every cooldown it decides. Call
// it before the runner's first turn; nil shares nothing (the default).
func (r *Runner) ShareCooldowns(s CooldownSharer) { r.sharer.Store(&s) }

// ApplyCooldown applies a cooldown another replica decided: new turns skip
// alias until until, as if this runner had decided it. A cooldown that is
// already over, or shorter than the one in force, changes nothing.
func (r *Runner) ApplyCooldown(alias string, kind llm.Kind, until time.Time) {
	if r.models[alias] == nil {
		return
	}
	if d := until.Sub(r.opts.now()); d > 0 {
		r.health.Cooldown(alias, kind, d)
	}
}

// sharerOf returns the runner's sharer, nil when none.
func (r *Runner) sharerOf() CooldownSharer {
	if p := r.sharer.Load(); p != nil {
		return *p
	}
	return nil
}

// sharerSlot holds a runner's sharer; set once, read by every turn.
type sharerSlot = atomic.Pointer[CooldownSharer]
