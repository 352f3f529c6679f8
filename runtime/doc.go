// Package runtime runs agent turns: it calls a model through an
// [llm.Provider], streams the model's output as [Event] values into a
// [Sink], runs the tools the model asks for, and survives provider
// failures by retrying, falling back along a chain of models, or
// compacting the conversation, as package policy decides.
//
// A turn is built from a few pieces, each in its own file: the loop
// (turn.go: steps until the model is done, tools in between, the outcome),
// a step (step.go: one assistant message — attempts, and the policy's
// decision after each failed one), an attempt (attempt.go: one model call
// with its watchdog, its output assembled and streamed, its failure
// classified), the chain (chain.go: which model next, asking the shared
// health state) and tools (tools.go). A model may hedge a call that is slow
// to answer with a parallel one (hedge.go, [HedgeConfig]), and may continue
// a reply whose stream was cut rather than ask for it again; a reply cut by
// the output limit is always continued, as one message (continue.go,
// [StreamCut]). An [Observer] sees every turn,
// attempt, decision and tool call from outside the loop; that is where
// telemetry attaches. A turn that another runner started and could not
// finish (its process died) continues from what its log holds, with
// [TurnRequest.Resume].
//
// The package knows nothing of gRPC, protobuf or any provider SDK: it
// imports only the standard library, llm and policy (internal/layering
// holds that rule). Providers implement [llm.Provider] and classify their
// own errors as [*llm.Error]; the server maps [Event] values to the wire.
package runtime
