package runtime

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
)

// Deployment is one place a model is served: a provider (one key at one
// endpoint, region or organisation) and the model's id there. A model with
// several deployments spreads its calls over them by weight, and a failure
// that belongs to one key (see [policy.Rule].PerKey) moves the call to
// another deployment of the same model before any fallback.
type Deployment struct {
	// Name identifies the deployment within its model, on the wire and in
	// telemetry.
	Name string
	// ProviderName is the configured provider's name.
	ProviderName string
	// Provider serves the deployment.
	Provider llm.Provider
	// ID is the provider's own model id.
	ID string
	// Weight is the deployment's share of the model's calls relative to
	// the others'; zero counts as 1.
	Weight int
	// Price, when not nil, is what this deployment's tokens cost; nil
	// takes the model's [Model.Price].
	Price *llm.Price
}

// deployState is what a runner keeps of one deployment across turns: the
// calls in flight on it and its smooth weighted round-robin credit. Both
// are read under the router's lock; inflight also changes outside it.
type deployState struct {
	weight   int
	inflight atomic.Int64
	credit   int
}

// router picks a deployment of one model for each turn that is admitted to
// it.
type router struct {
	mu sync.Mutex
	// deps are the model's deployments, each a copy of the model calling
	// one of them; one entry for a model of a single deployment.
	deps []*Model
}

// deploymentKey is the name of a deployment's health state (cooldown,
// probe, retry budget, latencies), shared with other replicas under it.
// A model of one deployment keeps its alias, as before deployments
// existed, so replicas of either version share its state; a model of
// several keys each by alias and name, which a replica that does not know
// deployments ignores (it knows no model of that name).
func deploymentKey(alias, name string, single bool) string {
	if single {
		return alias
	}
	return alias + "@" + name
}

// newRouter builds m's deployments: m itself, copied, when it names none;
// otherwise one copy of m per entry, each calling its own provider. It
// returns the problems of m's deployments.
func newRouter(m *Model) (*router, []error) {
	var errs []error
	rt := &router{}
	deps := m.Deployments
	if len(deps) == 0 {
		deps = []Deployment{{Name: m.ProviderName, ProviderName: m.ProviderName, Provider: m.Provider, ID: m.ID, Weight: 1}}
	}
	seen := map[string]bool{}
	for i, d := range deps {
		switch {
		case d.Provider == nil:
			errs = append(errs, fmt.Errorf("model %q: deployments[%d]: provider is required", m.Alias, i))
			continue
		case d.Weight < 0:
			errs = append(errs, fmt.Errorf("model %q: deployments[%d]: weight %d is negative", m.Alias, i, d.Weight))
			continue
		case seen[d.Name]:
			errs = append(errs, fmt.Errorf("model %q: deployments[%d]: name %q used twice", m.Alias, i, d.Name))
			continue
		}
		seen[d.Name] = true
		v := *m
		v.Deployments = nil
		v.ProviderName, v.Provider, v.ID, v.Deployment = d.ProviderName, d.Provider, d.ID, d.Name
		if d.Price != nil {
			v.Price = d.Price
		}
		v.key = deploymentKey(m.Alias, d.Name, len(deps) == 1)
		v.state = &deployState{weight: max(d.Weight, 1)}
		rt.deps = append(rt.deps, &v)
	}
	return rt, errs
}

