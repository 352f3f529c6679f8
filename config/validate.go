package config

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/turnstile-dev/turnstile/llm"
)

// Validate checks c as a whole: the sections' ranges, the providers' own
// checks, and the references between sections (providers, fallbacks,
// default_model, tools). It returns every problem as an [*Errors], or nil.
// [Parse] calls it; call it again after changing a Config in code.
func (c *Config) Validate() error { return newErrors(c.file, c.problems()) }

// checker collects the problems of a Config, placing each on the line of
// its key, or of the nearest enclosing key the file sets.
type checker struct {
	c   *Config
	out []Problem
}

func (v *checker) at(path, format string, args ...any) {
	v.out = append(v.out, Problem{Line: v.c.lineOf(path), Path: path, Message: fmt.Sprintf(format, args...)})
}

// settings reports the problems a section's own check found; prefix is
// the section's path. With inherited set, a problem with a key this
// section does not set itself is left out: the section inherited the
// value, which is reported where it is set.
func (v *checker) settings(prefix string, ps []llm.Problem, inherited bool) {
	for _, p := range ps {
		path := join(prefix, p.Field)
		if _, set := v.c.lines[path]; inherited && v.c.lines != nil && !set {
			continue
		}
		msg := p.Message
		if m, ok := wasMinusOne[p.Field]; ok {
			msg = m
		}
		v.at(path, "%s", msg)
	}
}

// wasMinusOne rewords the checks of the keys where -1 used to mean none.
var wasMinusOne = map[string]string{
	"max_retries":       "must not be negative: 0 now means no retries (-1 used to)",
	"max_continuations": "must not be negative: 0 now means no continuations (-1 used to)",
}

// lineOf returns the line of the key at path, or of the nearest enclosing
// key the file sets; 0 when there is none.
func (c *Config) lineOf(path string) int {
	for p := path; p != ""; {
		if line, ok := c.lines[p]; ok {
			return line
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return 0
}

// problems returns every problem of c, unsorted.
func (c *Config) problems() []Problem {
	v := &checker{c: c}
	if c.Listen == "" {
		v.at("listen", "must not be empty")
	}
	if len(c.Providers) == 0 {
		v.at("providers", "at least one provider is required")
	}
	for _, name := range sortedKeys(c.Providers) {
		if s := c.Providers[name].Settings; s != nil {
			v.settings("providers."+name, s.Problems(), false)
		}
	}
	c.checkModels(v)
	v.settings("retry", c.Retry.Problems(), false)
	v.settings("turn", c.Turn.Problems(), false)
	v.settings("store", c.Store.Problems(), false)
	if c.Server.ShutdownGrace <= 0 {
		v.at("server.shutdown_grace", "must be positive")
	}
	if c.Server.DrainDelay < 0 {
		v.at("server.drain_delay", "must not be negative")
	}
	if c.Server.KeepaliveTime <= 0 {
		v.at("server.keepalive_time", "must be positive")
	}
	if c.Server.MaxConcurrentStreams == 0 {
		v.at("server.max_concurrent_streams", "must be at least 1")
	}
	if c.Server.MaxRunningTurns < 1 {
		v.at("server.max_running_turns", "must be at least 1")
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		v.at("log.format", "%q is not text or json", c.Log.Format)
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.Log.Level) {
		v.at("log.level", "%q is not debug, info, warn or error", c.Log.Level)
	}
	c.checkMCP(v)
	return v.out
}

// checkModels checks models and default_model.
func (c *Config) checkModels(v *checker) {
	aliases := sortedKeys(c.Models)
	if len(c.Models) == 0 {
		v.at("models", "at least one model is required")
	}
	for _, alias := range aliases {
		m := c.Models[alias]
		path := "models." + alias
		switch _, ok := c.Providers[m.Provider]; {
		case m.Provider == "":
			v.at(path+".provider", "required: the name of an entry of providers")
		case !ok:
			v.at(path+".provider", "%q is not a configured provider%s", m.Provider, didYouMean(m.Provider, sortedKeys(c.Providers)))
		}
		if m.Model == "" {
			v.at(path+".model", "required: the provider's model id")
		}
		for i, fb := range m.Fallbacks {
			at := fmt.Sprintf("%s.fallbacks[%d]", path, i)
			_, ok := c.Models[fb]
			switch {
			case fb == alias:
				v.at(at, "%q is the model itself: a turn on a model always tries it first", fb)
			case !ok:
				v.at(at, "%q is not a configured model%s", fb, didYouMean(fb, aliases))
			case slices.Contains(m.Fallbacks[:i], fb):
				v.at(at, "%q appears twice", fb)
			}
		}
		if m.ContextWindow < 0 {
			v.at(path+".context_window", "must not be negative (0 means unknown)")
		}
		if m.MaxOutputTokens < 0 {
			v.at(path+".max_output_tokens", "must not be negative (0 leaves it to the provider)")
		}
		if m.FirstTokenTimeout < 0 {
			v.at(path+".first_token_timeout", "must not be negative (0 means none)")
		}
		if m.IdleTimeout < 0 {
			v.at(path+".idle_timeout", "must not be negative (0 means none)")
		}
		v.settings(path+".retry", m.Retry.Problems(), true)
	}
	c.checkCycles(v)
	switch _, ok := c.Models[c.DefaultModel]; {
	case c.DefaultModel == "" && len(c.Models) > 1:
		v.at("default_model", "required when several models are configured")
	case c.DefaultModel != "" && !ok:
		v.at("default_model", "%q is not a configured model%s", c.DefaultModel, didYouMean(c.DefaultModel, aliases))
	}
}

// checkCycles reports each fallback cycle once, at the fallbacks entry of
// its first model (in alias order) that starts it.
func (c *Config) checkCycles(v *checker) {
	reported := map[string]bool{}
	for _, alias := range sortedKeys(c.Models) {
		if reported[alias] {
			continue
		}
		cycle := c.cycleFrom(alias)
		if cycle == nil {
			continue
		}
		for _, a := range cycle {
			reported[a] = true
		}
		i := slices.Index(c.Models[alias].Fallbacks, cycle[1])
		v.at(fmt.Sprintf("models.%s.fallbacks[%d]", alias, i),
			"fallback cycle %s: fallbacks are not followed transitively (a turn on %s tries %s, then %s's own fallbacks, not those of %s), so list each model's whole chain in its own fallbacks",
			strings.Join(cycle, " -> "), alias, alias, alias, cycle[1])
	}
}

// cycleFrom returns the shortest fallback cycle through start, as the
// aliases from start back to it, or nil when there is none. A model that
// lists itself is reported on its own and is not a cycle here.
func (c *Config) cycleFrom(start string) []string {
	prev := map[string]string{}
	queue := []string{start}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		for _, next := range c.Models[cur].Fallbacks {
			if _, ok := c.Models[next]; !ok || next == cur {
				continue
			}
			if next == start {
				cycle := []string{start}
				for a := cur; a != start; a = prev[a] {
					cycle = append(cycle, a)
				}
				slices.Reverse(cycle[1:])
				return append(cycle, start)
			}
			if _, seen := prev[next]; !seen {
				prev[next] = cur
				queue = append(queue, next)
			}
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
