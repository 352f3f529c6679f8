// Package durable runs turns whose every event is kept in a turn log (the
// store: NATS JetStream), so that they outlive the RPC that started them
// and the replica that ran them. [Runs] creates a run or attaches to the
// one the log holds (one attempt of one turn of one client key, created
// once of any number of concurrent callers), owns it (its events appended
// to the log and, once acknowledged, fanned out from a window to the
// streams that watch it here), streams any run from its window or its log
// (delivery.Stream), routes the signals of CancelTurn, ApproveToolCall and
// SteerTurn to the replica that owns a run, takes over the runs of
// replicas that died (reading each back into a runtime.Resume, through
// wire.RuntimeEvent), adopts or closes orphans, and hands its own runs to
// the others when it shuts down.
//
// It returns Go errors (this package's sentinels and types, the turn's
// *runtime.TurnError, admission's refusals), never gRPC statuses: the
// gRPC face maps them. It must not import gRPC, the server, the store
// (it consumes the [TurnStore] it defines) or the runtime's internals;
// it stands on wire, delivery, admission, the runtime and llm.
package durable