// pick chooses the deployment a turn goes to and asks h to admit it,
// among the deployments h would admit (not cooling down, not being probed
// by another turn) and that skip does not exclude: smooth weighted
// round-robin proposes one, so each deployment gets its weight's share of
// the turns exactly, on every replica; least outstanding requests within
// the weight may overrule it: when another deployment would hold no more
// calls in flight for its weight with this one added than the proposed one
// holds already, the least loaded for its weight takes the turn instead,
// and the proposed one keeps its round-robin credit for the next turn. So
// a deployment that answers slowly, and holds more calls, gets fewer new
// ones. When no deployment is available it returns the one whose cooldown
// ends first, with its refusal; nil when skip excludes them all.
func (rt *router) pick(h *policy.Health, skip func(*Model) bool) (*Model, policy.Admission) {
	if len(rt.deps) == 1 {
		d := rt.deps[0]
		if skip != nil && skip(d) {
			return nil, policy.Admission{}
		}
		return d, h.Admit(d.key)
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var excluded [maxTried]bool // indexes past maxTried are never excluded
	for {
		var open [maxTried]*Model
		opened := open[:0] // the deployments h would admit now
		total := 0
		for i, d := range rt.deps {
			if (i < maxTried && excluded[i]) || (skip != nil && skip(d)) || !h.Available(d.key) {
				continue
			}
			opened = append(opened, d)
			total += d.state.weight
		}
		if len(opened) == 0 {
			break
		}
		var d *Model
		for _, o := range opened {
			o.state.credit += o.state.weight
			if d == nil || o.state.credit > d.state.credit {
				d = o
			}
		}
		p := d
		for _, o := range opened {
			// o with one more call in flight, for its weight, against
			// the proposed deployment now, for its.
			if (o.state.inflight.Load()+1)*int64(p.state.weight) <= p.state.inflight.Load()*int64(o.state.weight) && lighter(o.state, d.state) {
				d = o
			}
		}
		d.state.credit -= total
		for _, o := range opened {
			// A deployment passed over for long does not bank credit for
			// a burst later.
			o.state.credit = min(o.state.credit, total)
		}
		if a := h.Admit(d.key); a.OK {
			return d, a
		}
		// Another turn took its probe meanwhile.
		if i := slices.Index(rt.deps, d); i < maxTried {
			excluded[i] = true
		} else {
			break
		}
	}
	var soonest *Model
	var refused policy.Admission
	for _, d := range rt.deps {
		if skip != nil && skip(d) {
			continue
		}
		a := h.Admit(d.key)
		if a.OK {
			return d, a
		}
		if soonest == nil || a.Until.Before(refused.Until) {
			soonest, refused = d, a
		}
	}
	return soonest, refused
}

// maxTried is how many deployments of a model [router.pick] keeps on the
// stack while it picks; a model of more still routes over all of them.
const maxTried = 16

// lighter reports whether a has fewer calls in flight than b for their
// weights.
func lighter(a, b *deployState) bool {
	return a.inflight.Load()*int64(b.weight) < b.inflight.Load()*int64(a.weight)
}

// available reports whether a deployment of the model other than skip
// excludes could be called now, without claiming a probe.
func (rt *router) available(h *policy.Health, skip func(*Model) bool) bool {
	for _, d := range rt.deps {
		if (skip == nil || !skip(d)) && h.Available(d.key) {
			return true
		}
	}
	return false
}

// find returns the deployment named name, nil when the model has none.
func (rt *router) find(name string) *Model {
	for _, d := range rt.deps {
		if d.Deployment == name {
			return d
		}
	}
	return nil
}

// healthKey returns the name of m's health state: its deployment's key,
// or its alias for a model the runner did not build (tests' summary
// models).
func (m *Model) healthKey() string {
	if m.key == "" {
		return m.Alias
	}
	return m.key
}

// routed reports whether m is one deployment of a model of several.
func (m *Model) routed() bool { return m.key != "" && m.key != m.Alias }

// started and ended count a call in flight on m's deployment.
func (m *Model) started() {
	if m.state != nil {
		m.state.inflight.Add(1)
	}
}

func (m *Model) ended() {
	if m.state != nil {
		m.state.inflight.Add(-1)
	}
}

// healthiest returns the deployment with the fewest calls in flight for
// its weight among those with no cooldown at all, and that skip does not
// exclude; it claims nothing (a hedged call's target). Nil when none.
func (rt *router) healthiest(h *policy.Health, skip func(*Model) bool) *Model {
	var best *Model
	for _, d := range rt.deps {
		if (skip != nil && skip(d)) || !h.Healthy(d.key) {
			continue
		}
		if best == nil || lighter(d.state, best.state) {
			best = d
		}
	}
	return best
}
