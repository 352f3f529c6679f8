package telemetry_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/telemetry"
)

// convention is what the OpenTelemetry GenAI conventions of the pinned
// semconv release (go.opentelemetry.io/otel/semconv/v1.41.0, schema
// https://opentelemetry.io/schemas/1.41.0) ask of one span or metric.
type convention struct {
	kind trace.SpanKind // spans only
	unit string         // metrics only
	// required must always be there.
	required []attribute.Key
	// when maps a conditionally required or recommended attribute that
	// turnstile knows to the condition under which it must be there:
	// always, on success, on failure, or when the usage is known.
	when map[attribute.Key]cond
	// gen_ai.*, server.* and error.type attributes other than these are
	// not the conventions' for this span or metric.
}

type cond int

const (
	always cond = iota
	onSuccess
	onFailure
	withUsage
	withServer // the provider's base URL is known
)

// The conventions' attributes, by span operation and by metric. Recommended
// attributes turnstile cannot know are left out: gen_ai.conversation.id
// (turns carry no conversation id), gen_ai.request.seed, top_p,
// frequency/presence penalties and stop sequences (not in the request),
// gen_ai.agent.* (turnstile has no agent names).
var (
	chatSpan = convention{
		kind:     trace.SpanKindClient,
		required: []attribute.Key{"gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model"},
		when: map[attribute.Key]cond{
			"error.type": onFailure, "server.address": withServer, "server.port": withServer,
			"gen_ai.response.id": onSuccess, "gen_ai.response.model": onSuccess, "gen_ai.response.finish_reasons": onSuccess,
			"gen_ai.usage.input_tokens": withUsage, "gen_ai.usage.output_tokens": withUsage,
		},
	}
	chatOptional = []attribute.Key{
		"gen_ai.request.stream", "gen_ai.request.max_tokens", "gen_ai.request.temperature", "gen_ai.response.time_to_first_chunk",
		"gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_creation.input_tokens",
		"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions",
	}
	agentSpan = convention{
		kind:     trace.SpanKindInternal,
		required: []attribute.Key{"gen_ai.operation.name", "gen_ai.provider.name"},
		when: map[attribute.Key]cond{
			"error.type": onFailure, "gen_ai.usage.input_tokens": withUsage, "gen_ai.usage.output_tokens": withUsage,
		},
	}
	agentOptional = []attribute.Key{"gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_creation.input_tokens"}
	toolSpan      = convention{
		kind:     trace.SpanKindInternal,
		required: []attribute.Key{"gen_ai.operation.name", "gen_ai.tool.name", "gen_ai.tool.call.id", "gen_ai.tool.type"},
		when:     map[attribute.Key]cond{"error.type": onFailure},
	}
	toolOptional = []attribute.Key{"gen_ai.tool.call.arguments", "gen_ai.tool.call.result"}

	clientMetric = func(unit string, extra ...attribute.Key) convention {
		return convention{
			unit:     unit,
			required: append([]attribute.Key{"gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model"}, extra...),
			when:     map[attribute.Key]cond{"server.address": withServer, "server.port": withServer, "gen_ai.response.model": onSuccess},
		}
	}
	metricConventions = map[string]convention{
		"gen_ai.client.operation.duration":            clientMetric("s"),
		"gen_ai.client.operation.time_to_first_chunk": clientMetric("s"),
		"gen_ai.client.token.usage":                   tokenMetric,
	}
)

// tokenMetric is clientMetric for gen_ai.client.token.usage, which has no
// error.type: a failed call that reported usage is counted without a
// response model, which the point then cannot be told apart by.
var tokenMetric = func() convention {
	c := clientMetric("{token}", "gen_ai.token.type")
	delete(c.when, "gen_ai.response.model")
	return c
}()

var (
	metricOptional = map[string][]attribute.Key{
		"gen_ai.client.operation.duration":            {"error.type"},
		"gen_ai.client.operation.time_to_first_chunk": {"error.type"},
		"gen_ai.client.token.usage":                   {"gen_ai.response.model"},
	}
)

