package telemetry

import (
	"context"
	"net/url"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
)

// ObserverOptions tune an [Observer].
type ObserverOptions struct {
	// CaptureContent records the prompts, completions, tool arguments and
	// tool results on spans (the GenAI conventions' opt-in content
	// attributes). Off by default: they hold user data.
	CaptureContent bool
	// ProviderTypes maps a configured provider name to its type (openai,
	// anthropic, gemini, simulator), from which gen_ai.provider.name is
	// derived. A provider it does not list is reported by its name.
	ProviderTypes map[string]string
	// Health reads the models' shared state for the retry-budget and
	// cooldown gauges (runtime.Runner.Health); nil reports no gauges.
	Health func() []policy.ModelHealth
	// Now is the clock of the runner whose state Health reads
	// (runtime.WithClock); nil is time.Now.
	Now func() time.Time
	// ModelProviders maps a model alias to the configured provider that
	// serves it, for gen_ai.provider.name on the turn's span.
	ModelProviders map[string]string
	// Endpoints maps a configured provider name to the base URL its
	// requests go to, from which server.address and server.port come.
	Endpoints map[string]string
	// Version is the instrumentation scope's version: turnstile's.
	Version string
	// MetadataAttributes lists the keys of a request's metadata whose
	// values are recorded on the turn's span, as turnstile.metadata.KEY;
	// the others are not. Values are user data: list only keys whose
	// values may be kept with the traces.
	MetadataAttributes []string
}

// Observer is a [runtime.Observer] that turns each turn into spans and
// metrics, following the OpenTelemetry GenAI conventions: an invoke_agent
// span per turn, a chat span per model call and an execute_tool span per
// tool call, with retries, fallbacks, compactions and cooldowns as events
// of the turn's span. Build it with [NewObserver]; it is safe for
// concurrent use.
type Observer struct {
	runtime.NopObserver
	tracer  trace.Tracer
	opts    ObserverOptions
	m       instruments
	servers map[string]server
}

// server is where a provider's requests go: server.address and
// server.port.
type server struct {
	address string
	port    int
}

// attrs returns the server's attributes: none when the address is not
// known.
func (s server) attrs() []attribute.KeyValue {
	if s.address == "" {
		return nil
	}
	return []attribute.KeyValue{keyServerAddress.String(s.address), keyServerPort.Int(s.port)}
}

// parseServer returns the server of base URL raw, with the scheme's
// default port when it names none; zero when raw is not an absolute URL.
func parseServer(raw string) server {
	u, err := url.Parse(raw)
	if err != nil || u.Hostname() == "" {
		return server{}
	}
	port, _ := strconv.Atoi(u.Port())
	if port == 0 {
		switch u.Scheme {
		case "http":
			port = 80
		case "https":
			port = 443
		default:
			return server{}
		}
	}
	return server{address: u.Hostname(), port: port}
}

var _ runtime.Observer = (*Observer)(nil)

