// Package llm is turnstile's vocabulary, the ground floor every other
// package stands on: the conversation ([Message], [Part], [ToolCall],
// [ToolResult], [Usage]), a model call ([Provider], [Request], [Chunk],
// [StopReason]), a server-side tool ([Tool], [ToolSpec], [ToolOutput]) and
// the classes of failure ([Kind], [Hint], [Error]).
//
// It holds types and the few functions that belong to them, and no
// behaviour: what to do about a failure is the policy's decision (package
// policy), running a turn is the runtime's. Providers and tools import llm
// and nothing above it. The package imports only the standard library; a
// test enforces that.
package llm
