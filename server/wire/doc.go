// Package wire converts between the contract (turnstile.v1, the generated
// protobuf types) and the runtime, both ways: a RunTurnRequest becomes a
// runtime.TurnRequest, with the validation that belongs to the wire (every
// violation named as a field, the request's bounds, its media); a runtime
// event becomes an AgentEvent (and the RunTurnResponse that carries it,
// kept within max_event_bytes by [Fit]); and a stored AgentEvent becomes a
// runtime event again ([RuntimeEvent]), for a turn resumed from its log.
// It also checks the requests of the other RPCs (CancelTurn,
// ApproveToolCall, SteerTurn) and counts a request's items on the wire
// before it is decoded ([CountItems]).
//
// It owns nothing else: no gRPC (statuses, streams, metadata), no store,
// no client keys. It imports the generated code, the runtime and llm, and
// no other package of the module; the runtime never imports it.
package wire