// NewObserver returns an Observer that starts spans with tp and records
// metrics with mp. Either may be a no-op provider.
func NewObserver(tp trace.TracerProvider, mp metric.MeterProvider, opts ObserverOptions) (*Observer, error) {
	scope := []trace.TracerOption{trace.WithSchemaURL(semconv.SchemaURL)}
	meterScope := []metric.MeterOption{metric.WithSchemaURL(semconv.SchemaURL)}
	if opts.Version != "" {
		scope = append(scope, trace.WithInstrumentationVersion(opts.Version))
		meterScope = append(meterScope, metric.WithInstrumentationVersion(opts.Version))
	}
	o := &Observer{
		tracer:  tp.Tracer(instrumentationURL, scope...),
		opts:    opts,
		servers: make(map[string]server, len(opts.Endpoints)),
	}
	for name, raw := range opts.Endpoints {
		o.servers[name] = parseServer(raw)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m, err := newInstruments(mp.Meter(instrumentationURL, meterScope...), opts.Health, opts.Now)
	if err != nil {
		return nil, err
	}
	o.m = m
	return o, nil
}

// genAIProvider returns gen_ai.provider.name for a configured provider:
// the conventions' name of its type, or the configured name when its
// type is not known.
func (o *Observer) genAIProvider(name string) string {
	switch o.opts.ProviderTypes[name] {
	case "openai":
		return "openai"
	case "anthropic":
		return "anthropic"
	case "gemini":
		return "gcp.gemini"
	case "simulator":
		return "turnstile.simulator"
	}
	return name
}

// TurnStart starts the turn's invoke_agent span and counts the turn in
// flight. The span it starts under, the gRPC server span, gets the turn
// id too, and so, with [TurnIDProcessor], does every span started under
// the context it returns.
func (o *Observer) TurnStart(ctx context.Context, t runtime.TurnInfo) context.Context {
	if parent := trace.SpanFromContext(ctx); parent.IsRecording() {
		parent.SetAttributes(keyTurnID.String(t.TurnID))
	}
	attrs := []attribute.KeyValue{
		keyOperationName.String(opInvokeAgent),
		keyTurnID.String(t.TurnID),
		keyModel.String(t.Model),
	}
	if p, ok := o.opts.ModelProviders[t.Model]; ok {
		// The provider of the model asked for; a fallback may be served
		// by another (turnstile.served_by).
		attrs = append(attrs, keyProviderName.String(o.genAIProvider(p)))
	}
	if c := client(t); c != "" {
		attrs = append(attrs, keyClient.String(c))
	}
	attrs = append(attrs, o.metadataAttrs(t)...)
	ctx, span := o.tracer.Start(ctx, opInvokeAgent, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithTimestamp(t.Start), trace.WithAttributes(attrs...))
	o.m.active.Add(ctx, 1, metric.WithAttributes(keyModel.String(t.Model)))
	if span.IsRecording() {
		// For the spans of other instrumentation beneath the turn's
		// (TurnIDProcessor).
		ctx = context.WithValue(ctx, turnKey{}, t.TurnID)
	}
	if c := client(t); c != "" {
		// For the cost of the turn's calls, by client (AttemptEnd).
		ctx = context.WithValue(ctx, clientKey{}, c)
	}
	return ctx
}

// TurnEnd ends the turn's span with its outcome and totals, and records
// the turn's metrics.
func (o *Observer) TurnEnd(ctx context.Context, t runtime.TurnInfo, end runtime.TurnEnd) {
	span := trace.SpanFromContext(ctx)
	outcome := turnOutcome(end)
	if span.IsRecording() {
		attrs := append(usageAttrs(end.Usage),
			outcome,
			keyModelCalls.Int(end.Counters.ModelCalls),
			keyRetries.Int(end.Counters.Retries),
			keyFallbacks.Int(end.Counters.Fallbacks),
			keyHedges.Int(end.Counters.Hedges),
			keyCompactions.Int(end.Counters.Compactions),
			keyToolCalls.Int(end.Counters.ToolCalls),
			keyWaited.Float64(end.Waited.Seconds()),
		)
		if end.ServedBy != "" {
			attrs = append(attrs, keyServedBy.String(end.ServedBy))
		}
		attrs = append(attrs, costAttrs(end.Usage.Cost)...)
		if end.Usage.Cost.Priced && end.Usage.Cost.Unpriced {
			attrs = append(attrs, keyCostPartial.Bool(true))
		}
		if end.TimeToFirstOutput > 0 {
			attrs = append(attrs, keyFirstOutput.Float64(end.TimeToFirstOutput.Seconds()))
		}
		if e := end.Err; e != nil {
			if e.Retryable != nil {
				attrs = append(attrs, keyRetryable.Bool(*e.Retryable))
			}
			// The message is the one the client got; the root cause stays
			// in the turn's log line.
			span.SetStatus(codes.Error, e.Message)
		}
		span.SetAttributes(attrs...)
	}
	span.End(trace.WithTimestamp(t.Start.Add(end.Duration)))

	model := keyModel.String(t.Model)
	var byClient []attribute.KeyValue
	if c := client(t); c != "" {
		byClient = []attribute.KeyValue{keyClient.String(c)}
	}
	o.m.active.Add(ctx, -1, metric.WithAttributes(model))
	o.m.turns.Add(ctx, 1, metric.WithAttributes(append([]attribute.KeyValue{model, outcome}, byClient...)...))
	durAttrs := []attribute.KeyValue{model}
	if end.Err != nil {
		durAttrs = append(durAttrs, outcome)
	}
	o.m.agentDuration.Record(ctx, end.Duration.Seconds(), metric.WithAttributes(durAttrs...))
	o.m.turnWait.Record(ctx, end.Waited.Seconds(), metric.WithAttributes(model))
	tokenAttrs := append([]attribute.KeyValue{model, keyTokenType.String("input")}, byClient...)
	if in := inputTokens(end.Usage); in > 0 {
		o.m.turnTokens.Add(ctx, in, metric.WithAttributes(tokenAttrs...))
	}
	if out := end.Usage.OutputTokens; out > 0 {
		tokenAttrs[1] = keyTokenType.String("output")
		o.m.turnTokens.Add(ctx, out, metric.WithAttributes(tokenAttrs...))
	}
}

// turnOutcome is the attribute that says how a turn ended: error.type
// with the error code when it failed, turnstile.end_reason otherwise.
func turnOutcome(end runtime.TurnEnd) attribute.KeyValue {
	if end.Err != nil {
		return keyErrorType.String(end.Err.Kind.String())
	}
	if end.Completed != nil {
		return keyEndReason.String(end.Completed.Reason.String())
	}
	return keyErrorType.String("_OTHER")
}

// metadataAttrs returns the span attributes of the request metadata keys
// the options list, in their order.
func (o *Observer) metadataAttrs(t runtime.TurnInfo) []attribute.KeyValue {
	if t.Request == nil || len(t.Request.Metadata) == 0 {
		return nil
	}
	var out []attribute.KeyValue
	for _, k := range o.opts.MetadataAttributes {
		if v, ok := t.Request.Metadata[k]; ok {
			out = append(out, attribute.String(keyMetadata+k, v))
		}
	}
	return out
}

func client(t runtime.TurnInfo) string {
	if t.Request == nil {
		return ""
	}
	return t.Request.Client
}

// inputTokens is gen_ai.usage.input_tokens: every input token, cached
// ones included, as the conventions count them (turnstile's InputTokens
// leaves the cached ones out).
func inputTokens(u llm.Usage) int64 { return u.InputTokens + u.CacheReadTokens + u.CacheWriteTokens }

// clientKey carries the name of a turn's client key in the context
// [Observer.TurnStart] returns, for the metrics of its calls.
type clientKey struct{}

// units returns nanos of a currency as units of it, for spans and
// metrics; the exact amount is on the wire.
func units(nanos int64) float64 { return float64(nanos) / llm.NanosPerUnit }

// costAttrs returns the cost attributes of a call or turn, none when its
// cost is unknown (no priced call): unknown is not zero.
func costAttrs(c llm.Cost) []attribute.KeyValue {
	if !c.Priced {
		return nil
	}
	return []attribute.KeyValue{keyCost.Float64(units(c.Nanos)), keyCostCurrency.String(c.Currency)}
}

// usageAttrs returns the usage attributes, none when u counts nothing: a
// call that failed before the provider reported usage, or a provider
// that does not report it, has no usage known, which is not zero.
func usageAttrs(u llm.Usage) []attribute.KeyValue {
	if u.IsZero() {
		return nil
	}
	return []attribute.KeyValue{
		keyInputTokens.Int64(inputTokens(u)),
		keyOutputTokens.Int64(u.OutputTokens),
		keyCacheReadTokens.Int64(u.CacheReadTokens),
		keyCacheWriteTokens.Int64(u.CacheWriteTokens),
	}
}

// AttemptStart starts the model call's chat span, a child of the turn's,
// so the provider's HTTP request (instrumented in the providers) is its
// child. A hedged call is also an event of the turn's span, and counted.
func (o *Observer) AttemptStart(ctx context.Context, a runtime.AttemptInfo) context.Context {
	if a.HedgeFrom != "" {
		from, to := keyModel.String(a.HedgeFrom), keyFallbackTo.String(a.Model)
		o.m.hedges.Add(ctx, 1, metric.WithAttributes(from, to))
		trace.SpanFromContext(ctx).AddEvent(eventHedge, trace.WithAttributes(from, to, keyHedgeAfter.Float64(a.HedgeAfter.Seconds())))
	}
	ctx, span := o.tracer.Start(ctx, opChat+" "+a.ProviderModel, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			keyOperationName.String(opChat),
			keyProviderName.String(o.genAIProvider(a.Provider)),
			keyRequestModel.String(a.ProviderModel),
		))
	if !span.IsRecording() {
		return ctx
	}
	attrs := append(o.servers[a.Provider].attrs(),
		keyRequestStream.Bool(true),
		keyTurnID.String(a.TurnID),
		keyModel.String(a.Model),
		keyProvider.String(a.Provider),
		keyDeployment.String(a.Deployment),
		keyAttempt.Int(a.Attempt),
		keyCall.Int(a.Call),
		keyStep.Int(a.Step),
	)
	if a.HedgeFrom != "" {
		attrs = append(attrs, keyHedgeFrom.String(a.HedgeFrom), keyHedgeAfter.Float64(a.HedgeAfter.Seconds()))
	}
	if a.Continues {
		attrs = append(attrs, keyContinues.Bool(true))
	}
	if r := a.Request; r != nil {
		if r.MaxOutputTokens > 0 {
			attrs = append(attrs, keyRequestMaxTokens.Int(r.MaxOutputTokens))
		}
		if r.Temperature != nil {
			attrs = append(attrs, keyRequestTemperature.Float64(*r.Temperature))
		}
		attrs = append(attrs, mediaAttrs(r.Messages)...)
		if o.opts.CaptureContent {
			attrs = append(attrs, keyInputMessages.String(inputMessages(r.Messages)))
			if r.System != "" {
				attrs = append(attrs, keySystemInstructions.String(systemInstructions(r.System)))
			}
		}
	}
	span.SetAttributes(attrs...)
	return ctx
}

