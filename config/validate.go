package config

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/store"
)

// metadataKeyRE is what a request's metadata key may be (as the server
// checks it).
var metadataKeyRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

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
// logFormats and logLevels are the values log.format and log.level take.
var (
	logFormats = []string{"text", "json"}
	logLevels  = []string{"debug", "info", "warn", "error"}
)

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
	for i, k := range c.Telemetry.MetadataAttributes {
		if !metadataKeyRE.MatchString(k) {
			v.at(fmt.Sprintf("telemetry.metadata_attributes[%d]", i), "%q is not a metadata key: 1 to 64 letters, digits, '_', '-' or '.'", k)
		}
	}
	if c.Store.Mode != store.ModeOff && c.Store.Retention > 0 && c.Turn.MaxDuration > 0 && c.Store.Retention <= c.Turn.MaxDuration {
		// The stream's age limit removes records whatever their turn.
		v.at("store.retention", "must be longer than turn.max_duration, or a running turn's first records expire before it ends")
	}
	c.checkServer(v)
	if c.Server.MaxRunningTurns < 1 {
		v.at("server.max_running_turns", "must be at least 1")
	}
	if !slices.Contains(logFormats, c.Log.Format) {
		v.at("log.format", "%q is not text or json", c.Log.Format)
	}
	if !slices.Contains(logLevels, c.Log.Level) {
		v.at("log.level", "%q is not debug, info, warn or error", c.Log.Level)
	}
	c.checkOps(v)
	c.checkMCP(v)
	c.checkAuth(v)
	c.checkPricing(v)
	return v.out
}

// checkOps checks the ops listener.
func (c *Config) checkOps(v *checker) {
	switch {
	case c.Ops.Listen != "":
		_, port, err := net.SplitHostPort(c.Ops.Listen)
		if _, perr := strconv.ParseUint(port, 10, 16); err != nil || perr != nil {
			v.at("ops.listen", "%q is not host:port (e.g. 127.0.0.1:9464, or :9464 for every interface)", c.Ops.Listen)
		} else if c.Ops.Listen == c.Listen && port != "0" {
			v.at("ops.listen", "%q is also the gRPC listen address", c.Ops.Listen)
		}
	case c.Ops.PProf:
		v.at("ops.pprof", "needs ops.listen: profiles are served on the ops listener")
	}
}

// minEventMargin is what an event needs beside the tool results of a step.
const minEventMargin = 64 << 10

// What one record of the turn store holds, for the bounds of what the
// server takes with a store on. The embedded server takes records of at
// most storeRecordBytes (store.go's maxPayload; a NATS cluster's servers
// need a max_payload of at least that, docs/durable-turns.md). A turn's
// request is stored in one record, in its protobuf wire form as it is,
// beside a few small fields (server/durable's record.go); an event, in
// one frame with a header. recordMargin is the room left for those
// fields, headers and framing.
const (
	storeRecordBytes = 8 << 20
	recordMargin     = 64 << 10
	// MaxStoredRequestBytes is the most server.max_request_bytes may be
	// with a store on: the request and the record's other fields fit one
	// record.
	MaxStoredRequestBytes = storeRecordBytes - recordMargin
	// MaxStoredEventBytes is the most server.max_event_bytes may be with
	// a store on.
	MaxStoredEventBytes = storeRecordBytes - recordMargin
)

// checkStoreRecord checks that a request and an event of the largest
// sizes the server takes fit a store record of at most record bytes; when
// and fix say in which case the bound holds and what else to do.
func (c *Config) checkStoreRecord(v *checker, record int, when, fix string) {
	s := c.Server
	if n := StoredRequestBytes(record); s.MaxRequestBytes > n {
		v.at("server.max_request_bytes", "must be at most %d %s: a turn's request is stored whole in one record of at most %d bytes; %s",
			n, when, record, fix)
	}
	if n := StoredEventBytes(record); s.MaxEventBytes > n {
		v.at("server.max_event_bytes", "must be at most %d %s: each event is stored in one record of at most %d bytes; %s",
			n, when, record, fix)
	}
}

// StoredRequestBytes is the largest server.max_request_bytes a turn store
// whose records hold at most record bytes can keep.
func StoredRequestBytes(record int) int { return record - recordMargin }

// StoredEventBytes is the largest server.max_event_bytes a turn store
// whose records hold at most record bytes can keep.
func StoredEventBytes(record int) int { return record - recordMargin }

