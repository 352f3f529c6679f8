// Package delivery sends a turn's events to a client's stream, one way
// for every stream: a [Stream] runs one Send at a time on a worker's
// goroutine ([Workers]), under one stall watchdog (server.send_timeout),
// fed either by a producer that hands it each message once the one before
// was sent ([Stream.Put]: a turn without a store, through its [Outbox];
// the events a watcher reads from a turn's log) or by a [Feed] it drains
// itself when kicked (a durable run's window of acknowledged events),
// without waking the stream's handler per event. gRPC flow control is the
// backpressure: while a Send is under way the stream is busy, and the
// runtime merges the deltas that come meanwhile (runtime.BusySink,
// runtime.IdleSink); a client that accepts nothing for the send timeout
// stalls its stream.
//
// It knows streams and the send timeout, not the store, the client keys
// or gRPC itself: the messages it sends, and how (a response, an event's
// stored wire form), are its caller's. It may import the generated code,
// the runtime, llm and server/wire, and no other package of the module.
package delivery
