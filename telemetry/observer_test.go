package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/telemetry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pipeline is an in-memory OpenTelemetry pipeline: spans as they end,
// metrics on demand.
type pipeline struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newPipeline(t *testing.T) *pipeline {
	p := &pipeline{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	p.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(p.spans))
	p.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(p.reader))
	t.Cleanup(func() {
		_ = p.tp.Shutdown(context.Background())
		_ = p.mp.Shutdown(context.Background())
	})
	return p
}

// metrics collects every metric recorded so far, by name.
func (p *pipeline) metrics(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := p.reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

func providerErr(k llm.Kind) error {
	return &llm.Error{Kind: k, Message: strings.ToLower(k.String()) + " upstream", Provider: "fake", StatusCode: 503, RequestID: "req-" + k.String()}
}

func fastRetry() policy.Retry {
	return policy.Retry{
		MaxRetries: 2, InitialBackoff: time.Millisecond, Multiplier: 2, MaxBackoff: 4 * time.Millisecond,
		MaxRetryAfter: time.Second, Cooldown: time.Minute, BudgetTokens: 10, BudgetRefill: 1,
	}
}

// scenario runs the turn every trace test reads: model a is overloaded
// three times (two retries, then a fallback that cools it down); model b
// calls tool lookup, then answers, reporting a dated model id.
func scenario(t *testing.T, obs runtime.Observer, req *runtime.TurnRequest) *runtime.Runner {
	t.Helper()
	a := fake.NewProvider(
		fake.Reply{Err: providerErr(llm.KindOverloaded)},
		fake.Reply{Chunks: []llm.Chunk{{Kind: llm.ChunkText, Text: "par"}, {Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 7, OutputTokens: 1}}}, Err: providerErr(llm.KindOverloaded)},
		fake.Reply{Err: providerErr(llm.KindOverloaded)},
	)
	answer := fake.Text("done")
	answer[1].Usage.CacheReadTokens = 30
	answer[2].Model, answer[2].ResponseID = "b-id-2026-01-01", "msg_b2"
	b := fake.NewProvider(fake.Reply{Chunks: fake.Call("c1", "lookup", `{"q":"x"}`)}, fake.Reply{Chunks: answer})
	lookup := fake.NewTool("lookup", func(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error) {
		return llm.ToolOutput{Content: "42"}, nil
	})
	r, err := runtime.New([]*runtime.Model{
		{Alias: "a", ProviderName: "oai", Provider: a, ID: "a-id", Fallbacks: []string{"b"}, Retry: fastRetry()},
		{Alias: "b", ProviderName: "claude", Provider: b, ID: "b-id", Retry: fastRetry()},
	}, "a", []llm.Tool{lookup}, runtime.WithObserver(obs), runtime.WithIDs(func() string { return "t1" }),
		runtime.WithJitter(func() float64 { return 0.5 }),
		// A still clock keeps the retry budget from refilling during the turn.
		runtime.WithClock(still))
	if err != nil {
		t.Fatal(err)
	}
	if req == nil {
		req = userTurn("hi")
	}
	if _, err := r.Run(t.Context(), req, runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil })); err != nil {
		t.Fatal(err)
	}
	return r
}

// still is the clock of the scenario's runner: it does not move.
func still() time.Time { return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) }

func userTurn(text string) *runtime.TurnRequest {
	return &runtime.TurnRequest{Messages: []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(text)}}}}
}

