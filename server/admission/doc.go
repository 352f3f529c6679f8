// Package admission decides which turns may start and charges what they
// use: the client keys (a bearer token's SHA-256 digest against the
// configured keys, the models each may use), the server's bound on turns
// running at once ([Gate]), each key's limits (concurrent turns, turns and
// tokens per period, bytes held in the turn store) and budgets in money
// per UTC day and month, the slots a call or a durable turn holds
// ([Slots]), the charging of a turn's use as its events arrive
// ([Charger]), and the sharing of every limit with the other replicas
// through a [LimitSharer] ([Keys.Share]).
//
// Refusals are errors ([*Refusal], [*ModelError], *llm.Error): the gRPC
// face maps them to statuses. It must not import gRPC, the generated
// contract, the store or any other package of the server; it stands on
// llm and the runtime's events.
package admission