// AttemptEnd ends the chat span with the call's usage, finish reason and
// error class, and records the GenAI client metrics.
func (o *Observer) AttemptEnd(ctx context.Context, a runtime.AttemptInfo, end runtime.AttemptEnd) {
	span := trace.SpanFromContext(ctx)
	provider := o.genAIProvider(a.Provider)
	if span.IsRecording() {
		attrs := append(usageAttrs(end.Usage), costAttrs(end.Usage.Cost)...)
		if end.ResponseModel != "" {
			attrs = append(attrs, keyResponseModel.String(end.ResponseModel))
		}
		if end.ResponseID != "" {
			attrs = append(attrs, keyResponseID.String(end.ResponseID))
		}
		if end.TimeToFirstChunk > 0 {
			attrs = append(attrs, keyTimeToFirstChunk.Float64(end.TimeToFirstChunk.Seconds()))
		}
		switch e := end.Err; {
		case end.Lost:
			// Cancelled because the other call of its hedged pair answered
			// first: not a failure.
			attrs = append(attrs, keyErrorType.String(hedgeLost), keyHedgeLost.Bool(true))
		case e != nil:
			attrs = append(attrs, keyErrorType.String(e.Kind.String()))
			if e.RequestID != "" {
				attrs = append(attrs, keyRequestID.String(e.RequestID))
			}
			if e.StatusCode != 0 {
				attrs = append(attrs, keyStatusCode.Int(e.StatusCode))
			}
			span.SetStatus(codes.Error, e.Message)
		default:
			if r := finishReason(end.Stop); r != "" {
				attrs = append(attrs, keyFinishReasons.StringSlice([]string{r}))
			}
			if o.opts.CaptureContent {
				attrs = append(attrs, keyOutputMessages.String(outputMessages(end.Message, end.Stop)))
			}
		}
		span.SetAttributes(attrs...)
	}
	span.End()

	attrs := append(o.servers[a.Provider].attrs(),
		keyOperationName.String(opChat),
		keyProviderName.String(provider),
		keyRequestModel.String(a.ProviderModel),
		keyModel.String(a.Model),
		keyProvider.String(a.Provider),
		keyDeployment.String(a.Deployment),
	)
	if end.ResponseModel != "" {
		attrs = append(attrs, keyResponseModel.String(end.ResponseModel))
	}
	common := len(attrs)
	switch {
	case end.Lost:
		attrs = append(attrs, keyErrorType.String(hedgeLost))
	case end.Err != nil:
		attrs = append(attrs, keyErrorType.String(end.Err.Kind.String()))
	}
	set := metric.WithAttributes(attrs...)
	o.m.operationDuration.Record(ctx, end.Duration.Seconds(), set)
	o.m.attempts.Add(ctx, 1, set)
	if end.TimeToFirstChunk > 0 {
		o.m.timeToFirstChunk.Record(ctx, end.TimeToFirstChunk.Seconds(), set)
	}
	// A call cut with no usage reported costs its estimate, as its client
	// key is charged: marked as such.
	o.callCost(ctx, a, end.Estimated.Cost, keyCostEstimated.Bool(true))
	if end.Usage.IsZero() {
		return
	}
	o.callCost(ctx, a, end.Usage.Cost)
	// The conventions' token metric has no error.type.
	attrs = append(attrs[:common], keyTokenType.String("input"))
	o.m.tokenUsage.Record(ctx, inputTokens(end.Usage), metric.WithAttributes(attrs...))
	attrs[common] = keyTokenType.String("output")
	o.m.tokenUsage.Record(ctx, end.Usage.OutputTokens, metric.WithAttributes(attrs...))
}