// CheckStoreRecords checks the request and event bounds against the
// records the store that was opened takes, at most record bytes: a NATS
// cluster's servers take records of their max_payload, which only a
// connection tells (the embedded server's are checked by [Validate]).
func (c *Config) CheckStoreRecords(record int) error {
	v := &checker{c: c}
	c.checkStoreRecord(v, record, fmt.Sprintf("with the NATS servers of store.nats, which take records of at most %d bytes (their max_payload)", record),
		"or raise max_payload on the NATS servers")
	return newErrors(c.file, v.out)
}

// checkServer checks the server block.
func (c *Config) checkServer(v *checker) {
	s := c.Server
	positive := func(key string, d time.Duration) {
		if d <= 0 {
			v.at("server."+key, "must be positive")
		}
	}
	atLeast := func(key string, n, min int) {
		if n < min {
			v.at("server."+key, "must be at least %d", min)
		}
	}
	positive("shutdown_grace", s.ShutdownGrace)
	if s.DrainDelay < 0 {
		v.at("server.drain_delay", "must not be negative")
	}
	positive("keepalive_time", s.KeepaliveTime)
	if s.MaxConcurrentStreams == 0 {
		v.at("server.max_concurrent_streams", "must be at least 1")
	}
	if s.TLS != nil {
		v.settings("server.tls", s.TLS.Problems(), false)
	} else if _, set := c.lines["server.tls"]; set {
		v.at("server.tls", "must hold cert_file and key_file; leave it out to serve plaintext")
	}
	atLeast("max_concurrent_turns", s.MaxConcurrentTurns, 1)
	if s.MemoryLimit != nil && *s.MemoryLimit < 0 {
		v.at("server.memory_limit", "must not be negative (0 means no bound; leave it out for GOMEMLIMIT's)")
	}
	atLeast("max_connections", s.MaxConnections, 1)
	if s.MaxConnectionsPerPeer < 1 || s.MaxConnectionsPerPeer > max(s.MaxConnections, 1) {
		v.at("server.max_connections_per_peer", "must be at least 1 and at most server.max_connections (%d)", s.MaxConnections)
	}
	if s.MaxHandshakes < 1 || s.MaxHandshakes > max(s.MaxConnections, 1) {
		v.at("server.max_handshakes", "must be at least 1 and at most server.max_connections (%d)", s.MaxConnections)
	}
	positive("max_connection_idle", s.MaxConnectionIdle)
	if s.MaxConnectionAge < 0 {
		v.at("server.max_connection_age", "must not be negative (0 means never)")
	}
	switch g := s.MaxConnectionAgeGrace; {
	case g < 0:
		v.at("server.max_connection_age_grace", "must not be negative (0 lets turns end)")
	case g > 0 && c.Turn.MaxDuration > 0 && g < c.Turn.MaxDuration, g > 0 && c.Turn.MaxDuration == 0:
		v.at("server.max_connection_age_grace", "must be 0 or at least turn.max_duration, or turns still running when a connection reaches its age are cut")
	}
	positive("handshake_timeout", s.HandshakeTimeout)
	if s.MaxHeaderBytes < 1024 || s.MaxHeaderBytes > 16<<20 {
		v.at("server.max_header_bytes", "must be at least 1024 and at most %d", 16<<20)
	}
	atLeast("max_request_bytes", s.MaxRequestBytes, 1024)
	if c.Store.Mode != store.ModeOff {
		// Refused here, not by the store at the turn's start (where it
		// looked like an unreachable store).
		c.checkStoreRecord(v, storeRecordBytes, fmt.Sprintf("with the turn store on (store.mode %s)", c.Store.Mode), "or set store.mode off")
	}
	atLeast("max_request_media_bytes", s.MaxRequestMediaBytes, 1024)
	if _, problems := runtime.ParseHostRules(s.RefusedMediaHosts); len(problems) > 0 {
		for _, p := range problems {
			v.at("server.refused_media_hosts"+p.Field, "%s", p.Message)
		}
	}
	switch {
	case s.MaxMediaBytes < 1024:
		v.at("server.max_media_bytes", "must be at least 1024")
	case s.MaxMediaBytes > s.MaxRequestMediaBytes && s.MaxRequestMediaBytes >= 1024:
		v.at("server.max_media_bytes", "must be at most server.max_request_media_bytes (%d)", s.MaxRequestMediaBytes)
	}
	if need := c.Turn.MaxToolResultBytes + minEventMargin; s.MaxEventBytes < need {
		v.at("server.max_event_bytes", "must be at least turn.max_tool_result_bytes + %d (%d), so the tool results of a step fit one event", minEventMargin, need)
	}
	positive("send_timeout", s.SendTimeout)
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
		c.checkDeployments(v, path, m)
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
		if h := m.Hedge; h != nil {
			v.settings(path+".hedge", h.Problems(), false)
			if (h.To == "" || h.To == runtime.HedgeNext) && len(m.Fallbacks) == 0 {
				v.at(path+".hedge.to", "next needs a model in fallbacks to hedge to (or hedge to self)")
			}
			if h.To == runtime.HedgeDeployment && len(m.Routes()) < 2 {
				v.at(path+".hedge.to", "deployment needs a second entry in deployments to hedge to (or hedge to self)")
			}
		}
		if rc := m.Reasoning; rc != nil {
			v.settings(path+".reasoning", rc.Problems(), false)
		}
		if p := m.TopP; p != nil && !(*p >= 0 && *p <= 1) {
			v.at(path+".top_p", "must be from 0 to 1")
		}
		if cc := m.Capabilities; cc != nil {
			v.settings(path+".capabilities", cc.Problems(), false)
		}
		if s := m.OnStreamCut; s != runtime.StreamCutRestart && s != runtime.StreamCutContinue {
			v.at(path+".on_stream_cut", "%q is not restart or continue", string(s))
		}
		c.checkContext(v, path, m, aliases)
		checkInput(v, path+".input", m.Input)
	}
	c.checkCycles(v)
	switch _, ok := c.Models[c.DefaultModel]; {
	case c.DefaultModel == "" && len(c.Models) > 1:
		v.at("default_model", "required when several models are configured")
	case c.DefaultModel != "" && !ok:
		v.at("default_model", "%q is not a configured model%s", c.DefaultModel, didYouMean(c.DefaultModel, aliases))
	}
}