func observer(t *testing.T, p *pipeline, opts telemetry.ObserverOptions) *telemetry.Observer {
	t.Helper()
	if opts.ProviderTypes == nil {
		opts.ProviderTypes = map[string]string{"oai": "openai", "claude": "anthropic"}
	}
	o, err := telemetry.NewObserver(p.tp, p.mp, opts)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// tree renders spans as an indented tree, children in start order, each
// span with its kind and the attributes named in show, and events.
func tree(spans []sdktrace.ReadOnlySpan, show ...attribute.Key) string {
	children := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	ids := map[trace.SpanID]bool{}
	for _, s := range spans {
		ids[s.SpanContext().SpanID()] = true
	}
	var roots []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if p := s.Parent().SpanID(); p.IsValid() && ids[p] {
			children[p] = append(children[p], s)
		} else {
			roots = append(roots, s)
		}
	}
	var b strings.Builder
	var walk func(s sdktrace.ReadOnlySpan, depth int)
	walk = func(s sdktrace.ReadOnlySpan, depth int) {
		fmt.Fprintf(&b, "%s%s [%s]", strings.Repeat("  ", depth), s.Name(), s.SpanKind())
		for _, kv := range s.Attributes() {
			if slices.Contains(show, kv.Key) {
				fmt.Fprintf(&b, " %s=%s", kv.Key, kv.Value.Emit())
			}
		}
		if s.Status().Code != 0 {
			fmt.Fprintf(&b, " status=%s", s.Status().Code)
		}
		b.WriteString("\n")
		for _, ev := range s.Events() {
			fmt.Fprintf(&b, "%s  @%s", strings.Repeat("  ", depth), ev.Name)
			for _, kv := range ev.Attributes {
				fmt.Fprintf(&b, " %s=%s", kv.Key, kv.Value.Emit())
			}
			b.WriteString("\n")
		}
		kids := children[s.SpanContext().SpanID()]
		sort.SliceStable(kids, func(i, j int) bool { return kids[i].StartTime().Before(kids[j].StartTime()) })
		for _, c := range kids {
			walk(c, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
	return b.String()
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]string {
	out := map[attribute.Key]string{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value.Emit()
	}
	return out
}

func named(t *testing.T, spans []sdktrace.ReadOnlySpan, name string, nth int) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range spans {
		if s.Name() == name {
			if nth == 0 {
				return s
			}
			nth--
		}
	}
	t.Fatalf("no span %q", name)
	return nil
}

// TestSpanTree runs a turn with two retries, a fallback and a tool call,
// and asserts the span tree, each span's GenAI attributes, and the
// events on the turn's span.
func TestSpanTree(t *testing.T) {
	p := newPipeline(t)
	req := userTurn("hi")
	req.Client = "team-a"
	scenario(t, observer(t, p, telemetry.ObserverOptions{}), req)
	spans := p.spans.Ended()

	got := tree(spans, "gen_ai.operation.name", "gen_ai.provider.name", "turnstile.model", "turnstile.attempt", "error.type", "gen_ai.tool.name")
	want := `invoke_agent [internal] gen_ai.operation.name=invoke_agent turnstile.model=a
  @turnstile.retry turnstile.model=a error.type=OVERLOADED turnstile.attempt=1 turnstile.delay=0.001
  @turnstile.retry turnstile.model=a error.type=OVERLOADED turnstile.attempt=2 turnstile.delay=0.002
  @turnstile.fallback turnstile.model=a turnstile.fallback.to=b error.type=OVERLOADED turnstile.attempt=3
  @turnstile.cooldown turnstile.model=a error.type=OVERLOADED turnstile.cooldown=60
  chat a-id [client] gen_ai.operation.name=chat gen_ai.provider.name=openai turnstile.model=a turnstile.attempt=1 error.type=OVERLOADED status=Error
  chat a-id [client] gen_ai.operation.name=chat gen_ai.provider.name=openai turnstile.model=a turnstile.attempt=2 error.type=OVERLOADED status=Error
  chat a-id [client] gen_ai.operation.name=chat gen_ai.provider.name=openai turnstile.model=a turnstile.attempt=3 error.type=OVERLOADED status=Error
  chat b-id [client] gen_ai.operation.name=chat gen_ai.provider.name=anthropic turnstile.model=b turnstile.attempt=1
  execute_tool lookup [internal] gen_ai.operation.name=execute_tool gen_ai.tool.name=lookup
  chat b-id [client] gen_ai.operation.name=chat gen_ai.provider.name=anthropic turnstile.model=b turnstile.attempt=1
`
	if got != want {
		t.Errorf("span tree:\n%s\nwant:\n%s", got, want)
	}

	turn := attrs(named(t, spans, "invoke_agent", 0))
	for k, v := range map[attribute.Key]string{
		"turnstile.turn.id": "t1", "turnstile.client": "team-a", "turnstile.end_reason": "end_turn",
		"turnstile.served_by": "b", "turnstile.model_calls": "5", "turnstile.retries": "2", "turnstile.fallbacks": "1",
		"turnstile.tool_calls": "1", "gen_ai.usage.input_tokens": "57", "gen_ai.usage.output_tokens": "11",
		"gen_ai.usage.cache_read.input_tokens": "30",
	} {
		if turn[k] != v {
			t.Errorf("invoke_agent %s = %q, want %q", k, turn[k], v)
		}
	}
	if _, ok := turn["error.type"]; ok {
		t.Error("a completed turn has error.type")
	}

	failed := attrs(named(t, spans, "chat a-id", 1))
	for k, v := range map[attribute.Key]string{
		"gen_ai.request.model": "a-id", "gen_ai.request.stream": "true", "turnstile.turn.id": "t1",
		"turnstile.provider": "oai", "turnstile.call": "2", "turnstile.step": "1",
		"gen_ai.usage.input_tokens": "7", "gen_ai.usage.output_tokens": "1",
		"turnstile.provider.request_id": "req-OVERLOADED", "http.response.status_code": "503",
	} {
		if failed[k] != v {
			t.Errorf("failed chat span %s = %q, want %q", k, failed[k], v)
		}
	}
	if _, ok := failed["gen_ai.response.time_to_first_chunk"]; !ok {
		t.Error("the chat span that streamed has no time to first chunk")
	}

	last := named(t, spans, "chat b-id", 1)
	answer := attrs(last)
	for k, v := range map[attribute.Key]string{
		"gen_ai.response.model": "b-id-2026-01-01", "gen_ai.response.id": "msg_b2", "gen_ai.response.finish_reasons": `["stop"]`,
		"gen_ai.usage.input_tokens": "40", "gen_ai.usage.output_tokens": "5", "gen_ai.usage.cache_read.input_tokens": "30",
		"gen_ai.usage.cache_creation.input_tokens": "0", "turnstile.call": "5", "turnstile.step": "2",
	} {
		if answer[k] != v {
			t.Errorf("answer chat span %s = %q, want %q", k, answer[k], v)
		}
	}
	tool := attrs(named(t, spans, "execute_tool lookup", 0))
	if tool["gen_ai.tool.call.id"] != "c1" || tool["turnstile.turn.id"] != "t1" || tool["gen_ai.tool.type"] != "extension" {
		t.Errorf("execute_tool attributes = %v", tool)
	}
	// Nothing of the conversation without capture_content.
	for _, s := range spans {
		for _, kv := range s.Attributes() {
			v := kv.Value.Emit()
			if v == "hi" || v == "done" || v == "42" || strings.Contains(v, `"q"`) || strings.Contains(string(kv.Key), "messages") {
				t.Errorf("span %s carries content: %s=%s", s.Name(), kv.Key, v)
			}
		}
	}
}

// TestCaptureContent asserts that with capture_content the chat spans
// carry the conversation and the reply, and the tool span its arguments
// and result, in the conventions' JSON shapes.
func TestCaptureContent(t *testing.T) {
	p := newPipeline(t)
	req := userTurn("what is x?")
	req.System = "be brief"
	scenario(t, observer(t, p, telemetry.ObserverOptions{CaptureContent: true}), req)
	spans := p.spans.Ended()
	last := attrs(named(t, spans, "chat b-id", 1))
	if got, want := last["gen_ai.system_instructions"], `[{"type":"text","content":"be brief"}]`; got != want {
		t.Errorf("system instructions = %s, want %s", got, want)
	}
	wantIn := `[{"role":"user","parts":[{"type":"text","content":"what is x?"}]},` +
		`{"role":"assistant","parts":[{"type":"tool_call","id":"c1","name":"lookup","arguments":{"q":"x"}}]},` +
		`{"role":"tool","parts":[{"type":"tool_call_response","id":"c1","response":"42"}]}]`
	if got := last["gen_ai.input.messages"]; got != wantIn {
		t.Errorf("input messages =\n%s\nwant\n%s", got, wantIn)
	}
	if got, want := last["gen_ai.output.messages"], `[{"role":"assistant","parts":[{"type":"text","content":"done"}],"finish_reason":"stop"}]`; got != want {
		t.Errorf("output messages = %s, want %s", got, want)
	}
	tool := attrs(named(t, spans, "execute_tool lookup", 0))
	if tool["gen_ai.tool.call.arguments"] != `{"q":"x"}` || tool["gen_ai.tool.call.result"] != "42" {
		t.Errorf("tool content = %v", tool)
	}
	if _, ok := attrs(named(t, spans, "chat a-id", 0))["gen_ai.output.messages"]; ok {
		t.Error("a failed call has output messages")
	}
}

// point is a metric data point in a comparable form.
type point struct {
	attrs string
	value string
}

func points(t *testing.T, m metricdata.Metrics) []string {
	t.Helper()
	var out []string
	render := func(set attribute.Set, v string) {
		var kv []string
		for _, a := range set.ToSlice() {
			kv = append(kv, string(a.Key)+"="+a.Value.Emit())
		}
		out = append(out, strings.Join(kv, ",")+" "+v)
	}
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			render(p.Attributes, fmt.Sprint(p.Value))
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			render(p.Attributes, fmt.Sprint(p.Value))
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			render(p.Attributes, fmt.Sprint(p.Value))
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			render(p.Attributes, fmt.Sprintf("count=%d", p.Count))
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			render(p.Attributes, fmt.Sprintf("count=%d sum=%d", p.Count, p.Sum))
		}
	default:
		t.Fatalf("metric %s: unexpected data %T", m.Name, m.Data)
	}
	sort.Strings(out)
	return out
}