// callCost adds the cost c of the model call a, when priced, to the cost
// counter, with the attributes extra besides the call's.
func (o *Observer) callCost(ctx context.Context, a runtime.AttemptInfo, c llm.Cost, extra ...attribute.KeyValue) {
	if !c.Priced {
		return
	}
	set := append([]attribute.KeyValue{keyModel.String(a.Model), keyProvider.String(a.Provider), keyDeployment.String(a.Deployment), keyCostCurrency.String(c.Currency)}, extra...)
	if client, ok := ctx.Value(clientKey{}).(string); ok {
		set = append(set, keyClient.String(client))
	}
	o.m.cost.Add(ctx, units(c.Nanos), metric.WithAttributes(set...))
}

// finishReason is gen_ai.response.finish_reasons' value for why a reply
// ended: the conventions' value (stop, length, content_filter,
// tool_call) where they define one, else the provider's own name
// (Anthropic's pause_turn); empty when the provider did not say.
func finishReason(s llm.StopReason) string {
	switch s {
	case llm.StopEndTurn, llm.StopSequence:
		return "stop"
	case llm.StopToolUse:
		return "tool_call"
	case llm.StopMaxTokens:
		return "length"
	case llm.StopRefusal:
		return "content_filter"
	case llm.StopUnspecified:
		return ""
	}
	return s.String()
}