// checkDeployments checks where model m (at path) is served: its provider
// and model, or its deployments, not both.
func (c *Config) checkDeployments(v *checker, path string, m Model) {
	provider := func(at, name string) {
		switch _, ok := c.Providers[name]; {
		case name == "":
			v.at(at, "required: the name of an entry of providers")
		case !ok:
			v.at(at, "%q is not a configured provider%s", name, didYouMean(name, sortedKeys(c.Providers)))
		}
	}
	if len(m.Deployments) == 0 {
		if _, set := c.lines[path+".deployments"]; set && c.lines != nil {
			v.at(path+".deployments", "must not be empty: list the deployments, or set provider and model instead")
			return
		}
		provider(path+".provider", m.Provider)
		if m.Model == "" {
			v.at(path+".model", "required: the provider's model id")
		}
		return
	}
	if m.Provider != "" {
		v.at(path+".provider", "set provider and model, or deployments, not both: each deployment names its provider")
	}
	if m.Model != "" {
		v.at(path+".model", "set provider and model, or deployments, not both: each deployment names its model")
	}
	names := map[string]int{}
	for i, d := range m.Routes() {
		at := fmt.Sprintf("%s.deployments[%d]", path, i)
		provider(at+".provider", d.Provider)
		if d.Model == "" {
			v.at(at+".model", "required: the provider's model id")
		}
		if d.Weight <= 0 {
			v.at(at+".weight", "must be positive (default 1)")
		}
		if j, dup := names[d.Name]; dup && d.Name != "" {
			v.at(at+".name", "%q is also the name of deployments[%d]: names are unique per model (a deployment without one is named after its provider)", d.Name, j)
		} else {
			names[d.Name] = i
		}
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

// checkInput checks a model's input list: known kinds, text among them,
// none twice. Unset (nil) is fine: the provider's defaults apply.
func checkInput(v *checker, path string, in []llm.Modality) {
	if in == nil {
		return
	}
	for i, k := range in {
		at := fmt.Sprintf("%s[%d]", path, i)
		switch {
		case !slices.Contains(llm.Modalities, k):
			v.at(at, "%q is not text, image, pdf or audio", string(k))
		case slices.Contains(in[:i], k):
			v.at(at, "%q appears twice", string(k))
		}
	}
	if !slices.Contains(in, llm.ModalityText) {
		v.at(path, "must include text: every turn has a prompt")
	}
}
