// Package runtime runs agent turns: it calls a model through a [Provider],
// streams the model's output as [Event] values into a [Sink], runs the tools
// the model asks for, and survives provider failures by retrying, falling
// back along a chain of models, or compacting the conversation, as its
// [Policy] decides.
//
// The package knows nothing of gRPC, protobuf or any provider SDK: it may
// import only the standard library and golang.org/x/sync. Providers
// (package providers/...) implement [Provider] and classify their own errors
// as [*Error]; the server maps [Event] values to the wire.
package runtime