// TestMetrics runs the same turn and asserts every point it recorded,
// attributes included: bounded sets only, never a turn id.
func TestMetrics(t *testing.T) {
	p := newPipeline(t)
	var r *runtime.Runner
	req := userTurn("hi")
	req.Client = "team-a"
	obs := observer(t, p, telemetry.ObserverOptions{
		Health: func() []policy.ModelHealth { return r.Health() }, Now: still,
		ModelProviders: map[string]string{"a": "oai", "b": "claude"},
		Endpoints:      map[string]string{"oai": "https://api.openai.com/v1", "claude": "http://127.0.0.1:8081"},
	})
	r = scenario(t, obs, req)
	got := p.metrics(t)

	// Attributes are listed in key order.
	chatA := "gen_ai.operation.name=chat,gen_ai.provider.name=openai,gen_ai.request.model=a-id"
	chatB := "gen_ai.operation.name=chat,gen_ai.provider.name=anthropic,gen_ai.request.model=b-id"
	atA := ",server.address=api.openai.com,server.port=443,turnstile.deployment=oai,turnstile.model=a,turnstile.provider=oai"
	atB := ",server.address=127.0.0.1,server.port=8081,turnstile.deployment=claude,turnstile.model=b,turnstile.provider=claude"
	// b's answer names its model; its first call, cut short, does not.
	answerB := chatB + ",gen_ai.response.model=b-id-2026-01-01"
	want := map[string][]string{
		"gen_ai.client.operation.duration": {
			"error.type=OVERLOADED," + chatA + atA + " count=3",
			chatB + atB + " count=1",
			answerB + atB + " count=1",
		},
		"turnstile.attempts": {
			"error.type=OVERLOADED," + chatA + atA + " 3",
			chatB + atB + " 1",
			answerB + atB + " 1",
		},
		// The second call on a streamed before it failed.
		"gen_ai.client.operation.time_to_first_chunk": {
			"error.type=OVERLOADED," + chatA + atA + " count=1",
			chatB + atB + " count=1",
			answerB + atB + " count=1",
		},
		"gen_ai.client.token.usage": {
			chatA + ",gen_ai.token.type=input" + atA + " count=1 sum=7",
			chatA + ",gen_ai.token.type=output" + atA + " count=1 sum=1",
			chatB + ",gen_ai.token.type=input" + atB + " count=1 sum=10",
			chatB + ",gen_ai.token.type=output" + atB + " count=1 sum=5",
			answerB + ",gen_ai.token.type=input" + atB + " count=1 sum=40",
			answerB + ",gen_ai.token.type=output" + atB + " count=1 sum=5",
		},
		"gen_ai.execute_tool.duration": {"gen_ai.operation.name=execute_tool,gen_ai.tool.name=lookup count=1"},
		"gen_ai.invoke_agent.duration": {"turnstile.model=a count=1"},
		"turnstile.retries":            {"error.type=OVERLOADED,turnstile.model=a 2"},
		"turnstile.fallbacks":          {"error.type=OVERLOADED,turnstile.fallback.to=b,turnstile.model=a 1"},
		"turnstile.cooldowns":          {"error.type=OVERLOADED,turnstile.model=a 1"},
		"turnstile.turns":              {"turnstile.client=team-a,turnstile.end_reason=end_turn,turnstile.model=a 1"},
		"turnstile.turns.active":       {"turnstile.model=a 0"},
		"turnstile.turn.wait":          {"turnstile.model=a count=1"},
		"turnstile.turn.tokens": {
			"gen_ai.token.type=input,turnstile.client=team-a,turnstile.model=a 57",
			"gen_ai.token.type=output,turnstile.client=team-a,turnstile.model=a 11",
		},
		// a's two retries failed, spending the token each took; a is
		// cooling down after the fallback.
		"turnstile.model.retry_budget": {"turnstile.model=a 8", "turnstile.model=b 10"},
		"turnstile.model.cooling_down": {"turnstile.model=a 1", "turnstile.model=b 0"},
	}
	for name, w := range want {
		m, ok := got[name]
		if !ok {
			t.Errorf("no metric %s", name)
			continue
		}
		sort.Strings(w)
		if g := points(t, m); !slices.Equal(g, w) {
			t.Errorf("%s points:\n%s\nwant:\n%s", name, strings.Join(g, "\n"), strings.Join(w, "\n"))
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("unexpected metric %s", name)
		}
	}
	for name, m := range got {
		for _, pt := range points(t, m) {
			if strings.Contains(pt, "t1") || strings.Contains(pt, "turn.id") || strings.Contains(pt, "hi") {
				t.Errorf("%s has an unbounded attribute: %s", name, pt)
			}
		}
	}
	if m := got["gen_ai.client.operation.duration"]; m.Unit != "s" {
		t.Errorf("operation duration unit = %q, want s", m.Unit)
	}
}