// TestSemconvTable runs a turn that retries, falls back, runs a tool and
// answers, and one that fails, and holds every span and every GenAI
// metric to the conventions' table above: span kind, required attributes,
// conditionally required and recommended ones when their condition holds
// (usage only when known: a call that failed before any usage has none),
// and no other gen_ai.*, server.* or error.type attribute. Every
// instrument has a unit; the scope has turnstile's version and the schema
// URL of the pinned release.
func TestSemconvTable(t *testing.T) {
	p := newPipeline(t)
	var r *runtime.Runner
	obs := observer(t, p, telemetry.ObserverOptions{
		Health: func() []policy.ModelHealth { return r.Health() }, Now: still, Version: "v1.2.3",
		ModelProviders: map[string]string{"a": "oai", "b": "claude", "c": "oai"},
		Endpoints:      map[string]string{"oai": "https://api.openai.com/v1", "claude": "https://api.anthropic.com"},
	})
	// The turn of scenario, with every reply naming its model and id.
	served := func(chunks []llm.Chunk, id string) []llm.Chunk {
		chunks[len(chunks)-1].Model, chunks[len(chunks)-1].ResponseID = "b-id-2026-01-01", id
		return chunks
	}
	a := fake.NewProvider(
		fake.Reply{Err: providerErr(llm.KindOverloaded)},
		fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "par"}, {Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 7, OutputTokens: 1}}}, Err: providerErr(llm.KindOverloaded)},
		fake.Reply{Err: providerErr(llm.KindOverloaded)},
	)
	b := fake.NewProvider(fake.Reply{Chunks: served(fake.Call("c1", "lookup", `{"q":"x"}`), "msg_1")}, fake.Reply{Chunks: served(fake.Text("done"), "msg_2")})
	lookup := fake.NewTool("lookup", func(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error) {
		return llm.ToolOutput{Content: "42"}, nil
	})
	r, err := runtime.New([]*runtime.Model{
		{Alias: "a", ProviderName: "oai", Provider: a, ID: "a-id", Fallbacks: []string{"b"}, Retry: fastRetry()},
		{Alias: "b", ProviderName: "claude", Provider: b, ID: "b-id", Retry: fastRetry()},
	}, "a", []llm.Tool{lookup}, runtime.WithObserver(obs), runtime.WithClock(still))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(t.Context(), userTurn("hi"), runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil })); err != nil {
		t.Fatal(err)
	}
	failing, err := runtime.New([]*runtime.Model{{Alias: "c", ProviderName: "oai", ID: "c-id", Retry: fastRetry(),
		Provider: fake.NewProvider(fake.Reply{Err: &llm.Error{Kind: llm.KindAuth, Message: "bad key", Provider: "fake"}})}},
		"c", nil, runtime.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := failing.Run(t.Context(), userTurn("hi"), runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil })); err == nil {
		t.Fatal("the turn did not fail")
	}

	seen := map[string]int{}
	for _, s := range p.spans.Ended() {
		a := attrs(s)
		op := a["gen_ai.operation.name"]
		seen[op]++
		var c convention
		var optional []attribute.Key
		switch op {
		case "chat":
			c, optional = chatSpan, chatOptional
		case "invoke_agent":
			c, optional = agentSpan, agentOptional
		case "execute_tool":
			c, optional = toolSpan, toolOptional
		default:
			t.Errorf("span %q: gen_ai.operation.name %q", s.Name(), op)
			continue
		}
		if s.SpanKind() != c.kind {
			t.Errorf("span %q: kind %s, want %s", s.Name(), s.SpanKind(), c.kind)
		}
		if sc := s.InstrumentationScope(); sc.Version != "v1.2.3" || sc.SchemaURL != semconv.SchemaURL {
			t.Errorf("span %q: scope version %q schema %q, want v1.2.3 and %s", s.Name(), sc.Version, sc.SchemaURL, semconv.SchemaURL)
		}
		_, failed := a["error.type"]
		usage := a["gen_ai.usage.input_tokens"] != "" || a["gen_ai.usage.output_tokens"] != ""
		check(t, "span "+s.Name(), a, c, optional, failed, usage)
		if failed && usage && (a["gen_ai.usage.input_tokens"] == "0" && a["gen_ai.usage.output_tokens"] == "0") {
			t.Errorf("span %q: usage reported as zero", s.Name())
		}
	}
	// The failed calls of a had no usage; the one that streamed did.
	if want := map[string]int{"chat": 6, "invoke_agent": 2, "execute_tool": 1}; !equalCounts(seen, want) {
		t.Errorf("spans by operation %v, want %v", seen, want)
	}

	var rm metricdata.ResourceMetrics
	if err := p.reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Version != "v1.2.3" || sm.Scope.SchemaURL != semconv.SchemaURL {
			t.Errorf("meter scope version %q schema %q", sm.Scope.Version, sm.Scope.SchemaURL)
		}
		for _, m := range sm.Metrics {
			if m.Unit == "" {
				t.Errorf("metric %s has no unit", m.Name)
			}
			c, ok := metricConventions[m.Name]
			if !ok {
				continue
			}
			if m.Unit != c.unit {
				t.Errorf("metric %s: unit %q, want %q", m.Name, m.Unit, c.unit)
			}
			for _, set := range pointSets(m) {
				a := map[attribute.Key]string{}
				for _, kv := range set.ToSlice() {
					a[kv.Key] = kv.Value.Emit()
				}
				_, failed := a["error.type"]
				check(t, "metric "+m.Name, a, c, metricOptional[m.Name], failed, true)
			}
		}
	}
}

// check holds the attributes a of one span or metric point to c.
func check(t *testing.T, what string, a map[attribute.Key]string, c convention, optional []attribute.Key, failed, usage bool) {
	t.Helper()
	for _, k := range c.required {
		if a[k] == "" {
			t.Errorf("%s: no %s (required)", what, k)
		}
	}
	for k, when := range c.when {
		var want bool
		switch when {
		case always:
			want = true
		case onSuccess:
			want = !failed
		case onFailure:
			want = failed
		case withUsage:
			want = usage
		case withServer:
			want = true // every provider of the test has a base URL
		}
		if _, got := a[k]; got != want {
			t.Errorf("%s: %s present %v, want %v", what, k, got, want)
		}
	}
	for k := range a {
		s := string(k)
		if !strings.HasPrefix(s, "gen_ai.") && !strings.HasPrefix(s, "server.") && s != "error.type" {
			continue
		}
		if _, ok := c.when[k]; ok || slices.Contains(c.required, k) || slices.Contains(optional, k) {
			continue
		}
		t.Errorf("%s: %s is not the conventions' here", what, k)
	}
}

func pointSets(m metricdata.Metrics) []attribute.Set {
	var out []attribute.Set
	switch d := m.Data.(type) {
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	}
	return out
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
