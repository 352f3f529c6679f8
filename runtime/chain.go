package runtime

import (
	"slices"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
)

// chain is a turn's model chain: the model it asked for, then that
// model's fallbacks, and which of them the turn is on. It asks the shared
// health state which models may be called, and holds the half-open probe
// of a model the turn was admitted to test.
type chain struct {
	models []*Model
	pos    int
	// at is the deployment of models[pos] the turn is on (see [router]).
	at      *Model
	routers map[string]*router
	health  *policy.Health
	// share, when not nil, tells the other replicas the cooldowns decided.
	share CooldownSharer
	now   func() time.Time
	// probe is the deployment (its health key) the turn probes after its
	// cooldown, released
	// when the turn ends without reporting on it.
	probe string
	// admitted is when the turn was admitted to the model it is on: a
	// success of the turn does not end a cooldown set after that.
	admitted time.Time
}

// newChain resolves alias and its fallbacks, in order, without repeats,
// skipping the fallbacks that cannot take the media of req's messages, or
// of which a deployment cannot take its generation options (the model
// asked for was checked by [Runner.Validate]). Fallbacks of fallbacks are
// not followed.
func newChain(r *Runner, alias string, req *TurnRequest) chain {
	c := chain{health: r.health, routers: r.routers, share: r.sharerOf(), now: r.opts.now}
	seen := map[string]bool{}
	media := requestMedia(req.Messages)
	takes := func(m *Model) bool {
		return takesAll(m, media) && !slices.ContainsFunc(r.routers[m.Alias].deps, func(d *Model) bool { return !takesOptions(d, req) })
	}
	for i, a := range append([]string{alias}, r.models[alias].Fallbacks...) {
		if m := r.models[a]; m != nil && !seen[a] && (i == 0 || takes(m)) {
			seen[a] = true
			c.models = append(c.models, m)
		}
	}
	c.at = c.routers[c.models[0].Alias].deps[0]
	return c
}

// current returns the model the turn is on: the deployment of it the turn
// calls.
func (c *chain) current() *Model { return c.at }

// start places the turn on the first model of its chain that is not
// cooling down. When every model is, the turn still gets its one chance on
// the model whose cooldown ends first: cooldowns steer turns to healthy
// models, they never take away a turn's only option. The retry budget then
// keeps such turns from retrying a model that keeps failing.
func (c *chain) start() {
	c.admitted = c.now()
	soonest, until := 0, time.Time{}
	var soonestAt *Model
	for i, m := range c.models {
		d, a := c.routers[m.Alias].pick(c.health, nil)
		if a.OK {
			c.pos, c.at = i, d
			if a.Probe {
				c.probe = d.key
			}
			return
		}
		if until.IsZero() || a.Until.Before(until) {
			soonest, soonestAt, until = i, d, a.Until
		}
	}
	c.pos, c.at = soonest, soonestAt
}

// resumeAt places a resumed turn on alias, the model its previous runner
// was on, and its first deployment, without asking for admission: the
// turn was admitted when it started. An alias not in the chain keeps the
// first model.
func (c *chain) resumeAt(alias string) {
	c.admitted = c.now()
	for i, m := range c.models {
		if m.Alias == alias {
			c.pos, c.at = i, c.routers[alias].deps[0]
			return
		}
	}
}

// next returns the index of the next model after the current one that is
// not cooling down, or -1; it claims nothing.
func (c *chain) next() int {
	for i := c.pos + 1; i < len(c.models); i++ {
		if c.routers[c.models[i].Alias].available(c.health, nil) {
			return i
		}
	}
	return -1
}

// advance moves the turn to the next model it is admitted to and returns
// it, or nil when none is left.
func (c *chain) advance() *Model {
	for i := c.pos + 1; i < len(c.models); i++ {
		now := c.now()
		d, a := c.routers[c.models[i].Alias].pick(c.health, nil)
		if !a.OK {
			continue
		}
		c.admitted = now
		c.admit(d, a)
		c.pos = i
		return d
	}
	return nil
}

// admit places the turn on d, a deployment admitted by a, taking over the
// probe a grants.
func (c *chain) admit(d *Model, a policy.Admission) {
	if a.Probe {
		c.releaseProbe()
		c.probe = d.key
	}
	c.at = d
}

// another returns a deployment of the current model, other than those
// tried excludes, that the turn is admitted to, and its admission; nil
// when the model has no other deployment available. It moves nothing:
// the caller moves the turn ([chain.moveWithin]) or gives the admission
// back ([chain.giveBack]).
func (c *chain) another(tried func(*Model) bool) (*Model, policy.Admission) {
	rt := c.routers[c.at.Alias]
	if len(rt.deps) < 2 || !rt.available(c.health, tried) {
		return nil, policy.Admission{}
	}
	d, a := rt.pick(c.health, tried)
	if d == nil || !a.OK {
		return nil, policy.Admission{}
	}
	return d, a
}

// moveWithin places the turn on d, another deployment of its current
// model admitted by a, ending any probe it held.
func (c *chain) moveWithin(d *Model, a policy.Admission) {
	c.releaseProbe()
	if a.Probe {
		c.probe = d.key
	}
	c.at, c.admitted = d, c.now()
}

// giveBack returns the admission a of d, which the turn does not use.
func (c *chain) giveBack(d *Model, a policy.Admission) {
	if a.Probe {
		c.health.Release(d.key)
	}
}

// largerAfter reports whether a model from index from on has a larger
// context window than the current one.
func (c *chain) largerAfter(from int) bool {
	cur := c.current().ContextWindow
	if cur == 0 || from < 0 {
		return false
	}
	for _, m := range c.models[from:] {
		if m.ContextWindow > cur {
			return true
		}
	}
	return false
}

// succeeded records a successful call of m (a deployment).
func (c *chain) succeeded(m *Model) {
	key := m.healthKey()
	c.health.Success(key, c.admitted)
	if c.probe == key {
		c.probe = ""
	}
}

// moveTo places the turn on m, a deployment of its current model or of a
// later model of its chain, whose hedged call answered first.
func (c *chain) moveTo(m *Model) {
	for i := c.pos; i < len(c.models); i++ {
		if c.models[i].Alias == m.Alias {
			c.pos, c.at, c.admitted = i, m, c.now()
			return
		}
	}
}

// decided applies a decision's cooldown to m (a deployment), and shares
// it with the other replicas, and ends a probe of it.
func (c *chain) decided(m *Model, k llm.Kind, cooldown time.Duration) {
	key := m.healthKey()
	if cooldown > 0 {
		c.health.Cooldown(key, k, cooldown)
		if c.share != nil {
			c.share.ShareCooldown(key, k, c.now().Add(cooldown))
		}
	}
	if c.probe == key {
		c.releaseProbe()
	}
}

func (c *chain) releaseProbe() {
	if c.probe != "" {
		c.health.Release(c.probe)
		c.probe = ""
	}
}

// close releases a probe the turn still holds.
func (c *chain) close() { c.releaseProbe() }
