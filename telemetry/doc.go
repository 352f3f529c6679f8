// Package telemetry is turnstile's observability: OpenTelemetry traces and
// metrics that follow the GenAI semantic conventions, the Prometheus
// endpoint of the ops listener, and the one log line each turn ends with.
// It watches turns from outside the loop, as [runtime.Observer]s:
//
//   - [Observer] makes the spans and metrics. Under the gRPC server span
//     (otelgrpc, from [Providers.ServerHandler]) each turn is one
//     invoke_agent span; each model call a CLIENT span "chat {model id}",
//     parent of the provider's HTTP request, with the call's usage, finish
//     reason, time to first chunk and error class; each server-side tool
//     call an execute_tool span. Retries (with their backoff), fallbacks,
//     compactions and cooldowns are events of the turn's span. Metric
//     attributes are bounded: model alias, provider, model id, error
//     class or code, end reason, tool name and client key name, never a
//     turn id or text.
//   - [TurnLog] writes the turn's line.
//   - [Setup] builds the providers from the standard OTEL_* environment
//     variables; with none set, nothing is exported and the providers are
//     no-ops.
//
// Prompts, completions and tool arguments and results reach spans only
// when [ObserverOptions.CaptureContent] is set.
//
// The package sits on the faces floor: it imports runtime, policy and llm,
// and OpenTelemetry; nothing of the module imports it but cmd/turnstile.
package telemetry