// Decision adds the policy's decision to the turn's span as an event (a
// compaction's is added by Compaction, once it is made), and counts
// retries, fallbacks and cooldowns.
func (o *Observer) Decision(ctx context.Context, d runtime.DecisionInfo) {
	span := trace.SpanFromContext(ctx)
	model, class := keyModel.String(d.Model), keyErrorType.String(d.Kind.String())
	switch d.Action {
	case policy.ActionRetry:
		o.m.retries.Add(ctx, 1, metric.WithAttributes(model, class))
		attrs := []attribute.KeyValue{model, class, keyAttempt.Int(d.Attempt), keyDelay.Float64(d.Delay.Seconds())}
		if d.ToDeployment != "" {
			// A move to another deployment of the model.
			attrs = append(attrs, keyDeployment.String(d.Deployment), keyRetryToDeployment.String(d.ToDeployment))
		}
		span.AddEvent(eventRetry, trace.WithAttributes(attrs...))
	case policy.ActionFallback:
		to := keyFallbackTo.String(d.To)
		o.m.fallbacks.Add(ctx, 1, metric.WithAttributes(model, to, class))
		span.AddEvent(eventFallback, trace.WithAttributes(model, to, class, keyAttempt.Int(d.Attempt)))
	case policy.ActionCompact:
		// The compaction itself is the event (Compaction), with its
		// trigger and strategy, as one before a call is.
	default:
		span.AddEvent(eventGiveUp, trace.WithAttributes(model, class, keyAttempt.Int(d.Attempt)))
	}
	if d.Cooldown > 0 {
		o.m.cooldowns.Add(ctx, 1, metric.WithAttributes(model, class))
		attrs := []attribute.KeyValue{model, class, keyCooldown.Float64(d.Cooldown.Seconds())}
		if d.ToDeployment != "" {
			// Only the deployment the call moved from cools down.
			attrs = append(attrs, keyDeployment.String(d.Deployment))
		}
		span.AddEvent(eventCooldown, trace.WithAttributes(attrs...))
	}
}

// ToolStart starts the tool call's execute_tool span, a child of the
// turn's.
func (o *Observer) ToolStart(ctx context.Context, t runtime.ToolInfo) context.Context {
	ctx, span := o.tracer.Start(ctx, opExecuteTool+" "+t.Name, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(
			keyOperationName.String(opExecuteTool),
			keyToolName.String(t.Name),
			keyToolCallID.String(t.CallID),
			keyToolType.String(toolTypeExtension),
			keyTurnID.String(t.TurnID),
		))
	if o.opts.CaptureContent && span.IsRecording() {
		span.SetAttributes(keyToolArguments.String(t.Arguments))
	}
	return ctx
}

// ToolEnd ends the tool call's span and records its duration.
func (o *Observer) ToolEnd(ctx context.Context, t runtime.ToolInfo, end runtime.ToolEnd) {
	span := trace.SpanFromContext(ctx)
	attrs := []attribute.KeyValue{keyOperationName.String(opExecuteTool), keyToolName.String(t.Name)}
	if end.IsError {
		attrs = append(attrs, keyErrorType.String(toolError))
		span.SetAttributes(keyErrorType.String(toolError))
		span.SetStatus(codes.Error, "the tool call failed")
	}
	if o.opts.CaptureContent && span.IsRecording() {
		span.SetAttributes(keyToolResult.String(end.Content))
	}
	span.End()
	o.m.toolDuration.Record(ctx, end.Duration.Seconds(), metric.WithAttributes(attrs...))
}
