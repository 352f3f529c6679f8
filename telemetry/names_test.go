package telemetry

import (
	"testing"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/semconv/v1.41.0/genaiconv"
)

// TestNamesMatchSemconv holds the names turnstile emits to the last Go
// semconv release that carries the GenAI conventions, where it has them.
func TestNamesMatchSemconv(t *testing.T) {
	keys := []struct{ ours, theirs attribute.Key }{
		{keyOperationName, semconv.GenAIOperationNameKey},
		{keyProviderName, semconv.GenAIProviderNameKey},
		{keyRequestModel, semconv.GenAIRequestModelKey},
		{keyRequestStream, semconv.GenAIRequestStreamKey},
		{keyRequestMaxTokens, semconv.GenAIRequestMaxTokensKey},
		{keyRequestTemperature, semconv.GenAIRequestTemperatureKey},
		{keyResponseModel, semconv.GenAIResponseModelKey},
		{keyResponseID, semconv.GenAIResponseIDKey},
		{keyServerAddress, semconv.ServerAddressKey},
		{keyServerPort, semconv.ServerPortKey},
		{keyFinishReasons, semconv.GenAIResponseFinishReasonsKey},
		{keyTimeToFirstChunk, semconv.GenAIResponseTimeToFirstChunkKey},
		{keyInputTokens, semconv.GenAIUsageInputTokensKey},
		{keyOutputTokens, semconv.GenAIUsageOutputTokensKey},
		{keyCacheReadTokens, semconv.GenAIUsageCacheReadInputTokensKey},
		{keyCacheWriteTokens, semconv.GenAIUsageCacheCreationInputTokensKey},
		{keyTokenType, semconv.GenAITokenTypeKey},
		{keyToolName, semconv.GenAIToolNameKey},
		{keyToolCallID, semconv.GenAIToolCallIDKey},
		{keyToolType, semconv.GenAIToolTypeKey},
		{keyErrorType, semconv.ErrorTypeKey},
		{keyInputMessages, semconv.GenAIInputMessagesKey},
		{keyOutputMessages, semconv.GenAIOutputMessagesKey},
		{keySystemInstructions, semconv.GenAISystemInstructionsKey},
		{keyToolArguments, semconv.GenAIToolCallArgumentsKey},
		{keyToolResult, semconv.GenAIToolCallResultKey},
		{keyStatusCode, semconv.HTTPResponseStatusCodeKey},
	}
	for _, k := range keys {
		if k.ours != k.theirs {
			t.Errorf("attribute %q, semconv says %q", k.ours, k.theirs)
		}
	}
	values := []struct{ ours, theirs attribute.KeyValue }{
		{keyOperationName.String(opChat), semconv.GenAIOperationNameChat},
		{keyOperationName.String(opInvokeAgent), semconv.GenAIOperationNameInvokeAgent},
		{keyOperationName.String(opExecuteTool), semconv.GenAIOperationNameExecuteTool},
		{keyTokenType.String("input"), semconv.GenAITokenTypeInput},
		{keyTokenType.String("output"), semconv.GenAITokenTypeOutput},
		{keyProviderName.String("openai"), semconv.GenAIProviderNameOpenAI},
		{keyProviderName.String("anthropic"), semconv.GenAIProviderNameAnthropic},
		{keyProviderName.String("gcp.gemini"), semconv.GenAIProviderNameGCPGemini},
	}
	for _, v := range values {
		if v.ours != v.theirs {
			t.Errorf("value %v, semconv says %v", v.ours, v.theirs)
		}
	}
	metrics := []struct{ ours, theirs string }{
		{metricOperationDuration, genaiconv.ClientOperationDuration{}.Name()},
		{metricTokenUsage, genaiconv.ClientTokenUsage{}.Name()},
		{metricTimeToFirstChunk, genaiconv.ClientOperationTimeToFirstChunk{}.Name()},
	}
	for _, m := range metrics {
		if m.ours != m.theirs {
			t.Errorf("metric %q, semconv says %q", m.ours, m.theirs)
		}
	}
}
