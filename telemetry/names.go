package telemetry

import "go.opentelemetry.io/otel/attribute"

// The OpenTelemetry GenAI semantic conventions are still in development
// and have moved between releases (gen_ai.system became
// gen_ai.provider.name in 2025; the conventions now live in their own
// repository). The Go semconv packages stopped carrying them after
// v1.41.0, so the names turnstile emits are kept here, in one place;
// names_test.go holds them to semconv/v1.41.0 where that release has them.

// GenAI attribute keys.
const (
	keyOperationName      = attribute.Key("gen_ai.operation.name")
	keyProviderName       = attribute.Key("gen_ai.provider.name")
	keyRequestModel       = attribute.Key("gen_ai.request.model")
	keyRequestStream      = attribute.Key("gen_ai.request.stream")
	keyRequestMaxTokens   = attribute.Key("gen_ai.request.max_tokens")
	keyRequestTemperature = attribute.Key("gen_ai.request.temperature")
	keyResponseModel      = attribute.Key("gen_ai.response.model")
	keyResponseID         = attribute.Key("gen_ai.response.id")
	keyFinishReasons      = attribute.Key("gen_ai.response.finish_reasons")
	keyTimeToFirstChunk   = attribute.Key("gen_ai.response.time_to_first_chunk")
	keyInputTokens        = attribute.Key("gen_ai.usage.input_tokens")
	keyOutputTokens       = attribute.Key("gen_ai.usage.output_tokens")
	keyCacheReadTokens    = attribute.Key("gen_ai.usage.cache_read.input_tokens")
	keyCacheWriteTokens   = attribute.Key("gen_ai.usage.cache_creation.input_tokens")
	keyTokenType          = attribute.Key("gen_ai.token.type")
	keyToolName           = attribute.Key("gen_ai.tool.name")
	keyToolCallID         = attribute.Key("gen_ai.tool.call.id")
	keyToolType           = attribute.Key("gen_ai.tool.type")
	keyErrorType          = attribute.Key("error.type")
	keyServerAddress      = attribute.Key("server.address")
	keyServerPort         = attribute.Key("server.port")

	// Opt-in content (telemetry.capture_content).
	keyInputMessages      = attribute.Key("gen_ai.input.messages")
	keyOutputMessages     = attribute.Key("gen_ai.output.messages")
	keySystemInstructions = attribute.Key("gen_ai.system_instructions")
	keyToolArguments      = attribute.Key("gen_ai.tool.call.arguments")
	keyToolResult         = attribute.Key("gen_ai.tool.call.result")
)

// GenAI attribute values.
const (
	opChat        = "chat"
	opInvokeAgent = "invoke_agent"
	opExecuteTool = "execute_tool"
	// toolTypeExtension is a tool the agent runs on its side, as
	// turnstile's server-side tools are.
	toolTypeExtension = "extension"
)

// keyMetadata prefixes the request metadata keys copied to the turn's span
// (ObserverOptions.MetadataAttributes), turnstile.metadata.KEY: their
// values are the client's (each at most 256 bytes), never put on metrics.
const keyMetadata = "turnstile.metadata."

// keyDeployment is the deployment of the model a call went to (see
// models.ALIAS.deployments): bounded by the configuration, so it is put on
// the call metrics too.
const keyDeployment = attribute.Key("turnstile.deployment")

// keyRetryToDeployment is the deployment a retry moves to, on the retry
// event of a call moved after a failure of one key.
const keyRetryToDeployment = attribute.Key("turnstile.retry.to_deployment")