// TestFailedTurn asserts a failed turn's span status and outcome
// attributes, and that it counts by error code.
func TestFailedTurn(t *testing.T) {
	p := newPipeline(t)
	a := fake.NewProvider(fake.Reply{Err: &llm.Error{Kind: llm.KindAuth, Message: "bad key", Provider: "fake", Err: errors.New("401")}})
	r, err := runtime.New([]*runtime.Model{{Alias: "a", ProviderName: "oai", Provider: a, ID: "a-id", Retry: fastRetry()}}, "a", nil,
		runtime.WithObserver(observer(t, p, telemetry.ObserverOptions{})))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(t.Context(), userTurn("hi"), runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil })); err == nil {
		t.Fatal("the turn did not fail")
	}
	got := tree(p.spans.Ended(), "error.type", "turnstile.retryable")
	want := `invoke_agent [internal] error.type=AUTH turnstile.retryable=false status=Error
  @turnstile.give_up turnstile.model=a error.type=AUTH turnstile.attempt=1
  @turnstile.cooldown turnstile.model=a error.type=AUTH turnstile.cooldown=60
  chat a-id [client] error.type=AUTH status=Error
`
	if got != want {
		t.Errorf("span tree:\n%s\nwant:\n%s", got, want)
	}
	turns := points(t, p.metrics(t)["turnstile.turns"])
	if w := []string{"error.type=AUTH,turnstile.model=a 1"}; !slices.Equal(turns, w) {
		t.Errorf("turnstile.turns = %v, want %v", turns, w)
	}
}