// turnstile's own attribute keys. Every one of them has a bounded set of
// values except turn id, tool call id and trace-only counters, which are
// never put on metrics.
const (
	keyTurnID      = attribute.Key("turnstile.turn.id")
	keyModel       = attribute.Key("turnstile.model")
	keyProvider    = attribute.Key("turnstile.provider")
	keyClient      = attribute.Key("turnstile.client")
	keyAttempt     = attribute.Key("turnstile.attempt")
	keyCall        = attribute.Key("turnstile.call")
	keyStep        = attribute.Key("turnstile.step")
	keyRequestID   = attribute.Key("turnstile.provider.request_id")
	keyStatusCode  = attribute.Key("http.response.status_code")
	keyEndReason   = attribute.Key("turnstile.end_reason")
	keyServedBy    = attribute.Key("turnstile.served_by")
	keyModelCalls  = attribute.Key("turnstile.model_calls")
	keyRetries     = attribute.Key("turnstile.retries")
	keyFallbacks   = attribute.Key("turnstile.fallbacks")
	keyCompactions = attribute.Key("turnstile.compactions")
	keyToolCalls   = attribute.Key("turnstile.tool_calls")
	keyFirstOutput = attribute.Key("turnstile.time_to_first_output")
	keyWaited      = attribute.Key("turnstile.waited")
	keyDelay       = attribute.Key("turnstile.delay")
	keyCooldown    = attribute.Key("turnstile.cooldown")
	keyFallbackTo  = attribute.Key("turnstile.fallback.to")
	keyRetryable   = attribute.Key("turnstile.retryable")
	keyHedges      = attribute.Key("turnstile.hedges")
	keyHedgeFrom   = attribute.Key("turnstile.hedge.from")
	keyHedgeAfter  = attribute.Key("turnstile.hedge.after")
	keyHedgeLost   = attribute.Key("turnstile.hedge.lost")
	keyContinues   = attribute.Key("turnstile.continues")
	// keyOutcome is a decision's outcome: approved, denied or timed_out.
	keyOutcome   = attribute.Key("turnstile.approval.outcome")
	keyDecidedBy = attribute.Key("turnstile.approval.decided_by")
	keyApprovalW = attribute.Key("turnstile.approval.waited")
	keySteerSize = attribute.Key("turnstile.steer.bytes")
	// keyMediaCount and keyMediaTypes describe the media a call sends
	// (user parts and tool results): how many, and their types. Never the
	// bytes, even with content capture.
	keyMediaCount = attribute.Key("turnstile.request.media.count")
	keyMediaTypes = attribute.Key("turnstile.request.media.types")
	// keyCost is what a call or a turn cost, in units of the currency
	// keyCostCurrency names (pricing.currency), when its model has a price;
	// keyCostPartial says a turn's cost leaves out calls of models without
	// one.
	keyCost         = attribute.Key("turnstile.cost")
	keyCostCurrency = attribute.Key("turnstile.cost.currency")
	keyCostPartial  = attribute.Key("turnstile.cost.partial")
	// keyCostEstimated marks the cost of a call cut with no usage
	// reported: its estimate, charged to its client key.
	keyCostEstimated = attribute.Key("turnstile.cost.estimated")
	// keyCompactionTrigger is what made a compaction: near_window (before
	// a call) or overflow (after the provider refused the conversation);
	// keyCompactionStrategy the strategy that compacted (keep_ends,
	// summarize). Both are bounded and put on the compaction counter.
	keyCompactionTrigger        = attribute.Key("turnstile.compaction.trigger")
	keyCompactionStrategy       = attribute.Key("turnstile.compaction.strategy")
	keyCompactionMessagesBefore = attribute.Key("turnstile.compaction.messages_before")
	keyCompactionMessagesAfter  = attribute.Key("turnstile.compaction.messages_after")
	keyCompactionSummaryModel   = attribute.Key("turnstile.compaction.summary_model")
	keyCompactionSummaryFailed  = attribute.Key("turnstile.compaction.summary_failed")
)

// Span event names.
const (
	eventRetry      = "turnstile.retry"
	eventFallback   = "turnstile.fallback"
	eventCompaction = "turnstile.compaction"
	eventCooldown   = "turnstile.cooldown"
	eventGiveUp     = "turnstile.give_up"
	eventHedge      = "turnstile.hedge"
	eventApproval   = "turnstile.approval"
	eventSteer      = "turnstile.steer"
)

// Metric names. The GenAI ones follow the conventions; the others are
// turnstile's own.
const (
	metricOperationDuration = "gen_ai.client.operation.duration"
	metricTokenUsage        = "gen_ai.client.token.usage"
	metricTimeToFirstChunk  = "gen_ai.client.operation.time_to_first_chunk"
	metricToolDuration      = "gen_ai.execute_tool.duration"
	metricAgentDuration     = "gen_ai.invoke_agent.duration"

	metricAttempts     = "turnstile.attempts"
	metricRetries      = "turnstile.retries"
	metricFallbacks    = "turnstile.fallbacks"
	metricCooldowns    = "turnstile.cooldowns"
	metricHedges       = "turnstile.hedges"
	metricTurns        = "turnstile.turns"
	metricTurnsActive  = "turnstile.turns.active"
	metricTurnWait     = "turnstile.turn.wait"
	metricTurnTokens   = "turnstile.turn.tokens"
	metricApprovals    = "turnstile.approvals"
	metricApprovalWait = "turnstile.approval.wait"
	metricSteered      = "turnstile.steered"
	metricCompactions  = "turnstile.compactions"
	metricCost         = "turnstile.cost"
	metricRetryBudget  = "turnstile.model.retry_budget"
	metricCoolingDown  = "turnstile.model.cooling_down"
	instrumentationURL = "github.com/turnstile-dev/turnstile/telemetry"
)