// TestHedgedCall runs a turn whose first call gives no output until a
// hedge to the next model answers: the hedge is an event of the turn's
// span and a chat span of its own, the slow call's span says it lost the
// race without an error status, and both are counted apart from failures.
func TestHedgedCall(t *testing.T) {
	p := newPipeline(t)
	slow := fake.NewProvider(fake.Reply{Hang: true})
	fast := fake.NewProvider(fake.Reply{Chunks: fake.Text("quick")})
	a := &runtime.Model{Alias: "a", ProviderName: "oai", Provider: slow, ID: "a-id", Fallbacks: []string{"b"}, Retry: fastRetry(),
		Hedge: &runtime.HedgeConfig{After: runtime.HedgeAfter(20 * time.Millisecond)}}
	b := &runtime.Model{Alias: "b", ProviderName: "claude", Provider: fast, ID: "b-id", Retry: fastRetry()}
	r, err := runtime.New([]*runtime.Model{a, b}, "a", nil, runtime.WithObserver(observer(t, p, telemetry.ObserverOptions{})))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(t.Context(), userTurn("hi"), runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil })); err != nil {
		t.Fatal(err)
	}
	got := tree(p.spans.Ended(), "turnstile.model", "turnstile.hedge.from", "turnstile.hedge.lost", "error.type", "turnstile.hedges")
	want := `invoke_agent [internal] turnstile.model=a turnstile.hedges=1
  @turnstile.hedge turnstile.model=a turnstile.fallback.to=b turnstile.hedge.after=0.02
  chat a-id [client] turnstile.model=a error.type=hedge_lost turnstile.hedge.lost=true
  chat b-id [client] turnstile.model=b turnstile.hedge.from=a
`
	if got != want {
		t.Errorf("span tree:\n%s\nwant:\n%s", got, want)
	}
	m := p.metrics(t)
	if g, w := points(t, m["turnstile.hedges"]), []string{"turnstile.fallback.to=b,turnstile.model=a 1"}; !slices.Equal(g, w) {
		t.Errorf("turnstile.hedges = %v, want %v", g, w)
	}
	attempts := strings.Join(points(t, m["turnstile.attempts"]), "\n")
	if !strings.Contains(attempts, "error.type=hedge_lost,") || strings.Contains(attempts, "CANCELLED") {
		t.Errorf("turnstile.attempts:\n%s\nwant the lost call as hedge_lost", attempts)
	}
}
